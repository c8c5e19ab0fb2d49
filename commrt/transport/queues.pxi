# Queues and matching.  Every function here runs with the engine lock held.
#
# Matching follows MPI: a message matches the first posted receive (in post
# order) whose (context, source, tag) accept it; a receive matches the first
# unexpected message (in arrival order) it accepts.  Arrival order per peer is
# send order, so messages between one pair with the same tag match in the
# order sent.

cdef inline bint accepts(req_t *r, uint32_t ctx, int src, int tag) noexcept nogil:
    return r.ctx == ctx and (r.peer < 0 or r.peer == src) and (r.tag < 0 or r.tag == tag)


cdef inline void dlist_push(req_t **head, req_t *r) noexcept nogil:
    # push at the tail of a circular-free doubly linked list kept by head only
    cdef req_t *t = head[0]
    r.next = NULL
    if t == NULL:
        r.prev = NULL
        head[0] = r
        return
    while t.next != NULL:
        t = t.next
    t.next = r
    r.prev = t


cdef inline void dlist_remove(req_t **head, req_t *r) noexcept nogil:
    if r.prev != NULL:
        r.prev.next = r.next
    else:
        head[0] = r.next
    if r.next != NULL:
        r.next.prev = r.prev
    r.next = NULL
    r.prev = NULL


cdef inline void posted_append(eng_t *E, req_t *r) noexcept nogil:
    r.next = NULL
    r.prev = E.posted_tail
    if E.posted_tail != NULL:
        E.posted_tail.next = r
    else:
        E.posted_head = r
    E.posted_tail = r


cdef inline void posted_remove(eng_t *E, req_t *r) noexcept nogil:
    if r.prev != NULL:
        r.prev.next = r.next
    else:
        E.posted_head = r.next
    if r.next != NULL:
        r.next.prev = r.prev
    else:
        E.posted_tail = r.prev
    r.next = NULL
    r.prev = NULL


cdef inline req_t *match_posted(eng_t *E, uint32_t ctx, int src, int tag) noexcept nogil:
    cdef req_t *r = E.posted_head
    while r != NULL:
        if accepts(r, ctx, src, tag):
            posted_remove(E, r)
            return r
        r = r.next
    return NULL


cdef inline void unexp_append(eng_t *E, umsg_t *u) noexcept nogil:
    cdef peer_t *p = &E.peers[u.src]
    u.next = NULL
    u.prev = E.unexp_tail
    if E.unexp_tail != NULL:
        E.unexp_tail.next = u
    else:
        E.unexp_head = u
    E.unexp_tail = u
    u.pnext = NULL
    u.pprev = p.unexp_tail
    if p.unexp_tail != NULL:
        p.unexp_tail.pnext = u
    else:
        p.unexp_head = u
    p.unexp_tail = u
    E.unexp_count += 1
    if E.unexp_bytes > E.unexp_peak:
        E.unexp_peak = E.unexp_bytes


cdef inline void unexp_remove(eng_t *E, umsg_t *u) noexcept nogil:
    cdef peer_t *p = &E.peers[u.src]
    if u.prev != NULL:
        u.prev.next = u.next
    else:
        E.unexp_head = u.next
    if u.next != NULL:
        u.next.prev = u.prev
    else:
        E.unexp_tail = u.prev
    u.next = NULL
    u.prev = NULL
    if u.pprev != NULL:
        u.pprev.pnext = u.pnext
    else:
        p.unexp_head = u.pnext
    if u.pnext != NULL:
        u.pnext.pprev = u.pprev
    else:
        p.unexp_tail = u.pprev
    u.pnext = NULL
    u.pprev = NULL
    E.unexp_count -= 1


cdef inline umsg_t *match_unexpected(eng_t *E, req_t *r) noexcept nogil:
    """The first unexpected message, in arrival order, that r accepts.  A receive
    from one peer looks at that peer's messages only: a rank whose peers run ahead
    (a gather's root) may hold thousands of other peers' messages, and one list of
    all of them made every receive walk past those (a gather at N=4 cost the root
    O(backlog): 22 µs a call after 2000 calls)."""
    cdef umsg_t *u
    if r.peer >= 0:
        u = E.peers[r.peer].unexp_head
        while u != NULL:
            if accepts(r, u.h.ctx, u.src, u.h.tag):
                unexp_remove(E, u)
                return u
            u = u.pnext
        return NULL
    u = E.unexp_head
    while u != NULL:
        if accepts(r, u.h.ctx, u.src, u.h.tag):
            unexp_remove(E, u)
            return u
        u = u.next
    return NULL


# Unexpected messages live in one block each (the umsg_t, then the payload),
# from a pool of free blocks by size, in POOL_UNIT steps up to POOL_BUCKETS
# units.  Whatever thread (caller, progress thread, heartbeat thread) takes a
# message in, its block comes from the pool first: malloc's per-thread arenas
# would otherwise each keep their own high-water mark of a flood, several
# times the flow-control bound.  The pool keeps at most E.credit_bytes; the
# heartbeat thread empties it (and trims malloc) once a flood has drained.

cdef inline uint64_t block_bytes(uint64_t n) noexcept nogil:
    return (n + POOL_UNIT - 1) // POOL_UNIT * POOL_UNIT


cdef void *pool_get(eng_t *E, uint64_t n) noexcept nogil:
    cdef uint64_t b = block_bytes(n) // POOL_UNIT
    cdef pblock_t *blk
    if b < POOL_BUCKETS and E.pool[b] != NULL:
        blk = E.pool[b]
        E.pool[b] = blk.next
        E.pool_bytes -= b * POOL_UNIT
        return <void *>blk
    return malloc(block_bytes(n))


cdef void pool_put(eng_t *E, void *mem, uint64_t n) noexcept nogil:
    cdef uint64_t b = block_bytes(n) // POOL_UNIT
    cdef pblock_t *blk = <pblock_t *>mem
    if b < POOL_BUCKETS and E.pool_bytes + b * POOL_UNIT <= E.credit_bytes:
        blk.next = E.pool[b]
        E.pool[b] = blk
        E.pool_bytes += b * POOL_UNIT
    else:
        free(mem)


cdef void pool_drain(eng_t *E) noexcept nogil:
    cdef pblock_t *blk
    for b in range(POOL_BUCKETS):
        while E.pool[b] != NULL:
            blk = E.pool[b]
            E.pool[b] = blk.next
            free(blk)
    E.pool_bytes = 0


cdef inline void free_umsg(eng_t *E, umsg_t *u) noexcept nogil:
    if u.data != NULL:
        E.unexp_bytes -= u.h.nbytes
    pool_put(E, u, u.block)


cdef umsg_t *new_umsg(eng_t *E, hdr_t *h, int src, bint with_data) noexcept nogil:
    """A held message (NULL: no memory).  Callers bound h.nbytes (charge: at most
    the credit); the check here keeps the block's size from wrapping whatever
    a caller forgets."""
    if with_data and h.nbytes > (<uint64_t>1 << 48):
        return NULL
    cdef uint64_t n = sizeof(umsg_t) + (h.nbytes if with_data else 0)
    cdef umsg_t *u = <umsg_t *>pool_get(E, n)
    if u == NULL:
        return NULL
    memset(u, 0, sizeof(umsg_t))
    memcpy(&u.h, h, sizeof(hdr_t))
    u.src = src
    u.block = n
    if with_data and h.nbytes > 0:
        u.data = (<char *>u) + sizeof(umsg_t)
        E.unexp_bytes += h.nbytes
    return u


cdef inline req_t *find_by_id(req_t *head, uint64_t rid) noexcept nogil:
    while head != NULL:
        if head.id == rid:
            return head
        head = head.next
    return NULL


cdef inline bint span_fits(uint64_t off, uint64_t n, uint64_t size) noexcept nogil:
    """[off, off + n) lies within [0, size): both numbers come off the wire, so their
    sum is never formed (it may wrap around and pass a plain off + n <= size)."""
    return n <= size and off <= size - n


cdef void complete(eng_t *E, req_t *r, int err) noexcept nogil:
    """Finish a request: success when err is E_NONE.  Wakes sleepers."""
    if r.state >= S_DONE:
        return
    r.err = err
    r.state = S_ERROR if err else S_DONE
    if not r.persistent:                # a chain's requests live as long as the chain
        r.done_next = E.done_head
        E.done_head = r
    E.outstanding -= 1
    if E.sleepers > 0:
        pthread_cond_broadcast(&E.done_cond)
    if E.epoller and E.epoller_is_waiter:
        # the waiting thread sleeps in epoll_wait without the lock: wake it
        kick(E)


cdef inline void fail(eng_t *E, req_t *r, int err, int rank) noexcept nogil:
    r.err_rank = rank
    complete(E, r, err)


cdef inline void set_status(req_t *r, hdr_t *h) noexcept nogil:
    r.st_src = h.src
    r.st_tag = h.tag
    r.nbytes = h.nbytes
    r.meta = h.meta
    r.meta2 = h.meta2


cdef inline bint combine_ok(req_t *r, hdr_t *h) noexcept nogil:
    """A reduce-receive takes only the message it expects: its fingerprint, its size.
    Anything else completes it with buf untouched (the caller reads the status)."""
    return h.meta == r.want_meta and h.meta2 == r.want_meta2 and h.nbytes == r.cap


cdef void deliver(eng_t *E, req_t *r, hdr_t *h, const char *payload) noexcept nogil:
    """Complete receive r with an eager message whose payload is in memory."""
    set_status(r, h)
    if r.hook != NULL:
        if combine_ok(r, h) and h.nbytes:
            r.hook(r.buf, payload, <int64_t>(h.nbytes // r.itemsize))
        complete(E, r, E_NONE)
        return
    if h.nbytes > r.cap:
        r.err_a = h.nbytes
        fail(E, r, E_TRUNC, h.src)
        return
    if h.nbytes:
        memcpy(r.buf, payload, h.nbytes)
    complete(E, r, E_NONE)


cdef poison_t *find_poison(eng_t *E, uint32_t ctx) noexcept nogil:
    cdef int i
    for i in range(MAX_POISON):
        if E.poison[i].used and E.poison[i].ctx == ctx:
            return &E.poison[i]
    return NULL


cdef inline bint poisoned(eng_t *E, uint32_t ctx) noexcept nogil:
    # No context ever poisoned (the common case): skip the table, whose 32 slots
    # sit on as many cache lines (~200 instructions per posted receive).
    return E.n_poison != 0 and find_poison(E, ctx) != NULL


cdef void poison_ctx(eng_t *E, uint32_t ctx, const char *reason, int from_rank, int code,
                     int culprit, int origin) noexcept nogil:
    """Mark ctx aborted (the first abort wins: its code, culprit, origin and reason
    stay); fail every receive posted on it, and the sends waiting on from_rank
    to match them (from_rank has aborted too: it never will).  Sends that have
    been matched are left to finish; new ones fail at post (post_send)."""
    cdef int i = E.poison_next
    cdef req_t *r
    cdef req_t *nxt
    if not poisoned(E, ctx):
        E.poison[i].used = True
        E.poison[i].ctx = ctx
        E.poison[i].code = code
        E.poison[i].culprit = culprit
        E.poison[i].origin = origin
        strncpy(E.poison[i].reason, reason, 255)
        E.poison[i].reason[255] = 0
        E.poison_next = (i + 1) % MAX_POISON
        E.n_poison += 1
    r = E.posted_head
    while r != NULL:
        nxt = r.next
        if r.ctx == ctx:
            posted_remove(E, r)
            fail(E, r, E_ABORTED, from_rank)
        r = nxt
    if from_rank >= 0 and from_rank < E.size:
        fail_waiting(E, &E.peers[from_rank].await_head, ctx, from_rank)
    if from_rank != E.rank:                 # sends to oneself waiting for their receive
        fail_waiting(E, &E.peers[E.rank].await_head, ctx, from_rank)


cdef void fail_waiting(eng_t *E, req_t **head, uint32_t ctx, int rank) noexcept nogil:
    """Fail the sends of list head on context ctx (it was aborted)."""
    cdef req_t *r = head[0]
    cdef req_t *nxt
    while r != NULL:
        nxt = r.next
        if r.ctx == ctx:
            dlist_remove(head, r)
            r.held = False
            fail(E, r, E_ABORTED, rank)
        r = nxt
