# The compiled entry of the collectives: the public functions' planned path in C.
#
# A prepared plan (collectives/_small.py, plans.py) makes a small collective one
# chain run (ExchangeChain.go, transport/chain.pxi): ~1 us at 8 B.  What was left
# around it was the public function's Python: the thread rule, the plan lookup,
# the sequence number and the call history, ~1.3-1.5 us of CPU per call at N=4
# (docs/performance-collectives.md, seventh session), more than the chain
# itself.  Here that is C: the per-communicator fields the entry reads and
# writes are C fields of State (CommState's base class), a plan's of PlanCore
# (the plans' base class), and the chain is called through its C entry point
# (ExchangeChain.c_go, a capsule the channel's chains carry: the collectives
# still know nothing of the transport's layout, DESIGN.md rule 1).  So a
# planned call from Python is argument unpacking plus one C function.
#
# Everything unusual goes to the general path in Python, unchanged: the
# functions bind() is given (the first call of a kind or of a named algorithm,
# a call with timeout= or async_op=, a nested or queued call, a poisoned
# communicator)
# and the plans' own finish() (a step that is not clean: mismatch, dead peer,
# timeout, a buffer that does not fit).  The thread rule is state.entry's: no
# Python call runs between reading State.inside and setting it, and here no
# Python code at all.
#
# NumPy is not imported here (a barrier needs none): the array type comes in
# through set_ndarray() once commrt loads NumPy.
from cpython.object cimport Py_EQ, PyObject_RichCompareBool
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.long cimport PyLong_AsSsize_t
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.list cimport PyList_AsTuple, PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int64_t, uint64_t

# An array's shape and dtype read from its struct (NumPy's inline accessors: no
# NumPy API table, so nothing imports NumPy here): buf.shape builds a tuple
# per call and the memos only compare.  Only on objects of type _ndarray.
cdef extern from *:
    """
    #define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
    #include <numpy/ndarraytypes.h>
    #define commrt_ndim(a) PyArray_NDIM((PyArrayObject *)(a))
    #define commrt_dims(a) PyArray_DIMS((PyArrayObject *)(a))
    #define commrt_descr(a) ((PyObject *)PyArray_DESCR((PyArrayObject *)(a)))
    """
    int commrt_ndim(object a)
    Py_ssize_t *commrt_dims(object a)
    PyObject *commrt_descr(object a)

from commrt.collectives.ops import SUM

ctypedef int (*go_fn)(object, object, uint64_t, object) except? -2

cdef go_fn _go = NULL


class _NoArrays:
    """Stands for np.ndarray until NumPy is loaded: nothing is an instance."""


cdef object _ndarray = _NoArrays

# the Python side, bound once by commrt.collectives (bind())
cdef object _state_of = None
cdef object _concurrent = None
cdef object _all_reduce_general = None      # _all_reduce(comm, buf, op, algo, timeout, async_op, key)
cdef object _all_reduce_rest = None         # _small.finish_go(comm, st, buf, plan, seq, i)
cdef object _plans_run = None               # plans.run(comm, st, plan, out, inbuf)
cdef object _plans_finish = None            # plans.finish(comm, st, plan, seq, i, out, inbuf)
cdef object _barrier_general = None
cdef object _barrier_rest = None            # _small.finish_barrier(comm, st, plan, seq, i)
cdef object _general = None                 # {kind: the general path's function}

# plan modes (PlanCore.mode)
SMALL, SCHED, RANGED = 0, 1, 2
cdef enum:
    M_SMALL = 0
    M_SCHED = 1
    M_RANGED = 2

# memo slots of the kinds that go through planned()
cdef enum:
    K_BROADCAST = 0
    K_REDUCE = 1
    K_GATHER = 2
    K_SCATTER = 3
    K_ALL_GATHER = 4
    K_REDUCE_SCATTER = 5
    K_ALL_TO_ALL = 6
    K_ALL_GATHERV = 7
    K_GATHERV = 8
    K_SCATTERV = 9
    K_ALL_TO_ALLV = 10
    NKINDS = 11


def bind(*, state_of, concurrent, all_reduce, all_reduce_rest, plans_run, plans_finish,
         barrier, barrier_rest, general):
    """Bind the Python side: the general paths and the plans' finishing functions."""
    global _state_of, _concurrent, _all_reduce_general, _all_reduce_rest, _plans_run
    global _plans_finish, _barrier_general, _barrier_rest, _general
    _state_of, _concurrent = state_of, concurrent
    _all_reduce_general, _all_reduce_rest = all_reduce, all_reduce_rest
    _plans_run, _plans_finish = plans_run, plans_finish
    _barrier_general, _barrier_rest = barrier, barrier_rest
    _general = dict(general)


def set_ndarray(t):
    """NumPy's array type, once NumPy is loaded (the fast paths compare with it)."""
    global _ndarray
    _ndarray = t


DEF HISTORY = 256


cdef class History:
    """(seq, meta, meta2) of a communicator's last 256 calls, oldest first (a
    plan's: its base, the seq not in), as a deque(maxlen=256) of tuples reads:
    append, pop, clear, extend, len, iteration both ways.  Kept in C arrays so
    that a planned call records itself with three stores, where a tuple in a
    deque cost two allocations and two frees a call (~20 ns of a 0.4 us
    barrier)."""
    cdef int64_t seqs[HISTORY]
    cdef uint64_t metas[HISTORY]
    cdef uint64_t metas2[HISTORY]
    cdef int head                   # the slot the next entry goes to
    cdef int n

    cdef inline void push(self, int64_t seq, uint64_t meta, uint64_t meta2) noexcept:
        self.seqs[self.head] = seq
        self.metas[self.head] = meta
        self.metas2[self.head] = meta2
        self.head = (self.head + 1) % HISTORY
        if self.n < HISTORY:
            self.n += 1

    cdef tuple _at(self, int k):
        """The k-th entry, oldest first."""
        cdef int i = (self.head - self.n + k) % HISTORY
        if i < 0:
            i += HISTORY
        return (self.seqs[i], self.metas[i], self.metas2[i])

    def append(self, entry):
        seq, meta, meta2 = entry
        self.push(seq, meta, meta2)

    def extend(self, entries):
        for e in entries:
            self.append(e)

    def pop(self):
        """Remove and return the newest entry."""
        if self.n == 0:
            raise IndexError("pop from an empty history")
        e = self._at(self.n - 1)
        self.head = (self.head - 1) % HISTORY
        if self.head < 0:
            self.head += HISTORY
        self.n -= 1
        return e

    def clear(self):
        self.n = 0

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter([self._at(k) for k in range(self.n)])

    def __reversed__(self):
        return iter([self._at(k) for k in range(self.n - 1, -1, -1)])


cdef class State:
    """The C fields of a communicator's collectives state (state.CommState adds
    the rest): the thread inside (its ident, 0: none), the next sequence number,
    the async calls pending, the poison, the recent calls' history, the plans
    (small: key -> plan), and the memos of the plan each kind ran last."""
    cdef public unsigned long inside
    cdef public int64_t seq
    cdef public Py_ssize_t pending
    cdef public object poisoned
    cdef public dict small
    cdef public object last_all_reduce
    cdef public object last_named_all_reduce    # (the memo of calls that name one)
    cdef History _history
    cdef list memos             # per kind of _planned: its Memo, or None

    def __cinit__(self, *args, **kwargs):
        self.memos = [None] * NKINDS

    @property
    def history(self):
        """(seq, meta, meta2) of recent calls, a plan's with its base (the seq not in)."""
        return self._history

    @history.setter
    def history(self, History h):
        self._history = h

    def forget_memos(self):
        """Drop the memos (a plan left the cache: set_spin must reach every plan run)."""
        self.memos[:] = [None] * NKINDS
        self.last_all_reduce = self.last_named_all_reduce = None


cdef class PlanCore:
    """The fields of a prepared plan the entry reads: its chain and what go()
    returns on a clean run (nsteps), the history entry (base, meta2), whether a
    clean run is the whole call (plain), the barrier's buffer (tmp), and the
    all-reduce's memo (the op object, algorithm name, shape and dtype it last
    matched)."""
    cdef public object chain
    cdef public uint64_t base
    cdef public uint64_t meta2
    cdef public int nsteps
    cdef public bint plain
    cdef public int mode
    cdef public object tmp
    cdef public object dtype
    cdef public object memo_op
    cdef public object memo_algo
    cdef public object memo_shape


cdef inline bint _like(object arr, object shape, object dtype) except -1:
    """Whether the array has this shape (a tuple) and this dtype object."""
    cdef int nd = commrt_ndim(arr)
    cdef Py_ssize_t *dims
    cdef int k
    if <object>commrt_descr(arr) is not dtype or PyTuple_GET_SIZE(shape) != nd:
        return False
    dims = commrt_dims(arr)
    for k in range(nd):
        if PyLong_AsSsize_t(<object>PyTuple_GET_ITEM(shape, k)) != dims[k]:
            return False
    return True


cdef class Memo:
    """What a kind's last planned call was called with, and its plan."""
    cdef object plan
    cdef object root
    cdef object op
    cdef object algo                # the name the call gave (None: the cost model's)
    cdef object ashape, adtype      # the first array's
    cdef object bshape, bdtype      # the second's (None, None: none)
    cdef object cnt, cnt2           # a variable-size kind's counts (tuples of ints, or None)


# counts that are not a list or tuple of Python ints (the general path checks them,
# and converts NumPy ints: _counts_key)
cdef object _NOT_INTS = object()


cdef object _counts_tuple(object counts):
    """counts as the plan key holds them: a tuple of Python ints, None for None,
    else _NOT_INTS."""
    cdef Py_ssize_t k
    if counts is None:
        return None
    if type(counts) is list:
        t = PyList_AsTuple(counts)
    elif type(counts) is tuple:
        t = counts
    else:
        return _NOT_INTS
    for k in range(PyTuple_GET_SIZE(t)):
        if type(<object>PyTuple_GET_ITEM(t, k)) is not int:
            return _NOT_INTS
    return t


cdef inline bint _same_counts(object counts, object memo) except -1:
    """Whether counts (as a call passes them) are the memo's (_counts_tuple's
    form), without building a tuple: a list or tuple of the same ints."""
    cdef Py_ssize_t n, k
    cdef object c
    cdef bint is_list
    if memo is None:
        return counts is None
    if counts is memo:
        return True
    n = PyTuple_GET_SIZE(memo)
    is_list = type(counts) is list
    if is_list:
        if PyList_GET_SIZE(counts) != n:
            return False
    elif type(counts) is not tuple or PyTuple_GET_SIZE(counts) != n:
        return False
    for k in range(n):
        c = <object>(PyList_GET_ITEM(counts, k) if is_list else PyTuple_GET_ITEM(counts, k))
        # ints only: 2.0 == 2, and float counts must reach the checks (TypeError)
        if type(c) is not int or not PyObject_RichCompareBool(
                c, <object>PyTuple_GET_ITEM(memo, k), Py_EQ):
            return False
    return True


cdef inline int _run_chain(object chain, object buf, uint64_t seq, object inbuf) except? -2:
    global _go
    if _go == NULL:
        _go = <go_fn>PyCapsule_GetPointer(chain.c_go, b"commrt.chain_go")
    return _go(chain, buf, seq, inbuf)


cdef inline State _state(object comm):
    # The attribute state.state_of sets on a Communicator: one lookup, where
    # comm.state.get("collectives") took three (a view of a communicator has no
    # such attribute and takes them).
    try:
        s = comm._coll_state
    except AttributeError:
        s = None
    if s is None:
        s = comm.state.get("collectives")
        if s is None:
            return None
    return <State?>s


cdef object _all_reduce_plan(State st, object buf, object op, object algorithm):
    """The all-reduce plan for this call, or None.  The plan run last (for the cost
    model's choice, or for a named algorithm: its own memo) if this call is like
    it: the same op object, dtype object, shape and name (hashing the key tuple,
    a dtype's hash computed afresh each time, costs more than comparing)."""
    p = st.last_all_reduce if algorithm is None else st.last_named_all_reduce
    if p is not None and (<PlanCore>p).memo_op is op and (<PlanCore>p).memo_algo is algorithm \
            and _like(buf, (<PlanCore>p).memo_shape, (<PlanCore>p).dtype):
        return p
    shape = buf.shape
    key = (shape, buf.dtype, op) if algorithm is None else (shape, buf.dtype, op, algorithm)
    try:
        p = st.small.get(key)
    except TypeError:                       # an unhashable op: the general path names it
        return None
    if p is not None:
        if algorithm is None:
            st.last_all_reduce = p
        else:
            st.last_named_all_reduce = p
        (<PlanCore?>p).memo_op = op
        (<PlanCore>p).memo_algo = algorithm
        (<PlanCore>p).memo_shape = shape
    return p


def all_reduce(comm, buf, op=SUM, algorithm=None, timeout=None, async_op=False):
    """Combine every rank's buf element-wise with op; every rank gets the result in buf."""
    cdef State st = _state(comm)
    cdef PlanCore plan
    cdef unsigned long tid = PyThread_get_thread_ident()
    cdef unsigned long inside
    cdef int64_t seq
    cdef int i
    if st is None:
        st = <State?>_state_of(comm)
    inside = st.inside
    if inside:
        if inside != tid:
            raise _concurrent(comm, st, "all_reduce", tid, inside)
        return _all_reduce_general(comm, buf, op, algorithm, timeout, async_op, None)
    st.inside = tid
    try:
        key = None
        if type(buf) is _ndarray and _named(algorithm) and timeout is None and not async_op \
                and not st.pending and st.poisoned is None:
            p = _all_reduce_plan(st, buf, op, algorithm)
            if p is not None:
                plan = <PlanCore>p
                if plan.mode == M_SCHED:    # not a power of two (plans.py)
                    if _plans_run(comm, st, plan, buf, None):
                        return buf
                else:
                    seq = st.seq
                    st.seq = seq + 1
                    st._history.push(seq, plan.base, plan.meta2)    # (readers OR the seq in)
                    i = -2
                    if plan.plain:          # fused, nothing to do after: one C call
                        i = _run_chain(plan.chain, buf, <uint64_t>seq, None)
                        if i == plan.nsteps:
                            return buf
                    if _all_reduce_rest(comm, st, buf, plan, seq, i) is not None:
                        return buf
            if algorithm is None:           # the key it may prepare under (a named call's
                key = (buf.shape, buf.dtype, op)    # the general path makes itself)
                try:
                    hash(key)
                except TypeError:           # an unhashable op: the general path names it
                    key = None
        return _all_reduce_general(comm, buf, op, algorithm, timeout, async_op, key)
    finally:
        st.inside = 0


def barrier(comm, *, timeout=None, async_op=False):
    """Return once every rank has entered the barrier."""
    cdef State st = _state(comm)
    cdef PlanCore plan
    cdef int64_t seq
    cdef int i
    if st is not None and not st.inside and not st.pending and st.poisoned is None \
            and timeout is None and not async_op:
        st.inside = PyThread_get_thread_ident()
        try:
            p = st.small.get("barrier")
            if p is not None:
                plan = <PlanCore?>p
                seq = st.seq
                st.seq = seq + 1
                st._history.push(seq, plan.base, plan.meta2)
                i = _run_chain(plan.chain, plan.tmp, <uint64_t>seq, None)
                if i != plan.nsteps:
                    _barrier_rest(comm, st, plan, seq, i)
                return None
        finally:
            st.inside = 0
    return _barrier_general(comm, timeout=timeout, async_op=async_op)


cdef int _planned(object comm, int kind, object name, object algo, object root, object op,
                  object a, object b, bint two, object out, object inbuf, int ncounts=0,
                  object counts=None, object counts2=None) except -1:
    """Run the call along its prepared plan if it has one and may take it now: 1
    when done, 0 having done nothing (the caller takes the general path, which
    enforces the thread rule and names any error).  A thread already inside (a
    nested call) takes the general path.  The plan key (plans.prepare's:
    (name, root, a.shape, a.dtype[, b.shape, b.dtype]), b None: None, None;
    name: (name, op) where op is given; a call that names its algorithm: the
    name last, as the general path's _plan_key; a variable-size kind's
    (ncounts 1 or 2) then its counts, as tuples of ints) is built only when
    the call is not like the kind's last planned one (its Memo: the same
    algorithm, root, op object, shapes, dtype objects and counts)."""
    cdef State st = _state(comm)
    cdef PlanCore plan
    cdef Memo m
    cdef int64_t seq
    cdef int i
    if st is None or st.inside or st.pending or st.poisoned is not None:
        return 0
    st.inside = PyThread_get_thread_ident()
    try:
        mo = st.memos[kind]
        if mo is not None and (<Memo>mo).op is op and (<Memo>mo).algo is algo \
                and _like(a, (<Memo>mo).ashape, (<Memo>mo).adtype) \
                and PyObject_RichCompareBool((<Memo>mo).root, root, Py_EQ) \
                and (not two or ((<Memo>mo).bshape is None if b is None
                                 else (<Memo>mo).bshape is not None
                                 and _like(b, (<Memo>mo).bshape, (<Memo>mo).bdtype))) \
                and (ncounts == 0 or _same_counts(counts, (<Memo>mo).cnt)
                     and (ncounts == 1 or _same_counts(counts2, (<Memo>mo).cnt2))):
            plan = <PlanCore>(<Memo>mo).plan
        else:
            m = Memo.__new__(Memo)
            m.root, m.op, m.algo, m.ashape, m.adtype = root, op, algo, a.shape, a.dtype
            if ncounts:
                m.cnt = _counts_tuple(counts)
                m.cnt2 = _counts_tuple(counts2) if ncounts == 2 else None
                if m.cnt is _NOT_INTS or m.cnt2 is _NOT_INTS:
                    return 0
            if kind == K_REDUCE or kind == K_REDUCE_SCATTER:
                name = (name, op)
            if not two:
                key = (name, root, m.ashape, m.adtype)
            elif b is None:
                key = (name, root, m.ashape, m.adtype, None, None)
            else:
                m.bshape, m.bdtype = b.shape, b.dtype
                key = (name, root, m.ashape, m.adtype, m.bshape, m.bdtype)
            if algo is not None:
                key = key + (algo,)
            if ncounts == 1:
                key = key + (m.cnt,)
            elif ncounts == 2:
                key = key + (m.cnt, m.cnt2)
            try:
                p = st.small.get(key)
            except TypeError:               # an unhashable op: the general path names it
                return 0
            if p is None:
                return 0
            plan = <PlanCore?>p
            m.plan = plan
            st.memos[kind] = m
        seq = st.seq
        st.seq = seq + 1
        st._history.push(seq, plan.base, plan.meta2)
        i = _run_chain(plan.chain, out, <uint64_t>seq, inbuf)
        if i == plan.nsteps and plan.plain:
            return 1
        return 1 if _plans_finish(comm, st, plan, seq, i, out, inbuf) else 0
    finally:
        st.inside = 0


cdef inline bint _named(object algorithm):
    """Whether a call's algorithm= may take a plan: none (the cost model's) or a
    name (a plan of its own, keyed with the name; anything else the general
    path names)."""
    return algorithm is None or type(algorithm) is str


def broadcast(comm, buf, root=0, *, algorithm=None, timeout=None, async_op=False):
    """Copy root's buf into every rank's buf."""
    if type(buf) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int \
            and _planned(comm, K_BROADCAST, "broadcast", algorithm, root, None, buf, None,
                         False, buf, None):
        return buf
    return _general["broadcast"](comm, buf, root, algorithm=algorithm, timeout=timeout,
                                 async_op=async_op)


def reduce(comm, buf, root=0, op=SUM, *, algorithm=None, timeout=None, async_op=False):
    """Combine every rank's buf element-wise with op; the result replaces root's buf
    (other ranks' buffers are left unchanged)."""
    cdef bint at_root
    if type(buf) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int:
        at_root = comm.rank == root
        if _planned(comm, K_REDUCE, "reduce", algorithm, root, op, buf, None, False,
                    buf if at_root else None, None if at_root else buf):
            return buf
    return _general["reduce"](comm, buf, root, op, algorithm=algorithm, timeout=timeout,
                              async_op=async_op)


def all_gather(comm, out, buf, *, algorithm=None, timeout=None, async_op=False):
    """out (size·len(buf) elements) receives every rank's buf in rank order."""
    if type(out) is _ndarray and type(buf) is _ndarray and _named(algorithm) \
            and timeout is None and not async_op and _planned(
                comm, K_ALL_GATHER, "all_gather", algorithm, 0, None, out, buf, True, out, buf):
        return out
    return _general["all_gather"](comm, out, buf, algorithm=algorithm, timeout=timeout,
                                  async_op=async_op)


def gather(comm, buf, out=None, root=0, *, algorithm=None, timeout=None, async_op=False):
    """Root's out (size·len(buf) elements) receives every rank's buf in rank order."""
    if type(buf) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int:
        mine = out if comm.rank == root else None
        if (mine is None or type(mine) is _ndarray) \
                and _planned(comm, K_GATHER, "gather", algorithm, root, None, buf, mine, True,
                             mine, buf):
            return mine
    return _general["gather"](comm, buf, out, root, algorithm=algorithm, timeout=timeout,
                              async_op=async_op)


def scatter(comm, out, buf=None, root=0, *, algorithm=None, timeout=None, async_op=False):
    """Rank i's out receives block i of root's buf (size·len(out) elements)."""
    if type(out) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int:
        mine = buf if comm.rank == root else None
        if (mine is None or type(mine) is _ndarray) \
                and _planned(comm, K_SCATTER, "scatter", algorithm, root, None, out, mine, True,
                             out, mine):
            return out
    return _general["scatter"](comm, out, buf, root, algorithm=algorithm, timeout=timeout,
                               async_op=async_op)


def reduce_scatter(comm, out, buf, op=SUM, *, algorithm=None, timeout=None, async_op=False):
    """buf holds size·len(out) elements; rank i's out gets block i reduced over all ranks."""
    if type(out) is _ndarray and type(buf) is _ndarray and _named(algorithm) \
            and timeout is None and not async_op and _planned(
                comm, K_REDUCE_SCATTER, "reduce_scatter", algorithm, 0, op, out, buf, True, out,
                buf):
        return out
    return _general["reduce_scatter"](comm, out, buf, op, algorithm=algorithm, timeout=timeout,
                                      async_op=async_op)


def all_to_all(comm, out, buf, *, algorithm=None, timeout=None, async_op=False):
    """Block j of rank i's buf lands in block i of rank j's out (size blocks each)."""
    if type(out) is _ndarray and type(buf) is _ndarray and _named(algorithm) \
            and timeout is None and not async_op and _planned(
                comm, K_ALL_TO_ALL, "all_to_all", algorithm, 0, None, out, buf, True, out, buf):
        return out
    return _general["all_to_all"](comm, out, buf, algorithm=algorithm, timeout=timeout,
                                  async_op=async_op)


# The variable-size collectives: their plan keys hold their counts (as
# __init__._counts_key gives them: tuples of Python ints); counts of another
# form, or none at a root, take the general path, which checks them.
def all_gatherv(comm, out, buf, counts, *, algorithm=None, timeout=None, async_op=False):
    """out (sum(counts) elements) receives every rank's buf in rank order; rank q's
    buf holds counts[q] elements (counts: the same list on every rank)."""
    if type(out) is _ndarray and type(buf) is _ndarray and _named(algorithm) \
            and timeout is None and not async_op and _planned(
                comm, K_ALL_GATHERV, "all_gatherv", algorithm, 0, None, out, buf, True, out,
                buf, 1, counts):
        return out
    return _general["all_gatherv"](comm, out, buf, counts, algorithm=algorithm,
                                   timeout=timeout, async_op=async_op)


def gatherv(comm, buf, out=None, counts=None, root=0, *, algorithm=None, timeout=None,
            async_op=False):
    """Root's out (sum(counts) elements) receives every rank's buf in rank order;
    counts (rank q's buf holds counts[q]) are needed at the root only."""
    if type(buf) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int:
        at_root = comm.rank == root
        mine = out if at_root else None
        if (mine is None or type(mine) is _ndarray) and not (at_root and counts is None) \
                and _planned(comm, K_GATHERV, "gatherv", algorithm, root, None, buf, mine, True,
                             mine, buf, 1, counts):
            return mine
    return _general["gatherv"](comm, buf, out, counts, root, algorithm=algorithm,
                               timeout=timeout, async_op=async_op)


def scatterv(comm, out, buf=None, counts=None, root=0, *, algorithm=None, timeout=None,
             async_op=False):
    """Rank q's out (counts[q] elements) receives block q of root's buf (sum(counts)
    elements, packed in rank order); counts are needed at the root only."""
    if type(out) is _ndarray and _named(algorithm) and timeout is None and not async_op \
            and type(root) is int:
        at_root = comm.rank == root
        mine = buf if at_root else None
        if (mine is None or type(mine) is _ndarray) and not (at_root and counts is None) \
                and _planned(comm, K_SCATTERV, "scatterv", algorithm, root, None, out, mine,
                             True, out, mine, 1, counts):
            return out
    return _general["scatterv"](comm, out, buf, counts, root, algorithm=algorithm,
                                timeout=timeout, async_op=async_op)


def all_to_allv(comm, out, buf, send_counts, recv_counts, *, algorithm=None, timeout=None,
                async_op=False):
    """send_counts[q] elements of buf (blocks packed in rank order) go to rank q, whose
    out receives them as its block r; recv_counts[q] elements of out come from rank q
    (rank q's send_counts[r] must equal this rank's recv_counts[q])."""
    if type(out) is _ndarray and type(buf) is _ndarray and _named(algorithm) \
            and timeout is None and not async_op and send_counts is not None \
            and recv_counts is not None and _planned(
                comm, K_ALL_TO_ALLV, "all_to_allv", algorithm, 0, None, out, buf, True, out,
                buf, 2, send_counts, recv_counts):
        return out
    return _general["all_to_allv"](comm, out, buf, send_counts, recv_counts,
                                   algorithm=algorithm, timeout=timeout, async_op=async_op)
