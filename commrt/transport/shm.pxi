# Shared-memory channels.  Lock held in every function.
#
# A pair of ranks on one host shares one memfd segment (no name in /dev/shm,
# so nothing can be left behind): a 4 KiB control page, then one ring per
# direction.  Each ring has one producer and one consumer, so head and tail
# need only acquire/release ordering.  A record is a 64-byte header slot and
# the payload, padded to 64 bytes; a record never wraps (a PAD record skips
# to the ring's start).
#
# Sleeping: a rank about to block sets its sleep flag in every segment, then
# re-checks its rings; a producer that publishes, then sees the flag at 1,
# moves it to 2 and writes the sleeper's eventfd: at most one wake-up per
# sleep.  txblk says "my records did not fit": the consumer then wakes the
# producer when it frees space.
#
# Large messages: the sender posts an RTS with its buffer's address; the
# receiver copies straight into the posted buffer with process_vm_readv and
# answers FIN.  Where that is not permitted, the receiver answers CTS and the
# sender streams DATA chunks through the ring (two copies, pipelined).
#
# Who copies is the receive's choice (req_t.copier) where the layer above
# knows better than the size: COPIER_RECEIVER reads with process_vm_readv at
# any size where ranks share cores, COPIER_EXCHANGE also from cma_min / 4 up
# with a core each (read_early); COPIER_SENDER has the sender write with
# process_vm_writev (a gather's root: its core then copies only its own block
# while the senders write theirs).  A push must never land once the receive has failed (its
# buffer may be freed and reused), so it goes through a push slot in the
# control page that the receiver owns: it arms slot k with (receive id,
# ARMED) and answers CTS carrying k and its buffer's address; the sender
# moves the slot ARMED -> WRITING with a compare-and-swap, writes, frees the
# slot and answers FIN (FIN_PUSHED).  A receiver that loses the peer takes
# the slot back ARMED -> free with a compare-and-swap, so a sender that
# comes to the CTS later finds it gone and writes nothing; if the sender is
# WRITING it waits for the write (100 ms at most: else the buffer is lent,
# kept alive for good).  Where writing is not permitted the sender frees
# the slot and streams the message instead (CTS/DATA).
#
# A reduce-receive (req_t.hook) combines instead of copying: a DATA chunk
# straight from the ring, a CMA message a piece at a time through a bounce
# buffer that stays in cache (cma_combine), so the received bytes are read
# once, on their way in, and never written to memory and read back.

cdef enum:
    CTL_PAGE = 4096
    OFF_SLEEP0 = 0
    OFF_SLEEP1 = 64
    OFF_TXBLK0 = 128
    OFF_TXBLK1 = 192
    OFF_HEAD0 = 256
    OFF_TAIL0 = 320
    OFF_HEAD1 = 384
    OFF_TAIL1 = 448
    OFF_BEAT0 = 512         # heartbeat counters, one per side (the beat thread bumps its own)
    OFF_BEAT1 = 576
    OFF_PUSH0 = 1024        # push slots of writes into side 0 (PUSH_SLOTS words), then side 1's
    OFF_PUSH1 = 2048
    PUSH_SLOTS = 32
    SLOT_ARMED = 1          # a slot's word: receive id << 2 | state (0: free)
    SLOT_WRITING = 2
    PUSH_WAIT_NS = 100000000    # a receiver losing its peer waits this long for a write under way


cdef inline uint64_t rec_len(uint64_t plen) noexcept nogil:
    return (HDR_SPACE + plen + REC_ALIGN - 1) & ~(<uint64_t>REC_ALIGN - 1)


cdef inline uint64_t payload_len(hdr_t *h) noexcept nogil:
    if h.opcode == OP_EAGER or h.opcode == OP_DATA or h.opcode == OP_ABORT or h.opcode == OP_PAD:
        return h.nbytes
    return 0


cdef void shm_map(peer_t *p, char *seg, size_t seg_len, int side, uint64_t ring_bytes) noexcept nogil:
    """Point the peer's ring fields into segment `seg`; side 0 is the lower rank."""
    p.seg = seg
    p.seg_len = seg_len
    p.side = side
    p.ring_bytes = ring_bytes
    cdef char *r0 = seg + CTL_PAGE
    cdef char *r1 = seg + CTL_PAGE + ring_bytes
    if side == 0:
        p.sleep_me = <volatile uint32_t *>(seg + OFF_SLEEP0)
        p.sleep_peer = <volatile uint32_t *>(seg + OFF_SLEEP1)
        p.txblk_me = <volatile uint32_t *>(seg + OFF_TXBLK0)
        p.txblk_peer = <volatile uint32_t *>(seg + OFF_TXBLK1)
        p.tx_head = <volatile uint64_t *>(seg + OFF_HEAD0)
        p.tx_tail = <volatile uint64_t *>(seg + OFF_TAIL0)
        p.rx_head = <volatile uint64_t *>(seg + OFF_HEAD1)
        p.rx_tail = <volatile uint64_t *>(seg + OFF_TAIL1)
        p.tx_data = r0
        p.rx_data = r1
        p.beat_me = <volatile uint64_t *>(seg + OFF_BEAT0)
        p.beat_peer = <volatile uint64_t *>(seg + OFF_BEAT1)
        p.push_me = <volatile uint64_t *>(seg + OFF_PUSH0)
        p.push_peer = <volatile uint64_t *>(seg + OFF_PUSH1)
    else:
        p.sleep_me = <volatile uint32_t *>(seg + OFF_SLEEP1)
        p.sleep_peer = <volatile uint32_t *>(seg + OFF_SLEEP0)
        p.txblk_me = <volatile uint32_t *>(seg + OFF_TXBLK1)
        p.txblk_peer = <volatile uint32_t *>(seg + OFF_TXBLK0)
        p.tx_head = <volatile uint64_t *>(seg + OFF_HEAD1)
        p.tx_tail = <volatile uint64_t *>(seg + OFF_TAIL1)
        p.rx_head = <volatile uint64_t *>(seg + OFF_HEAD0)
        p.rx_tail = <volatile uint64_t *>(seg + OFF_TAIL0)
        p.tx_data = r1
        p.rx_data = r0
        p.beat_me = <volatile uint64_t *>(seg + OFF_BEAT1)
        p.beat_peer = <volatile uint64_t *>(seg + OFF_BEAT0)
        p.push_me = <volatile uint64_t *>(seg + OFF_PUSH1)
        p.push_peer = <volatile uint64_t *>(seg + OFF_PUSH0)
    p.tx_head_seen = ld_acq_u64(p.tx_head)
    p.tx_tail_mine = ld_acq_u64(p.tx_tail)


cdef inline void ring_doorbell(peer_t *p) noexcept nogil:
    """Wake the peer if it sleeps (at most once per sleep)."""
    cdef uint64_t one = 1
    fence_seq_cst()
    if ld_acq_u32(p.sleep_peer) == 1 and cas_u32(p.sleep_peer, 1, 2):
        write(p.peer_efd, &one, 8)


cdef bint shm_put(eng_t *E, peer_t *p, hdr_t *h, const char *payload, uint64_t plen) noexcept nogil:
    """Write one record if it fits; False when the ring is full."""
    cdef uint64_t R = p.ring_bytes
    cdef uint64_t tail = p.tx_tail_mine      # not the shared line the peer polls
    cdef uint64_t head = p.tx_head_seen
    cdef uint64_t rec = rec_len(plen)
    cdef uint64_t off = tail & (R - 1)
    cdef uint64_t room = R - off
    cdef uint64_t pad = room if rec > room else 0
    cdef hdr_t *ph
    if rec + pad > R - (tail - head):
        # The consumer's head lives on a line it writes after every record: reading
        # it on every send cost a cross-core miss per message (~40% of an 8-byte
        # send's time).  It only grows, so a stale copy only underestimates the room;
        # read it again when that copy says the record does not fit.
        head = ld_acq_u64(p.tx_head)
        p.tx_head_seen = head
        if rec + pad > R - (tail - head):
            return False
    if pad:
        ph = <hdr_t *>(p.tx_data + off)
        ph.magic = HDR_MAGIC
        ph.version = HDR_VERSION
        ph.opcode = OP_PAD
        ph.nbytes = pad - HDR_SPACE
        tail += pad
        off = 0
    h.seq = p.tx_seq
    p.tx_seq += 1
    stamp_credit(p, h)
    credit_sent(p, h)
    memcpy(p.tx_data + off, h, sizeof(hdr_t))
    if plen:
        memcpy(p.tx_data + off + HDR_SPACE, payload, plen)
    p.tx_tail_mine = tail + rec
    st_rel_u64(p.tx_tail, tail + rec)
    p.hdr_sent += sizeof(hdr_t)
    return True


cdef void shm_flush(eng_t *E, peer_t *p) noexcept nogil:
    """Move queued frames into the ring while they fit."""
    cdef frame_t *f
    cdef uint64_t n
    cdef bint wrote = False
    while p.txq != NULL:
        f = p.txq
        if f.chunked:
            n = f.len - f.off
            if n > E.chunk:
                n = E.chunk
            f.h.nbytes = n
            f.h.addr = f.off
            if not shm_put(E, p, &f.h, f.payload + f.off, n):
                break
            wrote = True
            f.off += n
            if f.off < f.len:
                continue
        else:
            if not shm_put(E, p, &f.h, f.payload, f.len):
                break
            wrote = True
            count_sent(p, &f.h, f.len)
        frame_done(E, p, f)
    if p.txq != NULL:
        st_rel_u32(p.txblk_me, 1)
    elif p.txblk_me[0]:
        st_rel_u32(p.txblk_me, 0)
    if wrote:
        ring_doorbell(p)


# A reduce-receive reads a CMA message in pieces of this many bytes into the
# engine's bounce buffer, combining each before the next (a multiple of 4096,
# so every piece holds whole elements of any dtype; _set_cma_piece).  512 KiB
# against 256: 16 MiB, alternated in one job, 2 cores: pairwise reduce-scatter
# 0.84-0.93 at N = 4, 0.92 at N = 8, 0.85 at N = 2; Rabenseifner 0.91-0.97 at
# N = 4, 0.93 at N = 8, 0.97-1.02 at N = 2 (docs/transport.md); 1 MiB no better.
cdef uint64_t cma_piece = 524288


cdef int cma_copy(peer_t *p, char *dst, uint64_t addr, uint64_t n) noexcept nogil:
    """Copy n bytes from the peer's address space; 0 on success, else errno."""
    cdef iovec loc
    cdef iovec rem
    cdef ssize_t got
    cdef uint64_t done = 0
    cdef uint64_t step
    while done < n:
        step = n - done
        if step > (<uint64_t>1 << 30):
            step = <uint64_t>1 << 30
        loc.iov_base = dst + done
        loc.iov_len = step
        rem.iov_base = <void *><size_t>(addr + done)
        rem.iov_len = step
        got = process_vm_readv(p.pid, &loc, 1, &rem, 1, 0)
        if got < 0:
            if errno == EINTR:
                continue
            return errno
        if got == 0:
            return EFAULT
        done += <uint64_t>got
    return 0


# The kernel's copy (process_vm_readv, `rep movsb` here) runs at full speed only
# where source and destination agree in their address mod 64: one process
# reading 16 MiB of itself took 0.9-1.3 ms mutually aligned, 1.5-1.7 ms 48
# bytes apart, 2.3-2.7 ms 16 apart and 5.4-5.7 ms 8 or 1 apart, where a vector
# memcpy took 0.7-1.0 ms at any offset (2 cores, 2026-12-07; the page offset
# did not matter).  A user's two buffers are as they are (PyTorch places
# tensors 64-aligned, NumPy 16-aligned: docs/transport.md), but the bounce
# buffer is ours: each piece lands at the source's own offset mod CMA_ALIGN.
# (Reading a misaligned plain receive through it too was measured and not
# kept: the extra copy costs what the alignment saves at 16 or 48 bytes apart,
# and glibc's memcpy of a piece under its rep_movsb_stop_threshold is itself a
# `rep movsb`.)
cdef enum:
    CMA_ALIGN = 64


cdef inline char *aligned_like(char *base, uint64_t addr) noexcept nogil:
    """base rounded up to a multiple of CMA_ALIGN, plus addr's offset mod
    CMA_ALIGN: at most 2 * CMA_ALIGN - 2 past base (the buffer's slack)."""
    cdef size_t up = (CMA_ALIGN - (<size_t>base & (CMA_ALIGN - 1))) & (CMA_ALIGN - 1)
    return base + up + <size_t>(addr & (CMA_ALIGN - 1))


cdef int cma_combine(eng_t *E, peer_t *p, req_t *r, uint64_t addr, uint64_t n,
                     uint64_t *done) noexcept nogil:
    """Combine n bytes of the peer's memory at addr into r.buf: read a piece into
    the engine's bounce buffer (at addr's offset mod CMA_ALIGN, above), combine
    it, go on.  0 on success, else errno; *done says how many bytes were
    combined (a failure after the first piece cannot fall back to streaming:
    those bytes are already in)."""
    cdef uint64_t step
    cdef uint64_t piece = cma_piece
    cdef char *bounce
    cdef int rc
    done[0] = 0
    if E.cbuf == NULL or E.cbuf_bytes != piece:
        free(E.cbuf)
        E.cbuf = <char *>malloc(piece + 2 * CMA_ALIGN)
        E.cbuf_bytes = piece if E.cbuf != NULL else 0
        if E.cbuf == NULL:
            return ENOMEM
    while done[0] < n:
        step = n - done[0]
        if step > piece:
            step = piece
        bounce = aligned_like(E.cbuf, addr + done[0])
        rc = cma_copy(p, bounce, addr + done[0], step)
        if rc:
            return rc
        r.hook(r.buf + done[0], bounce, <int64_t>(step // r.itemsize))
        done[0] += step
    return 0


cdef int shm_rx(eng_t *E, peer_t *p) noexcept nogil:
    """Consume every record waiting in the peer's ring; returns how many."""
    cdef uint64_t R = p.ring_bytes
    cdef uint64_t head = p.rx_head[0]
    cdef uint64_t tail = ld_acq_u64(p.rx_tail)
    cdef uint64_t off
    cdef hdr_t *h
    cdef int n = 0
    while head != tail and p.lost == 0:
        off = head & (R - 1)
        h = <hdr_t *>(p.rx_data + off)
        if h.magic != HDR_MAGIC or h.version != HDR_VERSION or h.opcode == 0 or h.opcode > OP_MAX:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: bad record header in shared-memory ring")
            return n
        if payload_len(h) > R - off - HDR_SPACE:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: record overruns the ring")
            return n
        if h.opcode != OP_PAD:
            if h.seq != p.rx_seq or h.src != p.rank:
                peer_lost(E, p, E_PEER_LOST, b"protocol error: out-of-sequence record")
                return n
            p.rx_seq += 1
            p.hdr_recv += sizeof(hdr_t)
            if h.credit:
                take_credit(E, p, h.credit)
            on_message(E, p, h, p.rx_data + off + HDR_SPACE)
        head += rec_len(payload_len(h)) if h.opcode != OP_PAD else HDR_SPACE + h.nbytes
        st_rel_u64(p.rx_head, head)
        n += 1
        if head == tail:
            tail = ld_acq_u64(p.rx_tail)
    if n:
        fence_seq_cst()
        if ld_acq_u32(p.txblk_peer):
            ring_doorbell(p)
    return n


# ---------------------------------------------------------------- channel operations

cdef bint shm_put_now(eng_t *E, peer_t *p, hdr_t *h, const char *payload, uint64_t plen) noexcept nogil:
    """A frame straight into the ring (nothing queued before it): the eager fast path."""
    if not shm_put(E, p, h, payload, plen):
        return False
    ring_doorbell(p)
    return True


cdef int shm_poll(eng_t *E, peer_t *p) noexcept nogil:
    cdef int n = shm_rx(E, p)
    if p.txq != NULL and p.lost == 0:
        shm_flush(E, p)
    return n


cdef void shm_on_event(eng_t *E, peer_t *p, uint32_t events) noexcept nogil:
    """The Unix socket beside the pair became readable: EOF = the peer died."""
    cdef char buf[64]
    cdef ssize_t n = recv(p.fd, buf, 64, MSG_DONTWAIT)
    if n == 0 or (n < 0 and errno != EAGAIN and errno != EINTR):
        shm_rx(E, p)                        # what it wrote before dying is still valid
        peer_lost(E, p, E_PEER_LOST, b"peer process exited or was killed")


cdef void shm_arm(peer_t *p, uint32_t value) noexcept nogil:
    st_rel_u32(p.sleep_me, value)


cdef bint shm_arm_push(eng_t *E, peer_t *p, req_t *r, hdr_t *h, uint64_t split_at) noexcept nogil:
    """Ask the sender to write the message into r.buf: arm a push slot (r.slot - 1),
    answer CTS with it and the address.  All of it (split_at 0: COPIER_SENDER),
    or from byte split_at on (CTS_SPLIT: shm_split_read reads the rest).
    False: no slot free."""
    cdef int k = 0
    cdef hdr_t c
    while k < PUSH_SLOTS and ld_acq_u64(&p.push_me[k]) != 0:
        k += 1
    if k == PUSH_SLOTS:
        return False
    st_rel_u64(&p.push_me[k], (r.id << 2) | SLOT_ARMED)
    r.slot = k + 1
    r.state = S_ACTIVE
    r.moved = 0
    r.split_at = split_at
    r.split_cookie = h.cookie
    dlist_push(&p.rxact_head, r)
    init_hdr(E, &c, OP_CTS, h.ctx, 0)
    c.cookie = h.cookie
    c.addr = r.id
    c.meta = (CTS_SPLIT if split_at else CTS_PUSH) | (<uint64_t>k << 8)
    c.meta2 = <uint64_t><size_t>r.buf
    c.nbytes = split_at
    if not enqueue(E, p, &c, NULL, 0, NULL, False, False):
        peer_lost(E, p, E_PEER_LOST, b"out of memory queueing a control frame")
        return True
    flush(E, p)
    return True


cdef int shm_push(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil:
    """A CTS asking us to write send r into the receiver (its slot in h.meta >> 8,
    its buffer at h.meta2, its receive id in h.addr): all of it (CTS_PUSH), or
    from byte h.nbytes on (CTS_SPLIT: the receiver reads the rest; our send
    completes on its FIN)."""
    cdef uint64_t k = (h.meta >> 8) & 0xff
    cdef uint64_t armed = (h.addr << 2) | SLOT_ARMED
    cdef bint split = (h.meta & 0xff) == CTS_SPLIT
    cdef iovec loc
    cdef iovec rem
    cdef ssize_t got
    cdef uint64_t done = h.nbytes if split else 0
    cdef uint64_t step
    if k >= PUSH_SLOTS or h.meta2 == 0 or (split and (done == 0 or done >= r.nbytes)):
        peer_lost(E, p, E_PEER_LOST, b"protocol error: CTS asks for a push without a slot")
        return PUSH_REFUSED
    if not p.cma_ok:                        # not permitted here: free the slot, stream it
        return PUSH_FAILED if cas_u64(&p.push_peer[k], armed, 0) else PUSH_REFUSED
    if not cas_u64(&p.push_peer[k], armed, (h.addr << 2) | SLOT_WRITING):
        return PUSH_REFUSED                 # the receiver took it back (lost us, or reads it all)
    while done < r.nbytes:
        step = r.nbytes - done
        if step > (<uint64_t>1 << 30):
            step = <uint64_t>1 << 30
        loc.iov_base = r.buf + done
        loc.iov_len = step
        rem.iov_base = <void *><size_t>(h.meta2 + done)
        rem.iov_len = step
        got = process_vm_writev(p.pid, &loc, 1, &rem, 1, 0)
        if got < 0 and errno == EINTR:
            continue
        if got <= 0:
            break
        done += <uint64_t>got
    st_rel_u64(&p.push_peer[k], 0)
    if done < r.nbytes:
        p.cma_ok = False                    # two copies from now on; DATA overwrites it all
        return PUSH_FAILED
    if split:
        send_ctrl(E, p, OP_FIN, h.ctx, h.addr, 0, FIN_SPLIT)
        return PUSH_SPLIT
    dlist_remove(&p.await_head, r)
    complete(E, r, E_NONE)
    p.pushes += 1
    send_ctrl(E, p, OP_FIN, h.ctx, h.addr, 0, FIN_PUSHED)
    return PUSH_WRITTEN


cdef void shm_disarm(eng_t *E, peer_t *p, req_t *r) noexcept nogil:
    """p is lost with receive r's push armed: make sure no write lands after r
    fails.  Take the slot back; if the sender is writing, wait for it; past
    PUSH_WAIT_NS (a stopped sender) lend the buffer (r.lent) for good."""
    cdef uint64_t k = <uint64_t>(r.slot - 1)
    cdef uint64_t writing = (r.id << 2) | SLOT_WRITING
    cdef int64_t until
    r.slot = 0
    if p.seg == NULL:
        r.lent = True
        return
    if cas_u64(&p.push_me[k], (r.id << 2) | SLOT_ARMED, 0):
        return
    until = now_ns() + PUSH_WAIT_NS
    while ld_acq_u64(&p.push_me[k]) == writing:
        if now_ns() > until:
            r.lent = True
            return
        cpu_relax()


cdef inline bint read_early(eng_t *E, req_t *r, uint64_t nbytes) noexcept nogil:
    """Whether a receive reads a message below cma_min: where ranks share cores
    when its copier is the receiver (a stream cannot use two cores at once
    then), and with a core per rank too from cma_min / 4 up when it is half
    of an exchange (its core also streams what it sends: a stream costs it
    two copies per byte, a read one).  A one-way stream of freshly written
    data pipelines over two cores and wins below cma_min (a broadcast of
    1 MiB at N = 2: 88 us streamed, 128 read); an exchange's from 512 KiB
    blocks (all-to-all 1 MiB at N = 2: 85 streamed, 69 read; 128 KiB: 9.5
    and 10.3)."""
    if r.copier == COPIER_EXCHANGE:
        return E.oversub or nbytes >= E.cma_min // 4
    return r.copier == COPIER_RECEIVER and E.oversub


# A large one-way message: one copy split between two cores.  Beyond the cache a
# copy runs at one core's DRAM speed (np.copyto of 64 MiB: 6.5 GB/s here), while
# two cores copying at once each keep it (two 32 MiB copies side by side: 6.3
# GB/s each).  The receiver arms a push slot for the
# message's second half and answers CTS_SPLIT, reads the first half itself, then
# takes the slot back if its sender has not begun writing (compare-and-swap, as
# a lost peer's disarm) and reads the rest too: a sender that computes instead
# of driving progress costs the receiver nothing but the CTS.  A sender that
# writes answers FIN_SPLIT; the receiver completes and answers FIN only once
# both halves are in, so the sender's buffer stays its until then.  Only for
# plain receives the transport places itself (COPIER_AUTO, COPIER_RECEIVER),
# from cma_min (every read the size rule makes) but never below SPLIT_MIN_BYTES,
# from a peer whose reads have worked before.  Where ranks outnumber cores too
# (cma_min 1 MiB there): the sender waits for the message, so it is on a core
# or soon will be, and a receiver whose sender is not takes its half back.
# bench collectives --fresh-inputs, 2 cores, medians of 6 rounds in two
# alternated runs, before -> after: broadcast N = 3 1 MiB 348 -> 260 us, 16 MiB
# 3134 -> 2455; N = 4 4 MiB 1032 -> 802; every other cell at N = 3, 4, 8 from 1
# to 16 MiB within 0.9-1.1 (docs/performance-collectives.md).
cdef enum:
    SPLIT_MIN_BYTES = 1 << 20
    SPLIT_ALIGN = 4096


cdef inline bint split_ok(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil:
    return (r.hook == NULL and p.cma_proven and h.nbytes >= E.cma_min
            and h.nbytes >= SPLIT_MIN_BYTES
            and (r.copier == COPIER_AUTO or r.copier == COPIER_RECEIVER))


cdef bint shm_split_read(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil:
    """Copy a matched RTS's message with its sender, each core half (above).
    False, having done nothing: no push slot free."""
    cdef uint64_t armed = (r.id << 2) | SLOT_ARMED
    cdef uint64_t half = (h.nbytes // 2) & ~(<uint64_t>SPLIT_ALIGN - 1)
    cdef int k
    cdef int rc
    if not shm_arm_push(E, p, r, h, half):
        return False
    if p.lost:                              # the CTS could not be queued: r failed with p
        return True
    k = r.slot - 1
    rc = cma_copy(p, r.buf, h.addr, half)
    if rc == 0 and not cas_u64(&p.push_me[k], armed, 0):
        return True                         # the sender writes the rest: FIN_SPLIT completes it
    if rc == 0:                             # the sender has not begun: the rest is ours too
        rc = cma_copy(p, r.buf + half, h.addr + half, h.nbytes - half)
        p.splits_alone += 1
    else:
        shm_disarm(E, p, r)                 # a write under way lands before r fails
    r.slot = 0
    dlist_remove(&p.rxact_head, r)
    if rc == 0:
        r.moved = r.nbytes
        complete(E, r, E_NONE)
    else:                                   # reads worked before: the sender's buffer is gone
        fail(E, r, E_PEER_LOST, h.src)
    send_ctrl(E, p, OP_FIN, h.ctx, h.cookie, 0, 0 if rc == 0 else 1)
    return True


cdef bint shm_pull(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil:
    """A matched RTS: copy (or combine) straight from the sender's buffer with
    process_vm_readv and answer FIN, or have the sender write it (COPIER_SENDER,
    a plain receive).  False: stream it instead (CTS/DATA): a reduce-receive
    whose copier is the sender, where ranks have a core each, always (the
    sender's core then copies while ours combines: a binomial reduce of 16 MiB
    at N = 2 took 1220 us streamed, 1640 read and combined here).  Read from
    cma_min up, or below where the receive's copier says so (read_early)."""
    cdef int rc
    cdef uint64_t done = 0
    if r.copier == COPIER_SENDER and p.cma_ok:
        if r.hook == NULL:
            if shm_arm_push(E, p, r, h, 0):
                return True
        elif not E.oversub:
            return False                    # stream: the sender's core copies, ours combines
    if not p.cma_ok or (h.nbytes < E.cma_min and not read_early(E, r, h.nbytes)):
        return False
    if split_ok(E, p, r, h) and shm_split_read(E, p, r, h):
        return True
    if r.hook != NULL:
        rc = cma_combine(E, p, r, h.addr, h.nbytes, &done)
    else:
        rc = cma_copy(p, r.buf, h.addr, h.nbytes)
    if rc == 0:
        p.cma_proven = True
        complete(E, r, E_NONE)
        send_ctrl(E, p, OP_FIN, h.ctx, h.cookie, 0, 0)
        return True
    if done:                                # part combined: cannot start over by streaming
        fail(E, r, E_PEER_LOST, h.src)
        send_ctrl(E, p, OP_FIN, h.ctx, h.cookie, 0, 1)
        return True
    p.cma_ok = False                        # not permitted here: two copies from now on
    return False


cdef void shm_beat(eng_t *E, peer_t *p) noexcept nogil:
    """A heartbeat costs no message: bump our counter in the pair's control page."""
    st_rel_u64(p.beat_me, p.beat_me[0] + 1)


cdef uint64_t shm_heard(peer_t *p) noexcept nogil:
    return ld_acq_u64(p.beat_peer)


cdef uint64_t shm_memory(peer_t *p) noexcept nogil:
    return p.seg_len


cdef void shm_release(peer_t *p) noexcept nogil:
    if p.fd >= 0:
        close(p.fd)
        p.fd = -1
    if p.peer_efd >= 0:
        close(p.peer_efd)
        p.peer_efd = -1
    if p.seg != NULL:
        munmap(p.seg, p.seg_len)
        p.seg = NULL


cdef chan_ops_t SHM_OPS = chan_ops_t(
    name=b"shm", remote=True, polled_fd=False, chunked=True, overtake=False, post=NULL, put=shm_put_now,
    flush=shm_flush, poll=shm_poll, on_event=shm_on_event, arm=shm_arm, pull=shm_pull,
    push=shm_push, disarm=shm_disarm,
    beat=shm_beat, beat_lockfree=True, heard=shm_heard, memory=shm_memory, unsent=NULL, release=shm_release)
