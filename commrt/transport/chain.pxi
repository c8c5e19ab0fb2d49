# Persistent exchange chains: MPI's persistent requests, chained.
#
# A collective that repeats the same pairwise exchanges call after call (the
# small all-reduce's recursive doubling, the dissemination barrier) binds
# them once: peers, context, tag, the receive buffer, and a request pair per
# step.  A run then allocates no Python object and parses no buffer (the
# in/out buffer only when it is another object than last time): in one call
# without the GIL it posts each step's receive, then its send, waits for the
# receive and then for the send if it is still in flight (spin, then sleep:
# block()), checks the receive, and calls the step's completion hook, before
# going on to the next step.
#
# The hook is any C function f(dst, src, n) the caller supplies by address:
# called once the step's receive has completed and its send has been handed
# off, with dst = the in/out buffer, src = the receive buffer, n = the count
# given at set-up.  The transport does not know what it computes.
#
# A run stops at the first step that is not clean: receive or send not done
# within `wait`, a failed request, a meta or size other than expected.  That step's two requests are then detached: they become
# ordinary Requests (on the engine's live set, keeping their buffers) that
# the caller takes with handover() and waits, tests and reports as it would
# any other; the chain makes fresh ones for the step.  So whatever happens,
# no request of the chain is left posted when run() returns.
#
# Requests of a chain are marked persistent: completing them does not put
# them on the engine's completion list (they are reused, never swept).
#
# Ranged steps (a large all-reduce's halving and doubling) instead send a
# byte range of the in/out buffer and receive into another range of it,
# as a reduce-receive (the transport combines as the data lands, see
# req_t.hook) when the step has an rhook.  Each step's send has completed
# before the next step posts, so a later step may receive into a range an
# earlier one sent from.  A chain of only ranged steps needs no tmp.

cdef enum:
    CH_DONE = 0         # every step clean
    CH_STOP = 1         # step *at is not clean
    CH_SLICE = 2        # step *at is still waiting: check for signals, then wait on


cdef struct step_t:
    int dst
    int src
    combine_fn hook     # after the step: hook(in/out, tmp, count) (whole-buffer steps)
    req_t *rq
    req_t *sq
    bint ranged         # send in/out[s_off, +s_len), receive into in/out[r_off, +r_len)
    uint64_t s_off
    uint64_t s_len
    uint64_t r_off
    uint64_t r_len
    combine_fn rhook    # ranged: the receive combines with this loop (NULL: copies)


cdef inline void reset_req(req_t *r, uint64_t meta, uint64_t meta2) noexcept nogil:
    r.state = S_NEW
    r.err = E_NONE
    r.err_rank = -1
    r.err_a = 0
    r.meta = meta
    r.meta2 = meta2
    r.moved = 0
    r.st_src = -1
    r.st_tag = -1
    r.next = NULL
    r.prev = NULL
    r.done_next = NULL
    r.nbytes = r.cap if r.kind == K_SEND else 0


cdef int chain_go(eng_t *E, step_t *steps, int *at, int last, uint64_t meta, uint64_t meta2,
                  uint64_t nbytes,
                  int64_t count, int64_t wait_ns, int64_t *deadline, bint posted) noexcept nogil:
    """Run steps *at .. last-1 (the first already posted if `posted`)."""
    cdef int i = at[0]
    cdef step_t *s
    cdef req_t *rq
    cdef req_t *sq
    cdef int64_t slice_end
    while i < last:
        s = &steps[i]
        rq = s.rq
        sq = s.sq
        if not posted:
            reset_req(rq, 0, 0)
            rq.want_meta = meta
            rq.want_meta2 = meta2
            reset_req(sq, meta, meta2)
            pthread_mutex_lock(&E.lock)
            post_recv(E, rq)
            post_send(E, sq)
            pthread_mutex_unlock(&E.lock)
            deadline[0] = now_ns() + wait_ns
        posted = False
        slice_end = now_ns() + 200000000        # check for signals (Ctrl-C) every 200 ms
        if slice_end > deadline[0]:
            slice_end = deadline[0]
        if not block(E, rq, slice_end, True) or (sq.state < S_DONE
                                                  and not block(E, sq, slice_end, True)):
            at[0] = i
            return CH_SLICE if now_ns() < deadline[0] else CH_STOP
        if rq.state != S_DONE or sq.state != S_DONE or rq.meta != meta or rq.meta2 != meta2 \
                or rq.nbytes != (s.r_len if s.ranged else nbytes):
            at[0] = i
            return CH_STOP
        if s.hook != NULL:
            s.hook(sq.buf, rq.buf, count)
        i += 1
    at[0] = i
    return CH_DONE


cdef class ExchangeChain:
    """Pairwise exchanges bound once and run many times (Engine.exchange_chain).

    run(buf, meta, wait, first=0, last=None, meta2=0) -> int: runs steps first..last-1
    on buf (C-contiguous, writable, the bound size) and returns `last` when
    every step was clean, the index of the step it stopped at otherwise (its
    requests then wait in handover()), or -1, having done nothing, when buf
    does not fit.  Lifetime: the chain holds views of the receive buffer and
    of the last in/out buffer; detached requests keep their own buffer
    objects alive."""
    cdef Engine eng
    cdef int n
    cdef step_t *steps
    cdef list reqs              # the Request objects whose req_t the steps use (recv, send)
    cdef object tmp
    cdef Py_buffer tmp_view
    cdef bint has_tmp
    cdef object bound           # the in/out buffer object buf_view describes
    cdef Py_buffer buf_view
    cdef bint has_buf
    cdef uint64_t nbytes
    cdef int64_t count
    cdef uint32_t ctx
    cdef int tag
    cdef object rank_of
    cdef object detached        # (recv, send) Requests of the step the last run stopped at
    cdef uint32_t itemsize      # element size of the reduce-receives of ranged steps

    def __dealloc__(self):
        if self.has_buf:
            PyBuffer_Release(&self.buf_view)
            self.has_buf = False
        if self.has_tmp:
            PyBuffer_Release(&self.tmp_view)
            self.has_tmp = False
        if self.steps != NULL:
            free(self.steps)
            self.steps = NULL

    @property
    def nsteps(self):
        return self.n

    @property
    def nbytes(self):
        return self.nbytes

    cdef Request _request(self, int kind, int peer, char *buf, uint64_t cap):
        cdef Request q = Request.__new__(Request)
        q.eng = self.eng
        q.rank_of = self.rank_of
        q.r.kind = kind
        q.r.peer = peer
        q.r.ctx = self.ctx
        q.r.tag = self.tag
        q.r.err_rank = -1
        q.r.buf = buf
        q.r.cap = cap
        q.r.persistent = True
        q.r.pyobj = <void *>q
        return q

    cdef void _fresh(self, int i):
        cdef step_t *s = &self.steps[i]
        cdef char *base = <char *>self.buf_view.buf if self.has_buf else NULL
        cdef Request rq
        cdef Request sq
        if s.ranged:
            rq = self._request(K_RECV, s.src, base + s.r_off if base else NULL, s.r_len)
            rq.r.hook = s.rhook
            rq.r.itemsize = self.itemsize
            sq = self._request(K_SEND, s.dst, base + s.s_off if base else NULL, s.s_len)
        else:
            rq = self._request(K_RECV, s.src, <char *>self.tmp_view.buf, self.nbytes)
            sq = self._request(K_SEND, s.dst, base, self.nbytes)
        self.reqs[2 * i] = rq
        self.reqs[2 * i + 1] = sq
        self.steps[i].rq = &rq.r
        self.steps[i].sq = &sq.r

    cdef int _bind(self, object buf) except -1:
        """Describe buf as the in/out buffer: 1, or 0 when it does not fit."""
        cdef Py_buffer v
        try:
            PyObject_GetBuffer(buf, &v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
        except (BufferError, ValueError, TypeError):
            return 0
        if <uint64_t>v.len != self.nbytes:
            PyBuffer_Release(&v)
            return 0
        if self.has_buf:
            PyBuffer_Release(&self.buf_view)
        self.buf_view = v
        self.has_buf = True
        self.bound = buf
        for i in range(self.n):
            if self.steps[i].ranged:
                self.steps[i].sq.buf = <char *>v.buf + self.steps[i].s_off
                self.steps[i].rq.buf = <char *>v.buf + self.steps[i].r_off
            else:
                self.steps[i].sq.buf = <char *>v.buf
        return 1

    cdef void _detach(self, int i):
        """Step i stopped: its requests become ordinary ones, handed over."""
        cdef Request rq = <Request>self.reqs[2 * i]
        cdef Request sq = <Request>self.reqs[2 * i + 1]
        cdef eng_t *E = self.eng.E
        with nogil:
            pthread_mutex_lock(&E.lock)
            rq.r.persistent = False
            sq.r.persistent = False
            pthread_mutex_unlock(&E.lock)
        rq.keep = self.bound if self.steps[i].ranged else self.tmp
        sq.keep = self.bound
        if rq.r.state < S_DONE:
            self.eng.live.add(rq)
        if sq.r.state < S_DONE:
            self.eng.live.add(sq)
        self.detached = (rq, sq)
        self._fresh(i)

    def run(self, buf, uint64_t meta, double wait, int first=0, last=None, uint64_t meta2=0):
        cdef eng_t *E = self.eng.E
        cdef int stop = self.n if last is None else min(<int>last, self.n)
        cdef int at = first
        cdef int rc
        cdef int64_t deadline = 0
        cdef int64_t wait_ns = <int64_t>(wait * 1e9)
        cdef bint posted = False
        if buf is not self.bound and not self._bind(buf):
            return -1
        if E == NULL or E.closed:
            raise _errors().CommError("the communicator is closed")
        self.detached = None
        if at >= stop:
            return stop
        while True:
            with nogil:
                rc = chain_go(E, self.steps, &at, stop, meta, meta2, self.nbytes, self.count, wait_ns,
                              &deadline, posted)
            if rc == CH_DONE:
                return stop
            if rc == CH_STOP:
                self._detach(at)
                return at
            try:
                PyErr_CheckSignals()
            except BaseException:
                self._detach(at)
                raise
            posted = True

    def release(self):
        """Forget the in/out buffer last run on (a large one should not stay alive
        because a chain once saw it); the next run binds its buffer again.  Safe
        after any run: run() never leaves a request of the chain posted, and
        requests it handed over keep their own reference."""
        if not self.has_buf:
            return
        PyBuffer_Release(&self.buf_view)
        self.has_buf = False
        self.bound = None
        for i in range(self.n):
            self.steps[i].sq.buf = NULL
            if self.steps[i].ranged:
                self.steps[i].rq.buf = NULL

    def handover(self):
        """(recv, send) Requests of the step the last run stopped at (once), else None."""
        out, self.detached = self.detached, None
        return out


cdef ExchangeChain make_chain(Engine eng, steps, tmp, int64_t count, uint32_t ctx, int tag,
                              rank_of, int64_t nbytes, int itemsize):
    cdef ExchangeChain ch = ExchangeChain.__new__(ExchangeChain)
    cdef int i
    cdef step_t *s
    steps = [tuple(st) for st in steps]
    if eng.E == NULL or eng.E.closed:
        raise _errors().CommError("the communicator is closed")
    if tag < 0:
        raise ValueError(f"tag must be >= 0, got {tag}")
    for st in steps:
        if len(st) not in (3, 7):
            raise ValueError(f"a chain step is (dst, src, hook) or (dst, src, s_off, s_len, "
                             f"r_off, r_len, rhook), got {st!r}")
        eng._check_rank(st[0], "dst")
        eng._check_rank(st[1], "src")
    ch.eng = eng
    ch.ctx = ctx
    ch.tag = tag
    ch.rank_of = rank_of
    ch.count = count
    ch.tmp = tmp
    if tmp is not None:
        try:
            PyObject_GetBuffer(tmp, &ch.tmp_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
        except (BufferError, ValueError) as exc:
            raise ValueError(_buffer_problem(tmp, True, exc)) from None
        ch.has_tmp = True
        ch.nbytes = <uint64_t>ch.tmp_view.len
    elif nbytes < 0 or any(len(st) == 3 for st in steps):
        raise ValueError("a chain without tmp has only ranged steps and needs nbytes")
    if nbytes >= 0:
        ch.nbytes = <uint64_t>nbytes
    ch.itemsize = itemsize
    ch.n = len(steps)
    ch.steps = <step_t *>calloc(max(ch.n, 1), sizeof(step_t))
    if ch.steps == NULL:
        raise MemoryError()
    ch.reqs = [None] * (2 * ch.n)
    for i, st in enumerate(steps):
        s = &ch.steps[i]
        s.dst = st[0]
        s.src = st[1]
        if len(st) == 3:
            s.hook = <combine_fn><size_t>st[2]
        else:
            _check_range(st[2], st[3], ch.nbytes, itemsize)
            _check_range(st[4], st[5], ch.nbytes, itemsize)
            if st[6] and not combinable_size(itemsize):
                raise ValueError(f"reduce-receive steps need an element size dividing 64, "
                                 f"got {itemsize}")
            s.ranged = True
            s.s_off, s.s_len, s.r_off, s.r_len = st[2], st[3], st[4], st[5]
            s.rhook = <combine_fn><size_t>st[6]
        ch._fresh(i)
    return ch


cdef int _check_range(object off, object length, uint64_t nbytes, int itemsize) except -1:
    if off < 0 or length < 0 or off + length > nbytes or (
            itemsize > 0 and (off % itemsize or length % itemsize)):
        raise ValueError(f"chain step range [{off}, {off + length}) does not fit a "
                         f"{nbytes}-byte buffer of {itemsize}-byte elements")
    return 0
