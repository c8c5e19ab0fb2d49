# TCP channels.  Lock held in every function.
#
# Non-blocking sockets with TCP_NODELAY.  A frame is the header then the
# payload, written with one writev; partial writes resume where they stopped
# (EPOLLOUT is watched only while frames wait).  Receiving is a small state
# machine: read a header (through a staging buffer, so many small messages
# cost one recv), then its payload, straight into the matched receive buffer
# when there is one and it is large.
#
# Extra streams (COMMRT_TCP_STREAMS > 1): a peer's channel may have lanes,
# more TCP connections to the same peer, each a peer_t of its own for its
# socket, send queue, frame numbering and receive state (main points back at
# the peer's channel).  A lane carries only DATA (striped over the lanes a
# piece at a time, see send_data) and a BYE.  Everything that matches --
# EAGER, RTS, CTS, FIN, ABORT, credit, beats -- stays on the main connection,
# so the order per (communicator, tag) is the main connection's, and a CTS
# never waits in the kernel behind megabytes of DATA;
# DATA names its receive (cookie) and its offset, so pieces may arrive in any
# order on any stream.  A lane that fails loses the whole peer (peer_lost on
# the main channel drops every lane with it).  A BYE goes on every stream,
# behind that stream's DATA: the peer is closed once every stream said BYE.

cdef enum:
    RXBUF_BYTES = 262144
    HDR_BYTES = 64
    # The most one tcp_rx pass reads while the socket stays full.  Its caller
    # holds the engine lock: a stream of DATA frames that its sender keeps the
    # socket full of never drains it, so the pass read on for the whole message
    # (a 2 GiB message into freshly allocated pages, at ~70 MB/s, held the lock
    # for its 30 s) and the rank sent no heartbeat, its beat thread locked out
    # and no progress() pass to pay the beats it owed: its sender found it
    # silent.  Epoll is level-triggered here, so what is left is reported again.
    RX_PASS_BYTES = 4194304


cdef inline uint64_t tcp_tag(peer_t *p) noexcept nogil:
    """The epoll tag of a stream: the peer's channel, or one of its lanes."""
    if p.main != NULL:
        return (<uint64_t>EV_LANE << 32) | (<uint64_t>p.lane_ix << 24) | <uint64_t>p.rank
    return (<uint64_t>EV_PEER << 32) | <uint64_t>p.rank


cdef void tcp_want_out(eng_t *E, peer_t *p, bint want) noexcept nogil:
    cdef epoll_event ev
    cdef uint32_t mask = EPOLLIN | EPOLLRDHUP | (EPOLLOUT if want else 0)
    if p.in_epoll and mask != p.ev_mask:
        ev.events = mask
        ev.data.u64 = tcp_tag(p)
        epoll_ctl(E.iofd, EPOLL_CTL_MOD, p.fd, &ev)
        p.ev_mask = mask


cdef void tcp_flush(eng_t *E, peer_t *p) noexcept nogil:
    cdef frame_t *f
    cdef iovec iov[2]
    cdef int cnt
    cdef ssize_t n
    cdef uint64_t total
    while p.txq != NULL and p.lost == 0 and not p.tx_broken:
        f = p.txq
        total = HDR_BYTES + f.len
        cnt = 0
        if f.off == 0:                  # stamped now, committed once bytes of it are out
            f.h.seq = p.tx_seq
            stamp_credit(p, &f.h)
        if f.off < HDR_BYTES:
            iov[cnt].iov_base = (<char *>&f.h) + f.off
            iov[cnt].iov_len = HDR_BYTES - f.off
            cnt += 1
            if f.len:
                iov[cnt].iov_base = f.payload
                iov[cnt].iov_len = f.len
                cnt += 1
        else:
            iov[0].iov_base = f.payload + (f.off - HDR_BYTES)
            iov[0].iov_len = total - f.off
            cnt = 1
        n = writev(p.fd, iov, cnt)
        if n < 0:
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                break
            # The peer is gone.  What it sent before going is still readable
            # (an ABORT naming the rank that failed first, say, then its BYE):
            # read all of it before failing the channel, so errors name the
            # cause, not this cascade.  Inside tcp_rx (this write is a reply to
            # a frame being read) the reading goes on there: tcp_rx loses the
            # peer once it has read everything.
            p.tx_broken = True
            if not p.in_rx:
                tcp_rx(E, p)
            return
        if n == 0:
            break
        if f.off == 0:
            p.tx_seq += 1
            credit_sent(p, &f.h)
        f.off += <uint64_t>n
        if f.off < total:
            continue
        p.hdr_sent += HDR_BYTES
        count_sent(p, &f.h, f.len)
        frame_done(E, p, f)
    tcp_want_out(E, p, p.txq != NULL)


cdef bint tcp_begin(eng_t *E, peer_t *p) noexcept nogil:
    """A whole header is at rx_pos: decide where its payload goes."""
    cdef hdr_t *h = &p.rx_hdr
    cdef req_t *r
    cdef umsg_t *u
    cdef peer_t *m = main_of(p)             # matching and DATA's receives live there
    memcpy(h, p.rxbuf + p.rx_pos, HDR_BYTES)
    p.rx_pos += HDR_BYTES
    if h.magic != HDR_MAGIC or h.version != HDR_VERSION or h.opcode == 0 or h.opcode > OP_MAX \
            or h.opcode == OP_PAD or h.src != p.rank or h.seq != p.rx_seq:
        peer_lost(E, p, E_PEER_LOST, b"protocol error: bad frame header on TCP connection")
        return False
    if p.main != NULL and h.opcode != OP_DATA and h.opcode != OP_BYE:
        peer_lost(E, p, E_PEER_LOST, b"protocol error: a frame other than DATA or BYE on an "
                                     b"extra TCP stream")
        return False
    p.rx_seq += 1
    p.hdr_recv += HDR_BYTES
    if h.credit:
        take_credit(E, m, h.credit)
        if p.lost:
            return False
    p.rx_dst = NULL
    p.rx_req = NULL
    p.rx_umsg = NULL
    p.rx_hook = NULL
    p.rx_left = payload_len(h)
    if h.opcode == OP_EAGER:
        count_recv(p, h)
        if not charge(E, p, h):
            return False
        r = match_posted(E, h.ctx, h.src, h.tag)
        if r != NULL:
            credit_back(E, p, h)
            set_status(r, h)
            if r.hook != NULL:
                if combine_ok(r, h):
                    r.state = S_ACTIVE
                    p.rx_req = r
                    p.rx_dst = r.buf
                    p.rx_hook = r.hook
                    p.rx_isz = r.itemsize
                else:
                    complete(E, r, E_NONE)          # not the message expected: dropped
            elif h.nbytes > r.cap:
                r.err_a = h.nbytes
                fail(E, r, E_TRUNC, h.src)          # payload is read and dropped
            else:
                r.state = S_ACTIVE
                p.rx_req = r
                p.rx_dst = r.buf
        elif E.n_poison and poisoned(E, h.ctx):
            credit_back(E, p, h)                    # aborted context: payload dropped
        else:
            u = new_umsg(E, h, h.src, True)
            if u == NULL:
                peer_lost(E, p, E_PEER_LOST, b"out of memory for an unexpected message")
                return False
            u.partial = p.rx_left > 0
            unexp_append(E, u)
            p.rx_umsg = u
            p.rx_dst = u.data
    elif h.opcode == OP_DATA:
        r = find_by_id(m.rxact_head, h.cookie)
        if r == NULL or not span_fits(h.addr, h.nbytes, r.cap):
            peer_lost(E, p, E_PEER_LOST, b"protocol error: DATA for no active receive")
            return False
        p.rx_req = r
        p.rx_dst = r.buf + h.addr
        if r.hook != NULL:
            if h.addr % r.itemsize or h.nbytes % r.itemsize:
                peer_lost(E, p, E_PEER_LOST, b"protocol error: DATA splits an element")
                return False
            p.rx_hook = r.hook
            p.rx_isz = r.itemsize
    elif h.opcode == OP_ABORT:
        if not abort_fields_ok(E, h):       # before its payload: a lying length is never read
            refuse_abort(E, p)
            return False
        p.abort_text[0] = 0
        p.rx_dst = p.abort_text
    else:
        on_message(E, p, h, NULL)
    if p.rx_left == 0 and h.opcode in (OP_EAGER, OP_DATA, OP_ABORT):
        tcp_end(E, p)
    else:
        p.rx_stage = 1 if p.rx_left else 0
    return True


cdef void tcp_end(eng_t *E, peer_t *p) noexcept nogil:
    """The payload of the current frame has fully arrived."""
    cdef hdr_t *h = &p.rx_hdr
    cdef req_t *r = p.rx_req
    cdef umsg_t *u = p.rx_umsg
    p.rx_stage = 0
    p.rx_req = NULL
    p.rx_umsg = NULL
    p.rx_hook = NULL
    if h.opcode == OP_EAGER:
        if r != NULL:
            complete(E, r, E_NONE)
        elif u != NULL:
            u.partial = False
            if u.waiter != NULL:        # a receive matched it while it streamed in
                r = u.waiter
                deliver(E, r, &u.h, u.data)
                free_umsg(E, u)
    elif h.opcode == OP_DATA:
        r.moved += h.nbytes
        if r.moved >= r.nbytes:
            dlist_remove(&main_of(p).rxact_head, r)
            complete(E, r, E_NONE)
    elif h.opcode == OP_ABORT:
        p.abort_text[h.nbytes] = 0          # (at most ABORT_TEXT_MAX: checked in tcp_begin)
        on_abort(E, p, h)


cdef void tcp_rx(eng_t *E, peer_t *p) noexcept nogil:
    p.in_rx = True              # (tcp_flush must not re-enter us from a handler's reply)
    tcp_rx_loop(E, p, False, True)  # at most RX_PASS_BYTES while the socket stays full
    if p.tx_broken and p.lost == 0:
        tcp_rx_loop(E, p, False, False)     # a write failed meanwhile: read to the stream's end
        peer_lost(E, p, E_PEER_LOST, b"connection reset while sending")
    p.in_rx = False


cdef void tcp_rx_loop(eng_t *E, peer_t *p, bint drained, bint bounded) noexcept nogil:
    """Read and handle what the socket holds; bounded: at most about RX_PASS_BYTES
    while it stays full."""
    cdef ssize_t n
    cdef size_t have
    cdef size_t room
    cdef uint64_t take
    cdef uint64_t taken = 0     # bytes this pass read from the socket (RX_PASS_BYTES)
    while p.lost == 0 and not p.bye_seen:
        have = p.rx_end - p.rx_pos
        if p.rx_stage == 0:
            if have >= HDR_BYTES:
                if not tcp_begin(E, p):
                    return
                continue
        else:
            if have > 0:
                take = have if have < p.rx_left else p.rx_left
                if p.rx_hook != NULL:
                    # combine whole elements only; a split one waits for its rest
                    # (it sits at the staging buffer's end, so the refill keeps it)
                    take -= take % p.rx_isz
                    if take:
                        p.rx_hook(p.rx_dst, p.rxbuf + p.rx_pos, <int64_t>(take // p.rx_isz))
                        p.rx_dst += take
                elif p.rx_dst != NULL:
                    memcpy(p.rx_dst, p.rxbuf + p.rx_pos, take)
                    p.rx_dst += take
                if take:
                    p.rx_pos += take
                    p.rx_left -= take
                    if p.rx_left == 0:
                        tcp_end(E, p)
                    continue
            if p.rx_dst != NULL and p.rx_hook == NULL and p.rx_left >= RXBUF_BYTES // 2:
                # large payload: read straight into its destination
                if drained or (bounded and taken >= RX_PASS_BYTES):
                    return
                n = recv(p.fd, p.rx_dst, p.rx_left, MSG_DONTWAIT)
                if n > 0:
                    p.rx_raw += <uint64_t>n
                    taken += <uint64_t>n
                    drained = <uint64_t>n < p.rx_left
                    p.rx_dst += n
                    p.rx_left -= <uint64_t>n
                    if p.rx_left == 0:
                        tcp_end(E, p)
                    continue
                if not tcp_rx_error(E, p, n):
                    return
                continue
        # refill the staging buffer (unless the last read already emptied the
        # socket: a recv that only says EAGAIN costs as much as a message; or
        # this pass has read its share of a socket that stays full: no complete
        # frame is left in the staging buffer here, and epoll reports the rest)
        if drained or (bounded and taken >= RX_PASS_BYTES):
            return
        if p.rx_pos == p.rx_end:
            p.rx_pos = 0
            p.rx_end = 0
        elif p.rx_pos > RXBUF_BYTES // 2:
            memmove(p.rxbuf, p.rxbuf + p.rx_pos, p.rx_end - p.rx_pos)
            p.rx_end -= p.rx_pos
            p.rx_pos = 0
        room = RXBUF_BYTES - p.rx_end
        n = recv(p.fd, p.rxbuf + p.rx_end, room, MSG_DONTWAIT)
        if n > 0:
            p.rx_raw += <uint64_t>n
            taken += <uint64_t>n
            p.rx_end += <size_t>n
            drained = <size_t>n < room
            continue
        if not tcp_rx_error(E, p, n):
            return


cdef bint tcp_rx_error(eng_t *E, peer_t *p, ssize_t n) noexcept nogil:
    """Handle recv() returning n <= 0.  True when the caller should retry."""
    if n == 0:
        peer_lost(E, p, E_PEER_LOST, b"connection closed by the peer (process exited or was killed)")
        return False
    if errno == EINTR:
        return True
    if errno == EAGAIN:
        return False
    peer_lost(E, p, E_PEER_LOST, b"connection reset by the peer")
    return False


# ---------------------------------------------------------------- channel operations

cdef void tcp_on_event(eng_t *E, peer_t *p, uint32_t events) noexcept nogil:
    if events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP):
        tcp_rx(E, p)
    if not p.lost and (events & EPOLLOUT):
        tcp_flush(E, p)


cdef void tcp_beat(eng_t *E, peer_t *p) noexcept nogil:
    """A BEAT frame, unless a frame went out since the last beat (any frame is one)."""
    if p.txq == NULL and p.tx_seq == p.seq_at_beat:
        send_ctrl(E, p, OP_BEAT, 0, 0, 0, 0)
    p.seq_at_beat = p.tx_seq


cdef uint64_t tcp_heard(peer_t *p) noexcept nogil:
    cdef uint64_t n = p.rx_raw              # every byte received, beats included
    for k in range(p.nlanes):
        n += p.lanes[k].rx_raw
    return n


cdef uint64_t tcp_memory(peer_t *p) noexcept nogil:
    return RXBUF_BYTES * <uint64_t>(1 + p.nlanes)


cdef uint64_t tcp_unsent(peer_t *p) noexcept nogil:
    """Bytes in the socket's send queue the peer has not acknowledged.  Closing
    a socket that still has unread bytes from the peer resets the connection
    and throws away what the kernel had not sent yet (an ABORT, a BYE): close()
    waits for this to reach 0 first.  Acknowledged bytes are safe: a reset
    never discards what the peer's kernel holds for it to read."""
    cdef int n = 0
    cdef uint64_t total = 0
    for k in range(p.nlanes):
        total += tcp_unsent(&p.lanes[k])
    if p.fd < 0 or ioctl(p.fd, SIOCOUTQ, &n) != 0 or n < 0:
        return total
    return total + <uint64_t>n


cdef void tcp_release(peer_t *p) noexcept nogil:
    cdef int k
    if p.fd >= 0:
        close(p.fd)
        p.fd = -1
    if p.rxbuf != NULL:
        free(p.rxbuf)
        p.rxbuf = NULL
    if p.lanes != NULL:
        for k in range(p.nlanes):
            tcp_release(&p.lanes[k])
        free(p.lanes)
        p.lanes = NULL
        p.nlanes = 0


cdef void tcp_drop_lanes(eng_t *E, peer_t *p, int err) noexcept nogil:
    """The peer is lost (peer_lost, on its main channel): stop every lane, and
    fail what waits in their queues (DATA pieces of sends: each names its send)
    and what they were receiving into."""
    cdef peer_t *q
    cdef frame_t *f
    for k in range(p.nlanes):
        q = &p.lanes[k]
        q.lost = p.lost
        if q.in_epoll:
            epoll_ctl(E.iofd, EPOLL_CTL_DEL, q.fd, NULL)
            q.in_epoll = False
        while q.txq != NULL:
            f = q.txq
            q.txq = f.next
            if f.req != NULL:
                fail(E, f.req, err, p.rank)
            if f.owns_payload:
                free(f.payload)
            free(f)
        q.txq_tail = NULL
        if q.rx_req != NULL:
            fail(E, q.rx_req, err, p.rank)
            q.rx_req = NULL


cdef chan_ops_t TCP_OPS = chan_ops_t(
    name=b"tcp", remote=True, polled_fd=True, chunked=False, overtake=True, post=NULL, put=NULL,
    flush=tcp_flush, poll=NULL, on_event=tcp_on_event, arm=NULL, pull=NULL, push=NULL, disarm=NULL,
    beat=tcp_beat, beat_lockfree=False, heard=tcp_heard, memory=tcp_memory, unsent=tcp_unsent,
    release=tcp_release)
