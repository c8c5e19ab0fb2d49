# The engine: message handling, progress, sleeping and the progress thread.
#
# Lock and GIL rules (read before changing anything here):
# - eng_t.lock (a pthread mutex) guards every queue, peer and request.  All
#   cdef functions in this module run with it held, except block(),
#   pt_main() and the Engine methods that take it.
# - None of them touch Python objects; they run without the GIL.  Python
#   state (the set of live Request objects) is swept by the Engine methods
#   with the GIL held, from E.done_head.
# - A waiting caller spins first (driving progress itself, lowest latency),
#   then sleeps.  At most one thread sleeps in epoll_wait (the "epoller");
#   others sleep on done_cond.  The progress thread runs only while requests
#   are outstanding and nobody spins.
# - Two epoll sets.  Spinners poll only iofd (sockets).  The doorbell and
#   kick eventfds sit in epfd, which only the epoller waits on: a spinner
#   that drained them would swallow the epoller's wake-up, leaving it asleep
#   with its sleep flags at 2 (so no producer rings again) until its timeout.

cdef enum:
    MAX_POISON = 32
    MAX_EVENTS = 64


cdef struct eng_t:
    int rank
    int size
    peer_t *peers
    pthread_mutex_t lock
    pthread_cond_t done_cond
    pthread_cond_t pt_cond
    int epfd            # sleep set: iofd, doorbell, kickfd (only the epoller waits here)
    int iofd            # channel set: TCP sockets, liveness sockets (spinners poll it too)
    int doorbell        # my eventfd: shared-memory peers write it to wake me
    int kickfd          # eventfd that wakes whoever sleeps in epoll_wait
    req_t *posted_head
    req_t *posted_tail
    umsg_t *unexp_head
    umsg_t *unexp_tail
    uint64_t unexp_bytes
    uint64_t unexp_count
    req_t *done_head
    uint64_t next_id
    int outstanding
    int drivers
    int sleepers
    bint epoller
    bint epoller_is_waiter
    bint pt_parked      # idle: nothing outstanding, or a caller spins
    bint pt_fresh       # woken because requests were left outstanding: wait pt_delay_ns first
    bint pt_grace       # in that wait (no need to signal it again)
    int64_t pt_delay_ns
    bint pt_stop
    bint pt_running
    pthread_t pt
    uint64_t eager_limit
    uint64_t chunk
    uint64_t cma_min    # smallest shared-memory message copied with process_vm_readv
    uint64_t credit_bytes   # unexpected-message bytes we hold for each peer (flow control)
    char *cbuf          # bounce buffer of reduce-receives over CMA (cbuf_bytes, lazy)
    uint64_t cbuf_bytes # its size: cma_piece when it was made
    int64_t spin_ns     # current spin budget of a waiter (adapts, see block())
    int64_t spin_min_ns
    int64_t oversub_spin_max_ns     # the largest a chain step's budget learns (block())
    int64_t spin_max_ns
    bint oversub
    int n_fd_polled     # peers whose data comes on an fd (chan_ops_t.polled_fd)
    int n_polled        # peers with a poll step (chan_ops_t.poll)
    poison_t poison[MAX_POISON]
    int poison_next
    # liveness: the beat thread (beat_main)
    int64_t beat_ns         # heartbeat interval
    int64_t silent_ns       # a peer not heard from for this long is lost (0: never)
    pthread_t beat
    pthread_cond_t beat_cond
    pthread_mutex_t beat_lock       # guards beat_stop and beat_cond (not E.lock: see beat_main)
    bint beat_stop
    bint beat_running
    uint64_t beat_owed      # the beat thread missed the lock: progress() beats (beat_main)
    uint64_t beats_paid     # rounds progress() beat for it (Engine.liveness_info)
    uint64_t unexp_peak     # unexpected bytes' high mark since the queue was last empty
    pblock_t *pool[POOL_BUCKETS]    # free unexpected-message blocks by size (queues.pxi)
    uint64_t pool_bytes
    int n_poison        # contexts ever poisoned (0: skip the poison checks)
    bint closed         # no new operation (close() began)
    bint closing        # close() is saying goodbye: what fails now fails as closed
    bint released       # channels, queues and threads released (see Engine)


cdef inline void kick(eng_t *E) noexcept nogil:
    cdef uint64_t one = 1
    write(E.kickfd, &one, 8)


cdef inline void count_sent(peer_t *p, hdr_t *h, uint64_t plen) noexcept nogil:
    if h.opcode == OP_EAGER or h.opcode == OP_RTS:
        p.msgs_sent += 1
        p.bytes_sent += h.nbytes


cdef inline void count_recv(peer_t *p, hdr_t *h) noexcept nogil:
    p.msgs_recv += 1
    p.bytes_recv += h.nbytes


cdef void frame_done(eng_t *E, peer_t *p, frame_t *f) noexcept nogil:
    """Pop the head frame: it has been fully handed to the channel."""
    p.txq = f.next
    if p.txq == NULL:
        p.txq_tail = NULL
    if f.req != NULL:
        if f.h.opcode == OP_DATA:
            # a rendezvous's pieces may go on several streams (lanes), each
            # naming the send: it completes once all its bytes are handed over
            f.req.moved += f.len
            if f.req.moved >= f.req.nbytes:
                complete(E, f.req, E_NONE)
        else:
            complete(E, f.req, E_NONE)
    if f.owns_payload:
        free(f.payload)
    free(f)


cdef inline void flush(eng_t *E, peer_t *p) noexcept nogil:
    p.ops.flush(E, p)


cdef void insert_reply(peer_t *p, frame_t *f) noexcept nogil:
    """Queue a control reply ahead of every frame not yet started, behind the
    replies already queued (they keep their order).  Only where the channel
    allows it (TCP): a CTS queued behind megabytes of our own DATA would hold
    the peer's transfer back for as long as those take on the link, so a
    two-way exchange on one connection ran at a third of the link's rate.
    Frames are numbered (seq) and credit is stamped as they start, so an
    overtaken frame is numbered after its reply as on the wire."""
    cdef frame_t *prev = NULL
    cdef frame_t *at = p.txq
    if at != NULL and at.off > 0:       # a frame half written stays first
        prev, at = at, at.next
    while at != NULL and at.reply:
        prev, at = at, at.next
    f.reply = True
    f.next = at
    if prev == NULL:
        p.txq = f
    else:
        prev.next = f
    if at == NULL:
        p.txq_tail = f


cdef inline bint is_reply(int opcode) noexcept nogil:
    return opcode == OP_CTS or opcode == OP_FIN or opcode == OP_CREDIT or opcode == OP_BEAT


cdef bint enqueue(eng_t *E, peer_t *p, hdr_t *h, char *payload, uint64_t plen,
                  req_t *r, bint owns, bint chunked) noexcept nogil:
    cdef frame_t *f = <frame_t *>calloc(1, sizeof(frame_t))
    if f == NULL:
        return False
    memcpy(&f.h, h, sizeof(hdr_t))
    f.payload = payload
    f.len = plen
    f.req = r
    f.owns_payload = owns
    f.chunked = chunked
    if p.ops.overtake and is_reply(h.opcode):
        insert_reply(p, f)
    elif p.txq_tail != NULL:
        p.txq_tail.next = f
        p.txq_tail = f
    else:
        p.txq = f
        p.txq_tail = f
    return True


cdef inline void init_hdr(eng_t *E, hdr_t *h, int opcode, uint32_t ctx, int tag) noexcept nogil:
    memset(h, 0, sizeof(hdr_t))
    h.magic = HDR_MAGIC
    h.version = HDR_VERSION
    h.opcode = opcode
    h.src = E.rank
    h.ctx = ctx
    h.tag = tag


cdef void send_ctrl(eng_t *E, peer_t *p, int opcode, uint32_t ctx, uint64_t cookie,
                    uint64_t addr, uint64_t meta) noexcept nogil:
    cdef hdr_t h
    if p.lost:
        return
    init_hdr(E, &h, opcode, ctx, 0)
    h.cookie = cookie
    h.addr = addr
    h.meta = meta
    if not enqueue(E, p, &h, NULL, 0, NULL, False, False):
        peer_lost(E, p, E_PEER_LOST, b"out of memory queueing a control frame")
        return
    flush(E, p)


# ---------------------------------------------------------------- flow control
#
# Credit-based, per peer and direction, in bytes.  A rank grants each peer
# E.credit_bytes (COMMRT_UNEXPECTED_BYTES; told at connect time): the most
# the peer's messages may hold here before a receive matches them.  Every
# EAGER costs its payload plus MSG_COST, every RTS MSG_COST (its bookkeeping
# as an unexpected message).  The sender spends credit as it hands a message
# to the channel; one that does not fit waits in p.held, in send order (later
# messages queue behind it, so matching order holds; control frames -- CTS,
# DATA, FIN, CREDIT, ABORT, BYE, BEAT -- never wait).  The receiver earns the
# credit back when a receive matches the message (on arrival or later) and
# returns it in the `credit` field of the next frame it writes to that peer,
# whatever its opcode; with nothing to write and a quarter of the grant owed,
# it writes a CREDIT frame.  So a sender waits only while the receiver holds
# about its whole grant of unmatched messages, and the receiver's memory for
# them is bounded by the grant.  A peer that overspends is a protocol error.

cdef inline int64_t msg_cost(hdr_t *h) noexcept nogil:
    return <int64_t>MSG_COST + (<int64_t>h.nbytes if h.opcode == OP_EAGER else 0)


cdef inline void stamp_credit(peer_t *p, hdr_t *h) noexcept nogil:
    """Put what we owe the peer into a frame about to be written (not yet committed)."""
    cdef uint64_t most = 0xFFFFFFFF
    h.credit = <uint32_t>(p.owed if p.owed < most else most)


cdef inline void credit_sent(peer_t *p, hdr_t *h) noexcept nogil:
    """The frame stamped with h.credit is on its way: that credit is handed back."""
    p.owed -= h.credit
    p.rx_used -= h.credit
    p.credit_queued = False


cdef bint hold(eng_t *E, peer_t *p, hdr_t *h, char *payload, uint64_t plen,
               req_t *done_req, req_t *owner) noexcept nogil:
    """Queue a message frame until the peer grants credit for it."""
    cdef frame_t *f = <frame_t *>calloc(1, sizeof(frame_t))
    if f == NULL:
        return False
    memcpy(&f.h, h, sizeof(hdr_t))
    f.payload = payload
    f.len = plen
    f.req = done_req
    f.owner = owner
    owner.held = True
    if p.held_tail != NULL:
        p.held_tail.next = f
    else:
        p.held = f
    p.held_tail = f
    return True


cdef void release_held(eng_t *E, peer_t *p) noexcept nogil:
    """Move held frames the credit now covers to the channel queue, in order."""
    cdef frame_t *f
    cdef int64_t c
    while p.held != NULL:
        f = p.held
        c = msg_cost(&f.h)
        if p.tx_credit < c:
            break
        p.tx_credit -= c
        p.held = f.next
        if p.held == NULL:
            p.held_tail = NULL
        f.next = NULL
        f.owner.held = False
        f.owner = NULL
        if p.txq_tail != NULL:
            p.txq_tail.next = f
        else:
            p.txq = f
        p.txq_tail = f


cdef inline void take_credit(eng_t *E, peer_t *p, uint32_t credit) noexcept nogil:
    """A frame from the peer handed credit back."""
    p.tx_credit += credit
    if p.held != NULL:
        release_held(E, p)
        flush(E, p)


cdef inline bint charge(eng_t *E, peer_t *p, hdr_t *h) noexcept nogil:
    """An EAGER or RTS arrived: the peer spent credit on it.  False: it overspent,
    or announced an EAGER longer than the whole credit (no sender may: the
    length comes off the wire, and one near 2**64 wrapped both msg_cost, which
    then let it pass, and the unexpected message's block size in new_umsg, so a
    TCP payload streamed past a block of a few bytes)."""
    if h.opcode == OP_EAGER and h.nbytes > E.credit_bytes:
        peer_lost(E, p, E_PEER_LOST, b"protocol error: an EAGER message longer than the "
                                     b"credit granted to its sender")
        return False
    p.rx_used += msg_cost(h)
    if p.rx_used > <int64_t>E.credit_bytes:
        peer_lost(E, p, E_PEER_LOST, b"protocol error: the peer sent more unexpected-message "
                                     b"bytes than the credit it was granted")
        return False
    return True


cdef inline void credit_back(eng_t *E, peer_t *p, hdr_t *h) noexcept nogil:
    """A receive matched the peer's message: its credit is owed back."""
    if not p.ops.remote:
        p.tx_credit += msg_cost(h)          # a message to oneself: one's own credit
        return
    if p.lost:
        return
    p.owed += <uint64_t>msg_cost(h)
    if p.owed >= E.credit_bytes // 4 and not p.credit_queued:
        p.credit_queued = True
        send_ctrl(E, p, OP_CREDIT, 0, 0, 0, 0)


# ---------------------------------------------------------------- receiving

cdef void start_rendezvous(eng_t *E, peer_t *p, req_t *r, hdr_t *h) noexcept nogil:
    """Receive r matched an RTS: copy directly (CMA) or ask for the data (CTS)."""
    set_status(r, h)
    if p.lost:
        # announced before its sender was lost (an unexpected RTS matched later):
        # the data will never come, and peer_lost has already run -- a receive
        # left active on it would wait forever
        fail(E, r, p.lost, p.rank)
        return
    if r.hook != NULL and not combine_ok(r, h):
        complete(E, r, E_NONE)              # not the message expected: buf untouched
        send_ctrl(E, p, OP_FIN, h.ctx, h.cookie, 0, 1)
        return
    if h.nbytes > r.cap:
        r.err_a = h.nbytes
        fail(E, r, E_TRUNC, h.src)
        send_ctrl(E, p, OP_FIN, h.ctx, h.cookie, 0, 1)     # sender may reuse its buffer
        return
    if p.ops.pull != NULL and p.ops.pull(E, p, r, h):
        return                              # the channel fetched it (or failed it) and said FIN
    r.state = S_ACTIVE
    r.moved = 0
    dlist_push(&p.rxact_head, r)
    send_ctrl(E, p, OP_CTS, h.ctx, h.cookie, r.id, 0)


cdef void on_message(eng_t *E, peer_t *p, hdr_t *h, const char *payload) noexcept nogil:
    """Handle one arrived message whose payload (if any) is at `payload`.

    TCP passes EAGER, DATA and ABORT payloads through tcp_begin/tcp_end
    instead; every other opcode comes here from both channels."""
    cdef req_t *r
    cdef umsg_t *u
    cdef int op = h.opcode
    cdef int rc
    if op == OP_EAGER:
        count_recv(p, h)
        if not charge(E, p, h):
            return
        r = match_posted(E, h.ctx, h.src, h.tag)
        if r != NULL:
            credit_back(E, p, h)
            deliver(E, r, h, payload)
        elif E.n_poison and poisoned(E, h.ctx):
            credit_back(E, p, h)            # never matched now: dropped
        else:
            u = new_umsg(E, h, h.src, True)
            if u == NULL:
                peer_lost(E, p, E_PEER_LOST, b"out of memory for an unexpected message")
                return
            if h.nbytes:
                memcpy(u.data, payload, h.nbytes)
            unexp_append(E, u)
    elif op == OP_RTS:
        count_recv(p, h)
        if not charge(E, p, h):
            return
        r = match_posted(E, h.ctx, h.src, h.tag)
        if r != NULL:
            credit_back(E, p, h)
            start_rendezvous(E, p, r, h)
        elif E.n_poison and poisoned(E, h.ctx):
            credit_back(E, p, h)
            refuse_rts(E, p, h.ctx)         # never matched now: the sender's send fails
        else:
            u = new_umsg(E, h, h.src, False)
            if u == NULL:
                peer_lost(E, p, E_PEER_LOST, b"out of memory for an unexpected message")
                return
            unexp_append(E, u)
    elif op == OP_CTS:
        r = find_by_id(p.await_head, h.cookie)
        if r == NULL:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: CTS for no waiting send")
            return
        if ((h.meta & 0xff) == CTS_PUSH or (h.meta & 0xff) == CTS_SPLIT) and p.ops.push != NULL:
            rc = p.ops.push(E, p, r, h)
            if rc == PUSH_WRITTEN or rc == PUSH_REFUSED or rc == PUSH_SPLIT:
                return                      # completed; or still waiting for a FIN
        dlist_remove(&p.await_head, r)
        r.state = S_ACTIVE
        send_data(E, p, r, h.addr)
    elif op == OP_DATA:             # shared-memory chunk
        r = find_by_id(p.rxact_head, h.cookie)
        if r == NULL or not span_fits(h.addr, h.nbytes, r.nbytes):
            peer_lost(E, p, E_PEER_LOST, b"protocol error: DATA for no active receive")
            return
        if r.hook != NULL:
            if h.addr % r.itemsize or h.nbytes % r.itemsize:
                peer_lost(E, p, E_PEER_LOST, b"protocol error: DATA chunk splits an element")
                return
            r.hook(r.buf + h.addr, payload, <int64_t>(h.nbytes // r.itemsize))
        else:
            memcpy(r.buf + h.addr, payload, h.nbytes)
        r.moved += h.nbytes
        if r.moved >= r.nbytes:
            dlist_remove(&p.rxact_head, r)
            complete(E, r, E_NONE)
    elif op == OP_FIN and h.meta == FIN_SPLIT:      # the sender's part of a split copy is in
        r = find_by_id(p.rxact_head, h.cookie)
        if r == NULL:
            return                          # failed here while the sender wrote (shm_split_read)
        if r.split_at == 0 or r.slot == 0:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: FIN for no split receive")
            return
        dlist_remove(&p.rxact_head, r)
        r.slot = 0
        r.moved = r.nbytes
        p.splits_shared += 1
        complete(E, r, E_NONE)
        send_ctrl(E, p, OP_FIN, h.ctx, r.split_cookie, 0, 0)    # its buffer is its own again
    elif op == OP_FIN and h.meta == FIN_PUSHED:     # our receive was written by its sender
        r = find_by_id(p.rxact_head, h.cookie)
        if r == NULL or r.slot == 0:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: FIN for no pushed receive")
            return
        dlist_remove(&p.rxact_head, r)
        r.slot = 0
        r.moved = r.nbytes
        complete(E, r, E_NONE)
    elif op == OP_FIN:
        r = find_by_id(p.await_head, h.cookie)
        if r == NULL:
            peer_lost(E, p, E_PEER_LOST, b"protocol error: FIN for no waiting send")
            return
        dlist_remove(&p.await_head, r)
        complete(E, r, E_NONE)
    elif op == OP_ABORT:
        if not abort_fields_ok(E, h):
            refuse_abort(E, p)
            return
        memcpy(p.abort_text, payload, h.nbytes)
        p.abort_text[h.nbytes] = 0
        on_abort(E, p, h)
    elif op == OP_BYE:
        on_bye(E, p)


cdef void on_bye(eng_t *E, peer_t *p) noexcept nogil:
    """A BYE on one of the peer's streams.  With lanes, DATA the peer sent
    before closing may still be on the others: the peer is closed once every
    stream said BYE, and a stream that did reads no more (its EOF is no news)."""
    cdef peer_t *m = main_of(p)
    m.byes += 1
    if m.byes <= m.nlanes:
        p.bye_seen = True
        if p.in_epoll:
            epoll_ctl(E.iofd, EPOLL_CTL_DEL, p.fd, NULL)
            p.in_epoll = False
        return
    peer_lost(E, m, E_CLOSED, b"the peer closed its communicator")


# Where replies overtake (TCP), a rendezvous's DATA goes in frames of at most
# this many bytes (each at its offset, h.addr): a reply then waits behind at
# most one piece in flight, never behind a whole large message.
DEF DATA_PIECE = 1 << 20


cdef void send_data(eng_t *E, peer_t *p, req_t *r, uint64_t recv_id) noexcept nogil:
    """The DATA of send r (its CTS came): in pieces where replies overtake, each
    naming r and counted as it is handed over (frame_done); with lanes the
    pieces take the lanes in turn, and the channel's own connection keeps only
    what is small and urgent (EAGER, RTS, CTS, FIN, credit): a CTS written
    behind megabytes of DATA in the kernel's socket buffer waited as long as
    those took on the link, while the peer's transfer stood still."""
    cdef hdr_t h
    cdef uint64_t off = 0
    cdef uint64_t piece = r.nbytes
    cdef peer_t *q
    cdef int k
    init_hdr(E, &h, OP_DATA, r.ctx, r.tag)
    h.cookie = recv_id
    r.moved = 0
    if p.ops.overtake:
        piece = DATA_PIECE              # a multiple of every combinable itemsize
    while True:
        h.addr = off
        h.nbytes = piece if r.nbytes - off > piece else r.nbytes - off
        q = p
        if p.nlanes:
            q = &p.lanes[p.next_lane]
            p.next_lane = p.next_lane + 1 if p.next_lane + 1 < p.nlanes else 0
        if not enqueue(E, q, &h, r.buf + off, h.nbytes, r, False, p.ops.chunked):
            if off:     # pieces already queued point into the buffer: drop the channel
                peer_lost(E, p, E_PEER_LOST, b"out of memory queueing DATA")
            fail(E, r, E_PEER_LOST, p.rank)
            return
        off += h.nbytes
        if off >= r.nbytes:
            break
    flush(E, p)
    for k in range(p.nlanes):
        if p.lost:
            break
        if p.lanes[k].txq != NULL:
            flush(E, &p.lanes[k])


# ---------------------------------------------------------------- posting

# Messages to oneself.  A posted receive takes one at once.  Else it is copied
# into the unexpected queue while the rank's credit with itself covers it (the
# same bound as any peer's, COMMRT_UNEXPECTED_BYTES: self peer's tx_credit,
# earned back as receives match); else it waits, not copied, in send order on
# the self peer's await list until a receive takes it straight from the send
# buffer (a blocking send to oneself then waits for its receive, as MPI
# allows: post the receive first, or use sendrecv).  Once one waits, later
# ones wait behind it, so every copied message precedes every waiting one and
# a receive that accepts both takes the earlier (post_recv looks at the
# unexpected queue first).

cdef inline void self_hdr(eng_t *E, req_t *s, hdr_t *h) noexcept nogil:
    init_hdr(E, h, OP_EAGER, s.ctx, s.tag)
    h.nbytes = s.nbytes
    h.meta = s.meta
    h.meta2 = s.meta2


cdef void self_send(eng_t *E, req_t *s) noexcept nogil:
    cdef hdr_t h
    cdef req_t *r
    cdef umsg_t *u
    cdef peer_t *p = &E.peers[E.rank]
    cdef int64_t c
    self_hdr(E, s, &h)
    r = match_posted(E, s.ctx, E.rank, s.tag)
    if r != NULL:
        self_deliver(E, p, r, s, &h)
        return
    c = msg_cost(&h)
    if p.await_head != NULL or p.tx_credit < c:
        s.held = True                       # waits for its receive
        dlist_push(&p.await_head, s)
        return
    u = new_umsg(E, &h, E.rank, True)
    if u == NULL:
        fail(E, s, E_PEER_LOST, E.rank)
        return
    if s.nbytes:
        memcpy(u.data, s.buf, s.nbytes)
    p.tx_credit -= c
    count_sent(p, &h, s.nbytes)
    count_recv(p, &h)
    unexp_append(E, u)
    complete(E, s, E_NONE)


cdef inline void self_deliver(eng_t *E, peer_t *p, req_t *r, req_t *s, hdr_t *h) noexcept nogil:
    """Receive r takes self-send s straight from its buffer; both complete."""
    count_sent(p, h, s.nbytes)
    count_recv(p, h)
    deliver(E, r, h, s.buf)
    complete(E, s, E_NONE)


cdef bint self_take_waiting(eng_t *E, req_t *r) noexcept nogil:
    """A receive being posted takes the first waiting self-send it accepts."""
    cdef peer_t *p = &E.peers[E.rank]
    cdef req_t *s = p.await_head
    cdef hdr_t h
    while s != NULL and not accepts(r, s.ctx, E.rank, s.tag):
        s = s.next
    if s == NULL:
        return False
    dlist_remove(&p.await_head, s)
    s.held = False
    self_hdr(E, s, &h)
    self_deliver(E, p, r, s, &h)
    return True


cdef void self_flush(eng_t *E, peer_t *p) noexcept nogil:
    pass                                    # nothing is ever queued for oneself


cdef uint64_t no_memory(peer_t *p) noexcept nogil:
    return 0


cdef chan_ops_t SELF_OPS = chan_ops_t(
    name=b"self", remote=False, polled_fd=False, chunked=False, overtake=False, post=self_send, put=NULL,
    flush=self_flush, poll=NULL, on_event=NULL, arm=NULL, pull=NULL, push=NULL, disarm=NULL, beat=NULL,
    beat_lockfree=False, heard=NULL,
    memory=no_memory, unsent=NULL, release=NULL)


cdef void post_send(eng_t *E, req_t *r) noexcept nogil:
    cdef peer_t *p = &E.peers[r.peer]
    cdef hdr_t h
    cdef int64_t c
    E.outstanding += 1
    r.state = S_PENDING
    r.id = E.next_id
    E.next_id += 1
    if p.lost:
        fail(E, r, p.lost, p.rank)
        return
    if E.n_poison and poisoned(E, r.ctx):
        fail(E, r, E_ABORTED, -1)
        return
    if p.ops.post != NULL:
        p.ops.post(E, r)
        return
    if r.nbytes <= E.eager_limit:
        init_hdr(E, &h, OP_EAGER, r.ctx, r.tag)
        h.nbytes = r.nbytes
        h.meta = r.meta
        h.meta2 = r.meta2
        c = msg_cost(&h)
        if p.held != NULL or p.tx_credit < c:       # out of credit: wait for the receiver
            if not hold(E, p, &h, r.buf, r.nbytes, r, r):
                fail(E, r, E_PEER_LOST, p.rank)
            return
        p.tx_credit -= c
        if p.txq == NULL and p.ops.put != NULL and p.ops.put(E, p, &h, r.buf, r.nbytes):
            count_sent(p, &h, r.nbytes)
            complete(E, r, E_NONE)
            return
        if not enqueue(E, p, &h, r.buf, r.nbytes, r, False, False):
            fail(E, r, E_PEER_LOST, p.rank)
            return
    else:
        init_hdr(E, &h, OP_RTS, r.ctx, r.tag)
        h.nbytes = r.nbytes
        h.meta = r.meta
        h.meta2 = r.meta2
        h.cookie = r.id
        h.addr = <uint64_t><size_t>r.buf
        dlist_push(&p.await_head, r)
        c = msg_cost(&h)
        if p.held != NULL or p.tx_credit < c:
            if not hold(E, p, &h, NULL, 0, NULL, r):
                dlist_remove(&p.await_head, r)
                fail(E, r, E_PEER_LOST, p.rank)
            return
        p.tx_credit -= c
        if not enqueue(E, p, &h, NULL, 0, NULL, False, False):
            dlist_remove(&p.await_head, r)
            fail(E, r, E_PEER_LOST, p.rank)
            return
    flush(E, p)


cdef void post_recv(eng_t *E, req_t *r) noexcept nogil:
    cdef umsg_t *u
    cdef peer_t *p
    E.outstanding += 1
    r.state = S_PENDING
    r.id = E.next_id
    E.next_id += 1
    if poisoned(E, r.ctx):
        fail(E, r, E_ABORTED, -1)
        return
    u = match_unexpected(E, r)
    if u != NULL:
        p = &E.peers[u.src]
        credit_back(E, p, &u.h)
        if u.partial:                       # TCP payload still arriving
            u.waiter = r
            r.state = S_ACTIVE
            return
        if u.h.opcode == OP_EAGER:
            deliver(E, r, &u.h, u.data)
        else:
            start_rendezvous(E, p, r, &u.h)
        free_umsg(E, u)
        return
    if (r.peer < 0 or r.peer == E.rank) and E.peers[E.rank].await_head != NULL \
            and self_take_waiting(E, r):
        return
    if r.peer >= 0 and E.peers[r.peer].lost:
        fail(E, r, E.peers[r.peer].lost, r.peer)
        return
    posted_append(E, r)


# ---------------------------------------------------------------- failure

cdef void send_abort(eng_t *E, peer_t *p, poison_t *z, bint pair) noexcept nogil:
    """Tell p that context z.ctx is aborted (code, culprit, origin, reason); pair:
    and its partner context (ctx ^ 1: a communicator's point-to-point and
    collective contexts), both at once at the receiver."""
    cdef hdr_t h
    cdef size_t n = strlen(z.reason)
    cdef char *payload
    if p.lost or not p.ops.remote:
        return
    init_hdr(E, &h, OP_ABORT, z.ctx, z.culprit)
    h.meta = <uint64_t>z.code
    h.addr = <uint64_t>z.origin
    h.cookie = 1 if pair else 0
    h.nbytes = n
    payload = <char *>malloc(n + 1)
    if payload == NULL:
        return
    memcpy(payload, z.reason, n)
    if not enqueue(E, p, &h, payload, n, NULL, True, False):
        free(payload)
        return
    flush(E, p)


cdef void refuse_rts(eng_t *E, peer_t *p, uint32_t ctx) noexcept nogil:
    """p announced a large message on an aborted context: it will never be
    matched, so tell p (its send then fails, see on_abort)."""
    cdef poison_t *z = find_poison(E, ctx)
    if z != NULL:
        send_abort(E, p, z, False)


cdef bint abort_fields_ok(eng_t *E, hdr_t *h) noexcept nogil:
    """An ABORT as send_abort writes it: a known failure code, a culprit in the
    world or none (-1), an origin in the world, only the pair bit in cookie,
    meta2 zero, at most ABORT_TEXT_MAX bytes of reason.  Its fields reach the
    error every rank raises (the code picks its class, the ranks are named):
    anything else is garbage from a broken or hostile peer."""
    return (FAILURE_CODE_MIN <= h.meta <= FAILURE_CODE_MAX and -1 <= h.tag < E.size
            and h.addr < <uint64_t>E.size and h.cookie <= 1 and h.meta2 == 0
            and h.nbytes <= ABORT_TEXT_MAX)


cdef inline void refuse_abort(eng_t *E, peer_t *p) noexcept nogil:
    """A malformed ABORT: drop its sender, poison nothing."""
    peer_lost(E, p, E_PEER_LOST, b"protocol error: ABORT frame with a failure code, rank "
                                 b"or length commrt never writes")


cdef void on_abort(eng_t *E, peer_t *p, hdr_t *h) noexcept nogil:
    """p says context h.ctx (and its partner, for a pair) is aborted: poison it
    here (the first abort heard wins), and drop what waits on it unmatched."""
    cdef umsg_t *u
    cdef umsg_t *un
    cdef bint pair = (h.cookie & 1) != 0
    poison_ctx(E, h.ctx, p.abort_text, p.rank, <int>h.meta, h.tag, <int>h.addr)
    if pair:
        poison_ctx(E, h.ctx ^ 1, p.abort_text, p.rank, <int>h.meta, h.tag, <int>h.addr)
    u = E.unexp_head
    while u != NULL:
        un = u.next
        if (u.h.ctx == h.ctx or pair and u.h.ctx == (h.ctx ^ 1)) and not u.partial:
            unexp_remove(E, u)
            credit_back(E, &E.peers[u.src], &u.h)   # its sender's credit: never matched now
            if u.h.opcode == OP_RTS:
                refuse_rts(E, &E.peers[u.src], u.h.ctx)
            free_umsg(E, u)
        u = un


cdef void fail_list(eng_t *E, req_t **head, int err, int rank) noexcept nogil:
    cdef req_t *r
    while head[0] != NULL:
        r = head[0]
        dlist_remove(head, r)
        fail(E, r, err, rank)


cdef void peer_lost(eng_t *E, peer_t *p, int err, const char *reason) noexcept nogil:
    """The peer died, closed or misbehaved: fail everything that involves it."""
    cdef frame_t *f
    cdef req_t *r
    cdef req_t *nxt
    cdef umsg_t *u
    cdef umsg_t *un
    p = main_of(p)                          # a lane lost is its peer lost
    if p.lost:
        return
    p.lost = err
    if E.closing:
        # this rank is closing: its pending operations end as closed, whatever
        # its peers do meanwhile (a peer closing at the same moment skips its
        # BYE to a rank that said BYE first, and its EOF is then all we see)
        err = E_SHUTDOWN
    strncpy(p.reason, reason, 159)
    p.reason[159] = 0
    if p.in_epoll:
        epoll_ctl(E.iofd, EPOLL_CTL_DEL, p.fd, NULL)
        p.in_epoll = False
    while p.txq != NULL:
        f = p.txq
        p.txq = f.next
        if f.req != NULL:
            fail(E, f.req, err, p.rank)
        if f.owns_payload:
            free(f.payload)
        free(f)
    p.txq_tail = NULL
    while p.held != NULL:
        f = p.held
        p.held = f.next
        f.owner.held = False
        if f.req != NULL:
            fail(E, f.req, err, p.rank)
        free(f)
    p.held_tail = NULL
    if p.nlanes:
        tcp_drop_lanes(E, p, err)
    fail_list(E, &p.await_head, err, p.rank)
    if p.ops.disarm != NULL:
        r = p.rxact_head
        while r != NULL:
            if r.slot:
                p.ops.disarm(E, p, r)
            r = r.next
    fail_list(E, &p.rxact_head, err, p.rank)
    if p.rx_req != NULL:
        fail(E, p.rx_req, err, p.rank)
        p.rx_req = NULL
    if p.rx_umsg != NULL:                   # half-received: never deliver it
        u = p.rx_umsg
        p.rx_umsg = NULL
        if u.waiter != NULL:
            fail(E, u.waiter, err, p.rank)
        else:
            unexp_remove(E, u)
        free_umsg(E, u)
    r = E.posted_head
    while r != NULL:
        nxt = r.next
        if r.peer == p.rank or (r.peer < 0 and err != E_CLOSED):
            posted_remove(E, r)
            fail(E, r, err, p.rank)
        r = nxt


# ---------------------------------------------------------------- progress

cdef void handle_events(eng_t *E, epoll_event *evs, int n) noexcept nogil:
    cdef int i
    cdef int kind
    cdef int rank
    cdef uint64_t sink
    cdef peer_t *p
    for i in range(n):
        kind = <int>(evs[i].data.u64 >> 32)
        rank = <int>(evs[i].data.u64 & <uint64_t>0xffffffff)
        if kind == EV_PEER:
            p = &E.peers[rank]
            if not p.lost:
                p.ops.on_event(E, p, evs[i].events)
        elif kind == EV_LANE:               # (lane << 24) | rank
            p = &E.peers[rank & 0xffffff]
            if not p.lost and (rank >> 24) < p.nlanes:
                tcp_on_event(E, &p.lanes[rank >> 24], evs[i].events)
        elif kind == EV_IO:                 # the channel set is ready: harvest it
            progress(E, True)
        elif kind == EV_DOORBELL:
            read(E.doorbell, &sink, 8)
        elif kind == EV_KICK:
            read(E.kickfd, &sink, 8)


cdef int progress(eng_t *E, bint poll_fds) noexcept nogil:
    """One pass over every channel.  Returns how many records moved (shm)."""
    cdef int i
    cdef int n = 0
    cdef int k
    cdef peer_t *p
    cdef epoll_event evs[MAX_EVENTS]
    if ld_acq_u64(&E.beat_owed):
        pay_owed_beat(E)
    if E.n_polled:
        for i in range(E.size):
            p = &E.peers[i]
            if p.lost == 0 and p.ops.poll != NULL:
                n += p.ops.poll(E, p)
    if poll_fds:
        k = epoll_wait(E.iofd, evs, MAX_EVENTS, 0)
        if k > 0:
            handle_events(E, evs, k)
            n += k
    return n


cdef void arm(eng_t *E, uint32_t value) noexcept nogil:
    cdef int i
    cdef peer_t *p
    for i in range(E.size):
        p = &E.peers[i]
        if p.lost == 0 and p.ops.arm != NULL:
            p.ops.arm(p, value)
    fence_seq_cst()


cdef void sleep_once(eng_t *E, int64_t deadline, bint waiter) noexcept nogil:
    """Sleep until something happens or the deadline (lock held on entry and exit)."""
    cdef int64_t t = now_ns()
    cdef int64_t cap = 100000000 if waiter else 200000000
    cdef int64_t wait_ns = deadline - t
    cdef timespec ts
    cdef int n
    cdef epoll_event evs[MAX_EVENTS]
    if wait_ns <= 0:
        return
    if wait_ns > cap:
        wait_ns = cap
    if E.epoller:
        clock_gettime(CLOCK_MONOTONIC, &ts)
        ts.tv_sec += (ts.tv_nsec + wait_ns) // 1000000000
        ts.tv_nsec = (ts.tv_nsec + wait_ns) % 1000000000
        E.sleepers += 1
        pthread_cond_timedwait(&E.done_cond, &E.lock, &ts)
        E.sleepers -= 1
        return
    E.epoller = True
    E.epoller_is_waiter = waiter
    arm(E, 1)
    if progress(E, False) > 0:              # arrived before the flags were up
        arm(E, 0)
        E.epoller = False
        return
    pthread_mutex_unlock(&E.lock)
    n = epoll_wait(E.epfd, evs, MAX_EVENTS, <int>((wait_ns + 999999) // 1000000))
    pthread_mutex_lock(&E.lock)
    E.epoller = False
    arm(E, 0)
    if n > 0:
        handle_events(E, evs, n)
    progress(E, False)
    if E.sleepers > 0:
        pthread_cond_broadcast(&E.done_cond)


cdef bint block(eng_t *E, req_t *r, int64_t deadline, bint spin=True,
                bint handoff=True, int64_t *budget=NULL) noexcept nogil:
    """Wait for r until the deadline: spin (driving progress), then sleep.

    handoff=False: a caller that waits again at once (a chain's first, GIL-held
    spin) does not wake the progress thread for what is left outstanding.

    spin=False sleeps after one progress pass: for a thread that waits beside
    the caller's own computation (the collectives' worker), where spinning
    would take the core from that computation.

    The spin budget adapts: a wait that had to sleep but was answered within
    the largest budget doubles it (the answer was close: spinning a little
    longer saves two wake-ups, which cost far more on a loaded host); a wait
    that slept long halves it back toward the minimum (spinning would only
    have burnt a core).  When ranks outnumber cores the engine's budget stays
    at its minimum: the core is needed by the rank we wait for.  There a
    prepared collective's step learns its own (budget: the step's, 0 at
    first; learn_budget): a step whose answers keep coming a little after
    its waiter fell asleep (a scatter's receivers waiting out their root's
    previous call) spins, yielding at every pass as OpenMPI's waiters do,
    up to COMMRT_OVERSUB_SPIN_MAX_US, and a step that waits long (for a peer
    that computes) keeps sleeping soon: so the waits of one call do not
    teach another's."""
    cdef int64_t t = 0
    cdef int64_t spin_end
    cdef int64_t began = 0
    cdef int64_t slept_from
    cdef int64_t b = 0
    cdef unsigned int it = 0
    if budget != NULL:
        b = budget[0] if budget[0] > E.spin_min_ns else E.spin_min_ns
    pthread_mutex_lock(&E.lock)
    E.drivers += 1
    spin_end = -1                           # set at the first clock read (pass 0)
    while r.state < S_DONE:
        # fds (TCP data, a shm peer's death) every pass with TCP peers, else now and then
        progress(E, E.n_fd_polled > 0 or (it & 1023) == 1023)
        if r.state >= S_DONE:
            break
        # The clock every 8th pass: a pass is ~0.1 µs and a clock read a third of
        # that; the deadline and the spin budget overshoot by under a microsecond.
        if E.oversub or (it & 7) == 0:
            t = now_ns()
            if spin_end < 0:
                began = t
                spin_end = t + ((b if budget != NULL else E.spin_ns) if spin else 0)
            if t >= spin_end or t >= deadline:
                break
        pthread_mutex_unlock(&E.lock)
        if E.oversub or (it & 127) == 127:
            # Oversubscribed: the core is needed by the rank we wait for.  Otherwise
            # too, now and then (every ~10 µs): on a busy host the scheduler may
            # have put our peer on our core, and a waiter that never yields would
            # hold it for its whole budget (up to COMMRT_SPIN_MAX_US) per message.
            # With nobody else runnable here, sched_yield returns at once.
            sched_yield()
        else:
            # Two pauses, not eight: a pause is ~16 ns here (longer on newer cores),
            # and the message that lands during the pauses waits for them.
            cpu_relax()
            cpu_relax()
        pthread_mutex_lock(&E.lock)
        it += 1
    E.drivers -= 1
    if r.state >= S_DONE and budget != NULL and spin and began > 0:
        learn_budget(E, budget, b, t - began, False)
    if r.state < S_DONE:
        slept_from = now_ns()
        while r.state < S_DONE and now_ns() < deadline:
            sleep_once(E, deadline, True)
        if r.state >= S_DONE and budget != NULL and spin:
            learn_budget(E, budget, b, b + now_ns() - slept_from, True)
        if r.state >= S_DONE and spin and not E.oversub:
            t = now_ns() - slept_from
            if t < E.spin_max_ns:
                E.spin_ns = E.spin_ns * 2 if E.spin_ns * 2 < E.spin_max_ns else E.spin_max_ns
            elif t > 4 * E.spin_max_ns:
                E.spin_ns = E.spin_ns // 2 if E.spin_ns // 2 > E.spin_min_ns else E.spin_min_ns
    if handoff and E.drivers == 0 and E.outstanding > 0 and E.pt_parked:
        wake_progress_thread(E)
    t = r.state >= S_DONE
    pthread_mutex_unlock(&E.lock)
    return <bint>t


cdef inline void learn_budget(eng_t *E, int64_t *budget, int64_t b, int64_t waited,
                              bint slept) noexcept nogil:
    """A chain step's spin budget after a wait of `waited` ns with budget b (block()):
    an answer that came after the waiter fell asleep but within 4 budgets
    doubles it (up to oversub_spin_max_ns: the answer was near, and a wake-up
    where cores are shared costs a turn on them); one that took longer than 4
    of the largest halves it; one that came while spinning, in under a quarter
    of the budget, halves it too (spinning that long would only take turns
    from ranks that compute)."""
    if slept:
        if waited <= 4 * b:
            b = 2 * b if 2 * b < E.oversub_spin_max_ns else E.oversub_spin_max_ns
        elif waited > 4 * E.oversub_spin_max_ns:
            b = b // 2
    elif 4 * waited < b:
        b = b // 2
    budget[0] = b if b > E.spin_min_ns else E.spin_min_ns


cdef inline void wake_progress_thread(eng_t *E) noexcept nogil:
    """Requests were left outstanding: the progress thread takes over, after a grace."""
    E.pt_fresh = True
    pthread_cond_signal(&E.pt_cond)


cdef inline void timed_wait(pthread_cond_t *c, pthread_mutex_t *m, int64_t ns) noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    ts.tv_sec += (ts.tv_nsec + ns) // 1000000000
    ts.tv_nsec = (ts.tv_nsec + ns) % 1000000000
    pthread_cond_timedwait(c, m, &ts)


cdef void *pt_main(void *arg) noexcept nogil:
    """The progress thread: moves outstanding requests while nobody waits.

    Woken when a caller leaves requests outstanding, it waits a grace
    (pt_delay_ns, 1 ms) and looks again, as long as a caller spins: a
    caller that goes on to wait drives its requests itself, and a progress
    thread racing it for the lock and the other core (or woken by a futex
    at every wait) cost 15-35% of shared-memory bandwidth in a window of
    non-blocking sends.  A caller that computes instead gets its transfers
    moved after the grace."""
    cdef eng_t *E = <eng_t *>arg
    pthread_mutex_lock(&E.lock)
    while not E.pt_stop:
        if E.outstanding <= 0:
            E.pt_parked = True                  # idle until a caller leaves requests behind
            timed_wait(&E.pt_cond, &E.lock, 200000000)
            E.pt_parked = False
            continue
        if E.pt_fresh or E.drivers > 0:         # a caller may drive them itself: look again later
            E.pt_fresh = False
            E.pt_grace = True
            timed_wait(&E.pt_cond, &E.lock, E.pt_delay_ns)
            E.pt_grace = False
            continue
        progress(E, True)
        if E.outstanding > 0 and E.drivers == 0 and not E.pt_stop:
            sleep_once(E, now_ns() + 200000000, False)
    pthread_mutex_unlock(&E.lock)
    return NULL


# ---------------------------------------------------------------- liveness
#
# A process that stops (SIGSTOP, frozen, swapped out for good) or whose link
# is cut sends no EOF: only silence tells.  The beat thread, a plain C
# thread that never takes the GIL, wakes every beat_ns: it drives progress
# once (so what peers sent is read even while nobody waits), beats to every
# peer (shm: bumps a counter in the pair's control page; TCP: a BEAT frame
# when nothing else went out since the last beat), and looks at what it has
# heard from each (the peer's counter; bytes read from its socket).  A peer
# whose count has not moved for silent_ns is lost (E_SILENT): every pending
# operation on it fails, naming it and the silence.  A rank that computes,
# holding the GIL or sleeping in Python, keeps beating: its beat thread does
# not need the GIL.

cdef void *beat_main(void *arg) noexcept nogil:
    """Every beat_ns: beat the lock-free channels (shm) first, then take the engine
    lock for the rest (progress, TCP beats, silence checks, trimming).  The lock
    may be held for seconds by a single-copy read of a multi-GiB message: the
    lock-free beats go on regardless, so such a rank is never found silent.  A
    round that cannot have the lock within half a beat leaves its TCP beats and
    silence checks owed (beat_owed), and the holder's next progress() pass pays
    them: a waiter that keeps the lock busy (the mutex is not fair) still beats
    to a peer that hears only beats from it.  Passes end often enough for that:
    a TCP read pass takes at most RX_PASS_BYTES (tcp.pxi)."""
    cdef eng_t *E = <eng_t *>arg
    cdef int64_t t
    cdef timespec until
    pthread_mutex_lock(&E.lock)
    t = now_ns()
    for i in range(E.size):
        E.peers[i].heard_at = t
    pthread_mutex_unlock(&E.lock)
    pthread_mutex_lock(&E.beat_lock)
    while not E.beat_stop:
        timed_wait(&E.beat_cond, &E.beat_lock, E.beat_ns)
        if E.beat_stop:
            break
        pthread_mutex_unlock(&E.beat_lock)
        beat_lockfree(E)
        clock_gettime(CLOCK_REALTIME, &until)
        until.tv_sec += (until.tv_nsec + E.beat_ns // 2) // 1000000000
        until.tv_nsec = (until.tv_nsec + E.beat_ns // 2) % 1000000000
        if pthread_mutex_timedlock(&E.lock, &until) == 0:
            st_rel_u64(&E.beat_owed, 0)
            beat_locked(E)
            pthread_mutex_unlock(&E.lock)
        else:
            st_rel_u64(&E.beat_owed, 1)
        pthread_mutex_lock(&E.beat_lock)
    pthread_mutex_unlock(&E.beat_lock)
    return NULL


cdef void pay_owed_beat(eng_t *E) noexcept nogil:
    """The beat thread's missed round (beat_main), paid by the lock's holder: the
    TCP beats and the silence checks (its progress pass goes on after)."""
    st_rel_u64(&E.beat_owed, 0)
    E.beats_paid += 1
    beat_round(E, now_ns())


cdef void beat_lockfree(eng_t *E) noexcept nogil:
    cdef peer_t *p
    for i in range(E.size):
        p = &E.peers[i]
        if p.ops != NULL and p.ops.beat_lockfree and not p.lost:
            p.ops.beat(E, p)


cdef void beat_locked(eng_t *E) noexcept nogil:
    """The beat thread's round under the engine lock."""
    progress(E, True)
    beat_round(E, now_ns())
    if E.unexp_bytes == 0 and E.unexp_peak >= (1 << 20):
        E.unexp_peak = 0                    # a flood has drained: give its pages back
        pool_drain(E)
        pthread_mutex_unlock(&E.lock)
        malloc_trim(0)
        pthread_mutex_lock(&E.lock)


cdef void beat_round(eng_t *E, int64_t t) noexcept nogil:
    cdef peer_t *p
    cdef uint64_t heard
    cdef char why[160]
    for i in range(E.size):
        p = &E.peers[i]
        if p.lost or p.ops == NULL or p.ops.beat == NULL:
            continue
        if not p.ops.beat_lockfree:
            p.ops.beat(E, p)
        if p.lost:
            continue
        heard = p.ops.heard(p)
        if heard != p.heard_seen:
            p.heard_seen = heard
            p.heard_at = t
        elif E.silent_ns > 0 and t - p.heard_at > E.silent_ns:
            snprintf(why, 160, b"no heartbeat for %.1f s: the process is stopped or frozen, "
                     b"or the link to it is cut (COMMRT_LIVENESS_TIMEOUT_S=%g)",
                     (t - p.heard_at) / 1e9, E.silent_ns / 1e9)
            peer_lost(E, p, E_SILENT, why)
