# Persistent exchange chains: MPI's persistent requests, chained.
#
# A collective that repeats the same steps call after call (the prepared
# plans of collectives/plans.py: recursive doubling, the barrier, a
# broadcast's tree, a gather's receives, ...) binds them once: peers,
# context, tag (a message may name its own: dbtree's two trees), buffers,
# and one request per message.  A run then allocates no Python object and
# parses no buffer (the in/out buffers only when they
# are other objects than last time): in one C call (the GIL let go after a
# short spin, GIL_SPIN_NS), step after
# step, it posts every message of the step (its sends, then its receives,
# each in the order given), waits for all of them (spin, then sleep: block()), checks every
# receive, and calls the step's completion hook, before going on.
#
# A message sends, receives or locally copies a byte range of one of three
# buffers (a copy: from another range, done as its step is posted: before
# the step's messages where it touches one of them -- an all-gather's own
# block that it then sends, a reduce-scatter's start that it combines into
# -- else right after posting them, so that a large copy overlaps the
# peers' side of the transfers -- a gather's or scatter's own block): the
# in/out buffer (B_BUF, bound at each run, writable), the input buffer (B_IN,
# bound at each run, only sent from: a gather's or all-to-all's source) and
# tmp (B_TMP, bound at set-up: scratch).  A receive may combine as the data
# lands (a reduce-receive, req_t.hook) with its rhook.  A step has any number
# of messages, sends only (a broadcast's root) or receives only (its leaves)
# included.  Each step's sends have completed before the next step posts, so
# a later step may receive into a range an earlier one sent from.
#
# The hook is any C function f(dst, src, n) the caller supplies by address:
# called once every message of the step is done, with dst = the in/out
# buffer, src = tmp, n = the count given at set-up.  The transport does not
# know what it computes.
#
# A run stops at the first step that is not clean: a message not done within
# `wait`, a failed request, a meta or size other than expected.  That step's
# requests are then detached: they become ordinary Requests (on the engine's
# live set, keeping their buffers) that the caller takes with handover() and
# waits, tests and reports as it would any other; the chain makes fresh ones
# for the step.  So whatever happens, no request of the chain is left posted
# when run() returns.
#
# Requests of a chain are marked persistent: completing them does not put
# them on the engine's completion list (they are reused, never swept).

cdef enum:
    CH_DONE = 0         # every step clean
    CH_STOP = 1         # step *at is not clean
    CH_SLICE = 2        # step *at is still waiting: check for signals, then wait on

cdef enum:
    SLICE_NS = 200000000    # check for signals (Ctrl-C) every 200 ms
    # A run first spins this long per step holding the GIL, then lets go of it:
    # letting go and taking it back costs ~0.2 us, a fifth of an 8-byte
    # exchange, and most small steps are answered within it.  Another Python
    # thread waits at most this long per step (its switch interval is 5 ms).
    # Not when ranks outnumber cores: their steps wait for the scheduler.
    GIL_SPIN_NS = 5000

cdef enum:
    M_RECV = 0
    M_SEND = 1
    M_COPY = 2          # a local copy (no request): done when the step is posted

cdef enum:
    B_BUF = 0           # the in/out buffer of a run
    B_IN = 1            # the input buffer of a run (sent from only)
    B_TMP = 2           # scratch bound at set-up


cdef struct msg_t:
    int kind            # M_RECV, M_SEND, M_COPY
    int peer
    int where           # B_BUF, B_IN or B_TMP
    uint64_t off
    uint64_t len
    combine_fn rhook    # a receive that combines with this loop (NULL: copies)
    int src_where       # M_COPY: from [src_off, +len) of this buffer
    uint64_t src_off
    int copier          # M_RECV: which process copies a large shm message (req_t.copier)
    int tag             # the message's tag (the chain's unless the message names one)
    req_t *q            # NULL for a copy


cdef struct step_t:
    int first           # index of its first message
    int nmsg
    combine_fn hook     # after the step: hook(in/out, tmp, count)
    int64_t spin_ns     # where ranks outnumber cores: this step's spin budget (0: the
                        # engine's minimum; learned by block(), see there)


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
    r.slot = 0
    r.split_at = 0


cdef uint64_t answer_piece = 262144     # a late copy's pieces while a sender waits (0: none)


def _set_answer_piece(uint64_t piece):
    """copy_answering's piece (0: one copy, no progress passes); to measure one
    against the other.  The old piece."""
    global answer_piece
    old = answer_piece
    answer_piece = piece
    return old


cdef inline bint spans_meet(const char *a, uint64_t alen, const char *b, uint64_t blen) noexcept nogil:
    return alen and blen and a < b + blen and b < a + alen


cdef bint copy_first(step_t *s, msg_t *msgs, char **bases, int c) noexcept nogil:
    """Whether copy c must be done before the step's messages are posted: it
    writes what a send of the step sends or a receive of the step fills, or
    reads what a receive fills (compared in memory: the in/out and input
    buffers may be one)."""
    cdef char *dst = bases[msgs[c].where] + msgs[c].off
    cdef char *src = bases[msgs[c].src_where] + msgs[c].src_off
    cdef uint64_t n = msgs[c].len
    cdef char *at
    cdef int j
    for j in range(s.first, s.first + s.nmsg):
        if msgs[j].kind == M_COPY:
            continue
        at = bases[msgs[j].where] + msgs[j].off
        if spans_meet(dst, n, at, msgs[j].len):
            return True
        if msgs[j].kind == M_RECV and spans_meet(src, n, at, msgs[j].len):
            return True
    return False


cdef inline void post_step(eng_t *E, step_t *s, msg_t *msgs, char **bases, uint64_t meta,
                           uint64_t meta2) noexcept nogil:
    """Post a step's messages.  Its local copies are done after posting where
    they touch none of the step's messages (a gather's or scatter's own
    block, an all-to-all's): a large copy then overlaps the peers' transfers
    (a receiver pulling a scatter's block, a sender's RTS answered) instead
    of holding them back; else before, as the schedule orders them."""
    cdef int j
    cdef int late = 0
    cdef req_t *q
    for j in range(s.first, s.first + s.nmsg):
        q = msgs[j].q
        if msgs[j].kind == M_COPY:
            if msgs[j].len:
                if copy_first(s, msgs, bases, j):
                    move_bytes(bases[msgs[j].where] + msgs[j].off,
                               bases[msgs[j].src_where] + msgs[j].src_off, msgs[j].len)
                else:
                    late += 1
        elif msgs[j].kind == M_SEND:
            reset_req(q, meta, meta2)
        else:
            reset_req(q, 0, 0)
            q.want_meta = meta
            q.want_meta2 = meta2
    # sends first: a receive that matches an RTS already here reads the whole
    # message (process_vm_readv) inside post_recv, and a peer waiting for this
    # rank's RTS meanwhile would read its own only afterwards -- in a symmetric
    # exchange the two reads then run one after the other (an all-to-all of
    # 16 MiB at N = 2 took 1.3 or 2.6 ms, depending on who posted first).
    # Matching is unchanged: nothing arrives while a step posts (no progress
    # pass), and each kind keeps its order.
    pthread_mutex_lock(&E.lock)
    for j in range(s.first, s.first + s.nmsg):
        if msgs[j].kind == M_SEND:
            post_send(E, msgs[j].q)
    for j in range(s.first, s.first + s.nmsg):
        if msgs[j].kind == M_RECV:
            post_recv(E, msgs[j].q)
    pthread_mutex_unlock(&E.lock)
    if late:
        for j in range(s.first, s.first + s.nmsg):
            if msgs[j].kind == M_COPY and msgs[j].len and not copy_first(s, msgs, bases, j):
                late_copy(E, s, msgs, bases[msgs[j].where] + msgs[j].off,
                          bases[msgs[j].src_where] + msgs[j].src_off, msgs[j].len)


cdef enum:
    MAX_ANSWERED = 64       # receives a copy answers (more: the first 64 of them)


cdef int writers_of(req_t **rs, req_t *q, int nr) noexcept nogil:
    """Add q to rs[:nr] if it is a receive its sender writes (COPIER_SENDER) that
    is still unmatched: its sender waits for this rank's answer to its RTS.
    The new nr."""
    if (nr < MAX_ANSWERED and q.kind == K_RECV and q.copier == COPIER_SENDER
            and q.state == S_PENDING):
        rs[nr] = q
        return nr + 1
    return nr


cdef inline bint any_unmatched(req_t **rs, int nr) noexcept nogil:
    cdef int i
    for i in range(nr):
        if rs[i].state == S_PENDING:
            return True
    return False


# A copy that answers RTSs between its pieces.  Nothing moves while this rank
# copies, so a sender whose RTS arrives just after the receives were posted
# would wait for the whole copy before this rank tells it to write: a gather's
# root at N = 2 copied its own 8 MiB block and only then let its sender write
# the other (16 MiB in 0.85-1.0 ms, OpenMPI's root reading it in 0.82-0.89).
# So while one of rs (writers_of) is unmatched, the copy goes in answer_piece
# pieces with a progress pass after each; overlapping ranges: one memmove.
cdef void copy_answering(eng_t *E, char *dst, const char *src, uint64_t n,
                         req_t **rs, int nr) noexcept nogil:
    cdef uint64_t k = 0
    cdef uint64_t piece = answer_piece
    if dst + n > src and src + n > dst:
        move_bytes(dst, src, n)
        return
    while piece and n - k > 2 * piece and any_unmatched(rs, nr):
        copy_bytes(dst + k, src + k, piece)
        k += piece
        pthread_mutex_lock(&E.lock)
        progress(E, False)
        pthread_mutex_unlock(&E.lock)
    copy_bytes(dst + k, src + k, n - k)


cdef void late_copy(eng_t *E, step_t *s, msg_t *msgs, char *dst, const char *src,
                    uint64_t n) noexcept nogil:
    """A step's copy made after posting its messages (post_step), answering the
    step's writing senders meanwhile (copy_answering)."""
    cdef req_t *rs[MAX_ANSWERED]
    cdef int nr = 0
    cdef int j
    for j in range(s.first, s.first + s.nmsg):
        if msgs[j].kind == M_RECV:
            nr = writers_of(rs, msgs[j].q, nr)
    copy_answering(E, dst, src, n, rs, nr)


def copy_answering_recvs(Engine eng, dst, src, reqs):
    """copy_into(dst, src) for the general path of a collective, which posted
    reqs (its receives) before copying its own block, answering their writing
    senders meanwhile (copy_answering)."""
    cdef eng_t *E = eng._live()
    cdef req_t *rs[MAX_ANSWERED]
    cdef int nr = 0
    cdef Request q
    cdef Py_buffer d
    cdef Py_buffer sv
    cdef uint64_t n
    for x in reqs:
        q = <Request?>x
        nr = writers_of(rs, &q.r, nr)
    if nr == 0 or answer_piece == 0:
        copy_into(dst, src)
        return
    n = get_copy_pair(dst, src, &d, &sv)
    try:
        with nogil:
            copy_answering(E, <char *>d.buf, <const char *>sv.buf, n, rs, nr)
    finally:
        PyBuffer_Release(&sv)
        PyBuffer_Release(&d)
    eng._sweep()


cdef inline bint step_clean(step_t *s, msg_t *msgs, uint64_t meta, uint64_t meta2) noexcept nogil:
    cdef int j
    cdef req_t *q
    for j in range(s.first, s.first + s.nmsg):
        q = msgs[j].q
        if q == NULL:
            continue
        if q.state != S_DONE:
            return False
        if msgs[j].kind == M_RECV and (q.meta != meta or q.meta2 != meta2 or q.nbytes != msgs[j].len):
            return False
    return True


cdef int chain_go(eng_t *E, step_t *steps, msg_t *msgs, int *at, int last, uint64_t meta,
                  uint64_t meta2, int64_t count, char **bases, int64_t wait_ns,
                  int64_t *deadline, bint posted, int64_t slice_ns, bint spin) noexcept nogil:
    """Run steps *at .. last-1 (the first already posted if `posted`), waiting at
    most slice_ns per step before returning CH_SLICE; spin False: every wait
    sleeps after one progress pass (block's spin=False)."""
    cdef int i = at[0]
    cdef int j
    cdef step_t *s
    cdef int64_t slice_end
    cdef int64_t t
    while i < last:
        s = &steps[i]
        t = now_ns()
        if not posted:
            post_step(E, s, msgs, bases, meta, meta2)
            deadline[0] = t + wait_ns
        posted = False
        slice_end = t + slice_ns
        if slice_end > deadline[0]:
            slice_end = deadline[0]
        for j in range(s.first, s.first + s.nmsg):
            if msgs[j].q != NULL and msgs[j].q.state < S_DONE and \
                    not block(E, msgs[j].q, slice_end, spin, slice_ns > GIL_SPIN_NS,
                              &s.spin_ns if E.oversub else NULL):
                at[0] = i
                return CH_SLICE if now_ns() < deadline[0] else CH_STOP
        if not step_clean(s, msgs, meta, meta2):
            at[0] = i
            return CH_STOP
        if s.hook != NULL:
            s.hook(bases[B_BUF], bases[B_TMP], count)
        i += 1
    at[0] = i
    return CH_DONE


@cython.no_gc_clear       # its Py_buffers, as Request's (_core.pyx)
cdef class ExchangeChain:
    """Steps of messages bound once and run many times (Engine.exchange_chain).

    go(buf, seq, inbuf=None) -> int: the whole run with the meta, meta2 and wait
    bound by stamp(base, meta2, wait, seq_mask) (meta = base | seq & seq_mask).

    run(buf, meta, wait, first=0, last=None, meta2=0, inbuf=None) -> int: runs
    steps first..last-1 on buf (C-contiguous, writable, the bound size) and
    inbuf (C-contiguous, in_nbytes; only where a message sends from B_IN) and
    returns `last` when every step was clean, the index of the step it
    stopped at otherwise (its requests then wait in handover()), or -1,
    having done nothing, when a buffer does not fit.  Lifetime: the chain
    holds views of tmp and of the last buffers it ran on (release() lets go);
    detached requests keep their own buffer objects alive."""
    cdef Engine eng
    cdef int n
    cdef int nmsgs
    cdef step_t *steps
    cdef msg_t *msgs
    cdef list reqs              # the Request object of each message (its req_t)
    cdef object tmp
    cdef Py_buffer tmp_view
    cdef bint has_tmp
    cdef object bound           # the in/out buffer object buf_view describes
    cdef Py_buffer buf_view
    cdef bint has_buf
    cdef object bound_in        # the input buffer object in_view describes
    cdef Py_buffer in_view
    cdef bint has_in
    cdef bint uses_in
    cdef bint uses_buf
    cdef uint64_t nbytes
    cdef uint64_t in_nbytes
    cdef int64_t count
    cdef uint32_t ctx
    cdef int tag
    cdef object rank_of
    cdef object detached        # the Requests of the step the last run stopped at
    cdef uint32_t itemsize      # element size of the reduce-receives
    cdef char *cbase[3]         # _base() of each buffer, kept by _rebase (read by every run)
    cdef bint stamped           # what go() sends (stamp())
    cdef uint64_t st_base
    cdef uint64_t st_meta2
    cdef uint64_t st_mask
    cdef int64_t st_wait_ns
    # Whether a run's waits spin before they sleep (True, as set up).  False for
    # a chain that a helper thread runs beside its caller's computation (the
    # Horovod coordinator's): its waits sleep after one progress pass and the
    # first, GIL-held pass is skipped, so the waiting thread takes neither the
    # core nor the GIL from the computation.  Read at each run: the helper may
    # turn it back on while its caller waits for the result.
    cdef public bint spin

    def __dealloc__(self):
        if self.has_buf:
            PyBuffer_Release(&self.buf_view)
            self.has_buf = False
        if self.has_in:
            PyBuffer_Release(&self.in_view)
            self.has_in = False
        if self.has_tmp:
            PyBuffer_Release(&self.tmp_view)
            self.has_tmp = False
        if self.steps != NULL:
            free(self.steps)
            self.steps = NULL
        if self.msgs != NULL:
            free(self.msgs)
            self.msgs = NULL

    @property
    def nsteps(self):
        return self.n

    @property
    def spin_budgets_us(self):
        """Each step's learned spin budget in µs where ranks outnumber cores (0:
        none learned, the engine's minimum; block() in engine.pxi)."""
        return [self.steps[i].spin_ns / 1000.0 for i in range(self.n)]

    @property
    def nbytes(self):
        return self.nbytes

    cdef char *_base(self, int where) noexcept:
        if where == B_TMP:
            return <char *>self.tmp_view.buf if self.has_tmp else NULL
        if where == B_IN:
            return <char *>self.in_view.buf if self.has_in else NULL
        return <char *>self.buf_view.buf if self.has_buf else NULL

    cdef void _fresh(self, int k):
        """A new request for message k (its old one was detached, or none yet)."""
        cdef msg_t *m = &self.msgs[k]
        cdef char *base = self._base(m.where)
        cdef Request q
        if m.kind == M_COPY:
            m.q = NULL
            return
        q = Request.__new__(Request)
        q.eng = self.eng
        q.rank_of = self.rank_of
        q.r.kind = K_SEND if m.kind == M_SEND else K_RECV
        q.r.peer = m.peer
        q.r.ctx = self.ctx
        q.r.tag = m.tag
        q.r.err_rank = -1
        q.r.buf = base + m.off if base != NULL else NULL
        q.r.cap = m.len
        q.r.persistent = True
        q.r.pyobj = <void *>q
        if m.kind == M_RECV:
            q.r.hook = m.rhook
            q.r.itemsize = self.itemsize
            q.r.copier = m.copier
        self.reqs[k] = q
        m.q = &q.r

    cdef void _rebase(self, int where):
        cdef char *base = self._base(where)
        cdef int k
        self.cbase[where] = base
        for k in range(self.nmsgs):
            if self.msgs[k].where == where and self.msgs[k].q != NULL:
                self.msgs[k].q.buf = base + self.msgs[k].off if base != NULL else NULL

    cdef int _bind(self, object buf, bint inbuf) except -1:
        """Describe buf as the in/out (or input) buffer: 1, or 0 when it does not fit."""
        cdef Py_buffer v
        cdef int flags = PyBUF_C_CONTIGUOUS if inbuf else PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE
        try:
            PyObject_GetBuffer(buf, &v, flags)
        except (BufferError, ValueError, TypeError):
            return 0
        if <uint64_t>v.len != (self.in_nbytes if inbuf else self.nbytes):
            PyBuffer_Release(&v)
            return 0
        if inbuf:
            if self.has_in:
                PyBuffer_Release(&self.in_view)
            self.in_view = v
            self.has_in = True
            self.bound_in = buf
            self._rebase(B_IN)
        else:
            if self.has_buf:
                PyBuffer_Release(&self.buf_view)
            self.buf_view = v
            self.has_buf = True
            self.bound = buf
            self._rebase(B_BUF)
        return 1

    cdef void _detach(self, int i):
        """Step i stopped: its requests become ordinary ones, handed over."""
        cdef step_t *s = &self.steps[i]
        cdef eng_t *E = self.eng.E
        cdef Request q
        cdef int k
        out = []
        with nogil:
            pthread_mutex_lock(&E.lock)
            for k in range(s.first, s.first + s.nmsg):
                if self.msgs[k].q != NULL:
                    self.msgs[k].q.persistent = False
            pthread_mutex_unlock(&E.lock)
        for k in range(s.first, s.first + s.nmsg):
            if self.msgs[k].kind == M_COPY:
                continue
            q = <Request>self.reqs[k]
            where = self.msgs[k].where
            q.keep = self.tmp if where == B_TMP else (self.bound_in if where == B_IN
                                                      else self.bound)
            if q.r.state < S_DONE:
                self.eng.live.add(q)
            elif q.r.lent:                  # a lost peer might still write into it (shm.pxi)
                self.eng.lent.append(q)
            out.append(q)
            self._fresh(k)
        self.detached = out

    def stamp(self, uint64_t base, uint64_t meta2, double wait, uint64_t seq_mask):
        """Bind what go() sends: meta = base | (seq & seq_mask), meta2, and wait."""
        self.st_base = base
        self.st_meta2 = meta2
        self.st_mask = seq_mask
        self.st_wait_ns = <int64_t>(wait * 1e9)
        self.stamped = True

    def go(self, buf, uint64_t seq, inbuf=None):
        """run(buf, base | (seq & seq_mask), wait, 0, None, meta2, inbuf) with what
        stamp() bound: a repeated call passes only what changes (its Python
        arguments and the 64-bit meta built in Python were a tenth of an 8-byte
        planned call)."""
        if not self.stamped:
            raise ValueError("go() needs stamp() first")
        return self._run(buf, self.st_base | (seq & self.st_mask), self.st_wait_ns, 0, self.n,
                         self.st_meta2, inbuf)

    @property
    def c_go(self):
        """go() as a C function, for compiled callers (collectives/_entry.pyx): a
        capsule named "commrt.chain_go" holding
        int go(object chain, object buf, uint64_t seq, object inbuf) except? -2,
        which returns what go() returns (a chain of another type: its go())."""
        return _CHAIN_GO

    def run(self, buf, uint64_t meta, double wait, int first=0, last=None, uint64_t meta2=0,
            inbuf=None):
        cdef int stop = self.n if last is None else min(<int>last, self.n)
        return self._run(buf, meta, <int64_t>(wait * 1e9), first, stop, meta2, inbuf)

    cdef object _run(self, buf, uint64_t meta, int64_t wait_ns, int first, int stop,
                     uint64_t meta2, inbuf):
        cdef eng_t *E = self.eng.E
        cdef int at = first
        cdef int rc
        cdef int64_t deadline = 0
        cdef bint posted = False
        cdef char **bases = self.cbase
        cdef bint spin
        if self.uses_buf and buf is not self.bound and not self._bind(buf, False):
            return -1
        if self.uses_in and inbuf is not self.bound_in and not self._bind(inbuf, True):
            return -1
        if E == NULL or E.closed:
            raise _errors().CommError("the communicator is closed")
        self.detached = None
        if at >= stop:
            return stop
        spin = self.spin
        if not E.oversub and spin:
            rc = chain_go(E, self.steps, self.msgs, &at, stop, meta, meta2, self.count,
                          bases, wait_ns, &deadline, posted, GIL_SPIN_NS, True)
            if rc == CH_DONE:
                return stop
            if rc == CH_STOP:
                self._detach(at)
                return at
            posted = True
        while True:
            with nogil:
                rc = chain_go(E, self.steps, self.msgs, &at, stop, meta, meta2, self.count,
                              bases, wait_ns, &deadline, posted, SLICE_NS, spin)
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
        """Forget the buffers last run on (a large one should not stay alive because
        a chain once saw it); the next run binds its buffers again.  Safe after
        any run: run() never leaves a request of the chain posted, and requests
        it handed over keep their own reference."""
        if self.has_buf:
            PyBuffer_Release(&self.buf_view)
            self.has_buf = False
            self.bound = None
            self._rebase(B_BUF)
        if self.has_in:
            PyBuffer_Release(&self.in_view)
            self.has_in = False
            self.bound_in = None
            self._rebase(B_IN)

    def handover(self):
        """The Requests of the step the last run stopped at, one per message in the
        step's order (once), else None."""
        out, self.detached = self.detached, None
        return out


cdef int chain_go_entry(object chain, object buf, uint64_t seq, object inbuf) except? -2:
    """ExchangeChain.go as a C call (its capsule: ExchangeChain.c_go): the whole
    planned call from compiled code, with no Python call level around it."""
    cdef ExchangeChain ch
    if type(chain) is not ExchangeChain:
        return chain.go(buf, seq, inbuf)
    ch = <ExchangeChain>chain
    if not ch.stamped:
        raise ValueError("go() needs stamp() first")
    return ch._run(buf, ch.st_base | (seq & ch.st_mask), ch.st_wait_ns, 0, ch.n, ch.st_meta2,
                   inbuf)


_CHAIN_GO = PyCapsule_New(<void *>chain_go_entry, b"commrt.chain_go", NULL)


cdef list _chain_messages(steps):
    """Every step as ([(kind, peer, where, off, len, rhook, src_where, src_off, copier, tag)],
    hook); tag -1: the chain's."""
    out = []
    for st in steps:
        if len(st) == 3:                    # (dst, src, hook): tmp in, the in/out buffer out
            out.append(([(M_RECV, st[1], B_TMP, 0, -1, 0, 0, 0, 0, -1),
                         (M_SEND, st[0], B_BUF, 0, -2, 0, 0, 0, 0, -1)], st[2]))
        elif len(st) == 7:                  # ranged: (dst, src, s_off, s_len, r_off, r_len, rhook)
            out.append(([(M_RECV, st[1], B_BUF, st[4], st[5], st[6], 0, 0, 0, -1),
                         (M_SEND, st[0], B_BUF, st[2], st[3], 0, 0, 0, 0, -1)], 0))
        elif len(st) == 2 and isinstance(st[0], (list, tuple)):
            out.append(([tuple(m) + (0, 0, 0, -1)[len(m) - 6:] if len(m) >= 6 else tuple(m)
                         for m in st[0]], st[1]))
        else:
            raise ValueError(f"a chain step is (dst, src, hook), (dst, src, s_off, s_len, r_off, "
                             f"r_len, rhook) or ([(kind, peer, where, off, len, rhook[, src_where, "
                             f"src_off[, copier[, tag]]])...], hook), "
                             f"got {st!r}")
    return out


cdef ExchangeChain make_chain(Engine eng, steps, tmp, int64_t count, uint32_t ctx, int tag,
                              rank_of, int64_t nbytes, int itemsize, int64_t in_nbytes=-1):
    cdef ExchangeChain ch = ExchangeChain.__new__(ExchangeChain)
    cdef int i
    cdef int k = 0
    cdef msg_t *m
    cdef uint64_t tmp_len = 0
    ch.spin = True
    size_copies()                       # its copy steps copy without the GIL
    if eng.E == NULL or eng.E.closed:
        raise _errors().CommError("the communicator is closed")
    if tag < 0:
        raise ValueError(f"tag must be >= 0, got {tag}")
    parsed = _chain_messages(steps)
    uses_buf = False
    for msgs, hook in parsed:
        uses_buf = uses_buf or bool(hook)
        for msg in msgs:
            if len(msg) != 10 or msg[0] not in (M_RECV, M_SEND, M_COPY) \
                    or msg[2] not in (B_BUF, B_IN, B_TMP) or msg[6] not in (B_BUF, B_IN, B_TMP) \
                    or msg[8] not in COPIERS \
                    or (msg[8] and msg[0] != M_RECV) or msg[9] < -1:
                raise ValueError(f"a chain message is (kind 0 recv/1 send/2 copy, peer, where "
                                 f"0/1/2, off, len, rhook[, src_where, src_off[, copier 0-3 "
                                 f"(recv only)[, tag (-1: the chain's)]]]), got {msg!r}")
            if msg[0] != M_COPY:
                eng._check_rank(msg[1], "dst" if msg[0] == M_SEND else "src")
            if msg[2] == B_IN and msg[0] != M_SEND:
                raise ValueError("a chain writes into the in/out buffer or tmp, never the input")
            if (msg[2] == B_TMP or (msg[0] == M_COPY and msg[6] == B_TMP)) and tmp is None:
                raise ValueError("a chain message in tmp needs tmp")
            uses_buf = uses_buf or msg[2] == B_BUF or (msg[0] == M_COPY and msg[6] == B_BUF)
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
        ch.cbase[B_TMP] = <char *>ch.tmp_view.buf
        tmp_len = <uint64_t>ch.tmp_view.len
        ch.nbytes = tmp_len
    elif nbytes < 0:
        raise ValueError("a chain without tmp needs nbytes")
    if nbytes >= 0:
        ch.nbytes = <uint64_t>nbytes
    ch.in_nbytes = <uint64_t>in_nbytes if in_nbytes >= 0 else 0
    ch.itemsize = itemsize
    ch.uses_buf = uses_buf
    ch.n = len(parsed)
    ch.nmsgs = sum(len(msgs) for msgs, _ in parsed)
    ch.steps = <step_t *>calloc(max(ch.n, 1), sizeof(step_t))
    ch.msgs = <msg_t *>calloc(max(ch.nmsgs, 1), sizeof(msg_t))
    if ch.steps == NULL or ch.msgs == NULL:
        raise MemoryError()
    ch.reqs = [None] * ch.nmsgs
    for i, (msgs, hook) in enumerate(parsed):
        ch.steps[i].first = k
        ch.steps[i].nmsg = len(msgs)
        ch.steps[i].hook = <combine_fn><size_t>hook
        for kind, peer, where, off, length, rhook, src_where, src_off, copier, mtag in msgs:
            if length == -1:                # the legacy whole-buffer step's sizes
                length = tmp_len
            elif length == -2:
                length = ch.nbytes
            sizes = (ch.nbytes, ch.in_nbytes, tmp_len)
            _check_range(off, length, sizes[where], itemsize if rhook else 0)
            if kind == M_COPY:
                _check_range(src_off, length, sizes[src_where], 0)
            if rhook and not combinable_size(itemsize):
                raise ValueError(f"reduce-receive steps need an element size dividing 64, "
                                 f"got {itemsize}")
            m = &ch.msgs[k]
            m.kind = kind
            m.peer = peer
            m.where = where
            m.off = off
            m.len = length
            m.src_where = src_where
            m.src_off = src_off
            m.copier = copier
            m.tag = tag if mtag < 0 else mtag
            m.rhook = NULL
            if kind == M_RECV:
                m.rhook = <combine_fn><size_t>rhook
            if where == B_IN or (kind == M_COPY and src_where == B_IN):
                ch.uses_in = True
            ch._fresh(k)
            k += 1
    return ch


cdef int _check_range(object off, object length, uint64_t nbytes, int itemsize) except -1:
    if off < 0 or length < 0 or off + length > nbytes or (
            itemsize > 0 and (off % itemsize or length % itemsize)):
        raise ValueError(f"chain step range [{off}, {off + length}) does not fit a "
                         f"{nbytes}-byte buffer of {itemsize}-byte elements")
    return 0
