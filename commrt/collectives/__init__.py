"""Collectives over the Communicator's point-to-point API (DESIGN.md rule 1).

One public function per collective, communicator first; the Communicator's
methods delegate here with the same arguments:

    barrier(comm, *, timeout=None, async_op=False)
    broadcast(comm, buf, root=0, *, algorithm=None, timeout=None, async_op=False)
    reduce(comm, buf, root=0, op=SUM, *, algorithm=None, timeout=None, async_op=False)
    all_reduce(comm, buf, op=SUM, algorithm=None, *, timeout=None, async_op=False)
    all_gather(comm, out, buf, *, algorithm=None, timeout=None, async_op=False)
    gather(comm, buf, out=None, root=0, *, timeout=None, async_op=False)
    scatter(comm, out, buf=None, root=0, *, timeout=None, async_op=False)
    reduce_scatter(comm, out, buf, op=SUM, *, algorithm=None, timeout=None, async_op=False)
    all_to_all(comm, out, buf, *, timeout=None, async_op=False)
    all_gatherv(comm, out, buf, counts, *, algorithm=None, timeout=None, async_op=False)
    gatherv(comm, buf, out=None, counts=None, root=0, *, timeout=None, async_op=False)
    scatterv(comm, out, buf=None, counts=None, root=0, *, timeout=None, async_op=False)
    all_to_allv(comm, out, buf, send_counts, recv_counts, *, timeout=None, async_op=False)
    broadcast_obj(comm, obj, root=0, *, timeout=None)
    all_gather_obj(comm, obj, *, timeout=None)
    gather_obj(comm, obj, root=0, *, timeout=None)
    split(comm, color, key=None) -> Communicator | None
    new_group(comm, ranks) -> Communicator | None

Buffers are contiguous NumPy arrays, reduced in place where the collective
has one buffer, or anything else the one buffer function takes
(commrt.transport.buffers.describe: torch tensors once commrt.torch is
imported, DLPack, the buffer protocol); CuPy and Numba device arrays are
staged through host memory.  The ``v`` collectives take per-rank element counts (blocks packed in
rank order; zero counts allowed): all_gatherv's counts are the same list on
every rank, gatherv's and scatterv's are needed at the root only (another
rank's block is its own buf / out), all_to_allv's send_counts[q] must equal
rank q's recv_counts[r].  A blocking call returns its output buffer (gather: out at the
root, None elsewhere); ``async_op=True`` returns a CollRequest whose
``wait(timeout)`` returns the same and raises any error in the caller's
thread, and ``test()`` says whether it finished.  Leave the buffers alone
until then.  Collectives of one communicator run in call order.

Algorithms: ``algorithm=None`` asks the cost model (collectives/cost.py)
unless COMMRT_<COLLECTIVE>_ALGO names one; the names per collective are in
ALGORITHMS, built by collectives/registry.py from the modules
``collectives/<collective>/<algorithm>.py``.  Each algorithm's steps and
cost are in its module and in docs/algorithms.md.
"""
import pickle
from collections.abc import Mapping

from commrt.collectives import _entry, _small, plans, registry

# Import every algorithm package now, before the functions below are defined:
# importing a subpackage for the first time sets the package attribute of its
# name (commrt.collectives.broadcast), which would otherwise replace the
# function of that name whenever the registry first loads it.
registry.table()
from commrt.collectives import cost as _cost
from commrt.collectives.call import Call  # noqa: F401
from commrt.collectives.state import CollRequest, entry, execute, state_of  # noqa: F401
from commrt.collectives.state import concurrent as _concurrent
from commrt.collectives.all_gather import bruck as _bruck
from commrt.collectives.broadcast import binomial as _binomial
from commrt.collectives.gather import linear as _gather_linear
from commrt.collectives.ops import AVG, SUM, ReduceOp
from commrt.collectives.reduction import Reduction
from commrt.errors import CollectiveMismatchError
from commrt.transport.buffers import describe as _describe
from commrt.transport.buffers import host_array as _host_array
from commrt import _lazy

np = _lazy.module("numpy", globals(), "np")     # loaded on first use: a barrier needs none


class _NoArrays:
    """Stands for np.ndarray until NumPy is loaded: nothing is an instance."""


_ndarray = _NoArrays      # np.ndarray once loaded (_arrays): the fast paths compare with it


def _arrays(numpy):
    global _ndarray
    _ndarray = numpy.ndarray
    _entry.set_ndarray(numpy.ndarray)


_lazy.when_loaded("numpy", _arrays)


__all__ = ["barrier", "broadcast", "reduce", "all_reduce", "all_gather", "gather", "scatter",
           "reduce_scatter", "all_to_all", "all_gatherv", "gatherv", "scatterv", "all_to_allv",
           "broadcast_obj", "all_gather_obj", "gather_obj", "split", "new_group", "ReduceOp",
           "CollRequest", "ALGORITHMS", "set_spin"]


class _Algorithms(Mapping):
    """{collective: algorithm names in tie-break order}, from collectives/registry.py."""

    def __getitem__(self, collective):
        return registry.names(collective)

    def __iter__(self):
        return iter(registry.collectives())

    def __len__(self):
        return len(registry.collectives())


ALGORITHMS = _Algorithms()


# -- buffers ---------------------------------------------------------------------
def _noop():
    pass


def _host(buf, name, write_back):
    """(flat host array, finish) for a buffer; finish() copies staged data back.
    NumPy arrays here; everything else through the one buffer function."""
    if _ndarray is _NoArrays:               # the first call with data: NumPy now
        _lazy.load("numpy")
    if isinstance(buf, _ndarray):
        if buf.flags.f_contiguous and not buf.flags.c_contiguous:
            return _fortran(buf, write_back, name)
        return _host_array(buf, write_back, name), _noop
    desc = _describe(buf, write_back, name)
    return desc.array, (desc.finish if write_back and desc.finish is not None else _noop)


def _fortran(buf, write_back, name):
    """A Fortran-ordered array travels in C (logical) order, through a copy, so a
    rank with a C array and one with a Fortran array of the same shape combine
    element (i, j) with element (i, j)."""
    if write_back and not buf.flags.writeable:
        raise ValueError(f"{name} is read-only")
    host = np.ascontiguousarray(buf).reshape(-1)
    if not write_back:
        return host, _noop
    return host, lambda: np.copyto(buf, host.reshape(buf.shape))


def _check_root(comm, root):
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < comm.size:
        raise ValueError(f"root {root!r} out of range for a communicator of size {comm.size}")
    return int(root)


def _reducer(comm, op, dtype):
    """(op, Reduction) after checking op against dtype (memoised per communicator:
    building them costs more than a tiny collective)."""
    st = state_of(comm)
    key = ("reducer", op, dtype)
    try:
        made = st.cache.get(key)
    except TypeError:                       # an unhashable op: ReduceOp.parse names it
        return _make_reducer(comm, st, op, dtype)
    if made is None:
        made = st.cache[key] = _make_reducer(comm, st, op, dtype)
    return made


def _make_reducer(comm, st, op, dtype):
    from commrt.kernels.bfloat16 import BFLOAT16
    from commrt.kernels.reduce import check_op_dtype

    op = ReduceOp.parse(op)
    if op is AVG and np.dtype(dtype).kind not in "iufc" and dtype != BFLOAT16:
        raise TypeError(f"AVG is not defined for dtype {np.dtype(dtype)}")
    kop = check_op_dtype(op.kernel, dtype)
    parallel = st.cache.get("parallel", 0)
    if parallel == 0:
        parallel = st.cache["parallel"] = None if _cost.ranks_on_my_host(comm) == 1 else False
    return op, Reduction(op, kop, np.dtype(dtype), parallel)


def _finish_avg(op, flat, n):
    if op is AVG:
        from commrt.kernels.reduce import scale_into

        scale_into(flat, n)


def _pick(collective, comm, algorithm, nbytes, timeout=None):
    """(name, module) of the algorithm to run: the one asked for, else the cost
    model's (or COMMRT_<COLLECTIVE>_ALGO's) choice."""
    if algorithm is None:
        algorithm = _cost.choose(collective, comm, nbytes, timeout)
    return algorithm, registry.module(collective, algorithm)


def set_spin(comm, spin):
    """Whether the waits of comm's collectives may spin before they sleep (True
    until told otherwise): False for a communicator that a helper thread drives
    beside its caller's computation (the Horovod coordinator's), whose waits then
    sleep after one progress pass, in the prepared plans' chains too, so that the
    waiting helper takes neither a core nor the GIL from the computation; True
    again while the caller itself waits for the helper's result.  Cheap when
    the value does not change."""
    st = state_of(comm)
    spin = bool(spin)
    if st.spin is spin:
        return
    st.spin = spin
    for plan in list(st.small.values()):
        plan.chain.spin = spin


def _plan_key(kind, algorithm, timeout, async_op, root, a, b=_noop):
    """The plan key of a call that may take a plan (else None): no timeout or
    async_op given, an int root, NumPy arrays a (and b) or None.  A call that
    names its algorithm gets a key of its own (the name last: the compiled
    entry never looks one up, _keyed_plan does).  (Written out: it runs on
    every call of the planned path, ~1 µs in all.)"""
    if timeout is not None or async_op or type(root) is not int:
        return None
    if algorithm is not None:
        key = _plan_key(kind, None, None, False, root, a, b) if type(algorithm) is str else None
        return None if key is None else key + (algorithm,)
    if _ndarray is _NoArrays:               # the first call with data: NumPy now
        _lazy.load("numpy")
    if type(a) is _ndarray:
        sa, da = a.shape, a.dtype
    elif a is None:
        sa = da = None
    else:
        return None
    if b is _noop:
        return kind, root, sa, da
    if type(b) is _ndarray:
        return kind, root, sa, da, b.shape, b.dtype
    return (kind, root, sa, da, None, None) if b is None else None


def _keyed_plan(comm, key, out, inbuf):
    """Run a call along the plan an earlier call like it left (key: the plan key
    the general path prepared it under; a call that names its algorithm
    (algorithm=) has the name in its key; the variable-size collectives their
    counts, which reach here when the compiled entry could not compare them:
    NumPy ints, a generator): True when done, False having done nothing.  As the compiled entry does for the cost model's
    choice: not inside another collective's Call, no async call queued (they
    take their sequence numbers in call order), the communicator not poisoned;
    anything unusual hands over to the general path inside plans.run."""
    if key is None:
        return False
    st = state_of(comm)
    if st.pending or st.poisoned is not None or st.current is not None:
        return False
    try:
        plan = st.small.get(key)
    except TypeError:                       # an unhashable op: the general path names it
        return False
    if plan is None:
        return False
    if plan.mode == plans.SCHED:
        return plans.run(comm, st, plan, out, inbuf)
    return _small.run(comm, st, out, plan) is not None     # an all-reduce's (_small.py)


# -- buffer collectives ----------------------------------------------------------
# The public functions of the collectives with a prepared-plan path (barrier,
# broadcast, reduce, all_reduce, all_gather, gather, scatter, reduce_scatter,
# all_to_all, and the variable-size all_gatherv, gatherv, scatterv, all_to_allv)
# are compiled (collectives/_entry.pyx): a planned call is one C function;
# everything else comes here, to the general paths (_broadcast, ...), bound at
# the end of this module.
@entry
def _barrier(comm, *, timeout=None, async_op=False):
    if timeout is None and not async_op and comm.size > 1:
        st = _small.state_if_idle(comm)
        if st is not None:
            plan = st.small.get("barrier") or _small.prepare_barrier(comm, st)
            _small.run(comm, st, plan.tmp, plan)
            return None
    algo, mod = _pick("barrier", comm, None, 0)
    call = Call(comm, "barrier", algo=algo, timeout=timeout)
    return execute(call, lambda: mod.run(call), async_op)


def _async_plan(comm, buf, key):
    """An async all-reduce run by the worker along its prepared plan (a power of
    two's: _small.py), or None.  Its sequence number is taken here, in call
    order, as a general call's is; anything unusual hands over to a Call as on
    the caller's thread.  The chain spins as it would on the caller's thread:
    without spinning while nobody waited yet (as the general path's waits on
    the worker), a 100 KiB async all-reduce waited for at once took 330-346 µs
    through torch.distributed, against 300 on the general path and 141 so
    (N = 2; DDP's step on bench torch's CNN 3.28-3.31 -> 3.04 ms, at N = 4
    8.07-8.53 -> 7.20-7.53)."""
    st = state_of(comm)
    plan = st.small.get(key)
    if plan is None or plan.sched or not (buf.flags.c_contiguous and buf.flags.writeable):
        return None
    seq = st.seq
    st.seq = seq + 1
    st.history.append((seq, plan.base, plan.meta2))    # (readers OR the seq in)
    call = Call(comm, "all_reduce", count=plan.count, dtype=plan.dtype, op=plan.op,
                algo=plan.algo, seq=seq)     # names the request; resumed: nothing taken

    def run():
        _small.finish_go(comm, st, buf, plan, seq, -2)
        return buf
    return st.submit(call, run)


@entry
def _broadcast(comm, buf, root=0, *, algorithm=None, timeout=None, async_op=False):
    key = _plan_key("broadcast", algorithm, timeout, async_op, root, buf)
    if algorithm is not None and _keyed_plan(comm, key, buf, None):
        return buf
    root = _check_root(comm, root)
    flat, done = _host(buf, "buf", comm.rank != root)
    algo, mod = _pick("broadcast", comm, algorithm, flat.nbytes, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "broadcast", algo, flat.size, flat.dtype,
                      flat.nbytes, -1, flat.size, flat.size, root)
    call = Call(comm, "broadcast", count=flat.size, dtype=flat.dtype, root=root, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, flat, root)
        done()
        return buf
    return execute(call, run, async_op)


@entry
def _reduce(comm, buf, root=0, op=SUM, *, algorithm=None, timeout=None, async_op=False):
    key = _plan_key(("reduce", op), algorithm, timeout, async_op, root, buf)
    if algorithm is not None and _keyed_plan(
            comm, key, buf if comm.rank == root else None, None if comm.rank == root else buf):
        return buf
    root = _check_root(comm, root)
    flat, done = _host(buf, "buf", comm.rank == root)
    op, red = _reducer(comm, op, flat.dtype)
    algo, mod = _pick("reduce", comm, algorithm, flat.nbytes, timeout)
    if key is not None:
        at_root = comm.rank == root
        plans.prepare(comm, state_of(comm), key, "reduce", algo, flat.size, flat.dtype,
                      flat.nbytes if at_root else -1, -1 if at_root else flat.nbytes,
                      flat.size, flat.size, root, op, red.hook)
    call = Call(comm, "reduce", count=flat.size, dtype=flat.dtype, op=op, root=root, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, flat, root, red)
        call.wait_sends()
        if comm.rank == root:
            _finish_avg(op, flat, comm.size)
            done()
        return buf
    return execute(call, run, async_op)


def _prepare_all_reduce(comm, key, buf, flat, op, red, algorithm):
    """Leave a plan behind for all-reduces like this one where its algorithm has
    one (key None: none)."""
    if key is None:
        return
    if algorithm == "recursive_doubling":
        _small.prepare(comm, state_of(comm), buf, key, op)
        plans.prepare_all_reduce(comm, state_of(comm), key, buf, op, red)
    elif algorithm == "rabenseifner":
        _small.prepare_rabenseifner(comm, state_of(comm), buf, key, op, red.hook)
    elif algorithm == "tree":
        plans.prepare_tree(comm, state_of(comm), key, buf, op, red)
    elif ("all_reduce", algorithm) in plans.LAYOUTS:
        plans.prepare(comm, state_of(comm), key, "all_reduce", algorithm, flat.size,
                      flat.dtype, flat.nbytes, -1, flat.size, flat.size, 0, op, red.hook)


def _all_reduce(comm, buf, op, algorithm, timeout, async_op, key):
    """The general path (key: the small path's plan key, where it may prepare one)."""
    if algorithm is not None:
        # a plan of its own (the name in the key, the op as the caller gave it, as
        # the compiled entry's keys have it), as _plan_key gives the other kinds
        key = None
        if timeout is None and not async_op and type(buf) is _ndarray and type(algorithm) is str:
            key = (buf.shape, buf.dtype, op, algorithm)
            try:
                hash(key)
            except TypeError:               # an unhashable op: the general path names it
                key = None
            if _keyed_plan(comm, key, buf, None):
                return buf
    flat, done = _host(buf, "buf", True)
    op, red = _reducer(comm, op, flat.dtype)
    if algorithm is None:
        if async_op and key is None and timeout is None and type(buf) is _ndarray:
            key = (buf.shape, buf.dtype, op)     # the worker may run its plan (_async_plan)
        algorithm = _cost.choose("all_reduce", comm, flat.nbytes, timeout)
        _prepare_all_reduce(comm, key, buf, flat, op, red, algorithm)
        if async_op and key is not None:
            req = _async_plan(comm, buf, key)
            if req is not None:
                return req
    else:                                   # (an unknown name has no plan to prepare)
        _prepare_all_reduce(comm, key, buf, flat, op, red, algorithm)
    mod = registry.module("all_reduce", algorithm)
    call = Call(comm, "all_reduce", count=flat.size, dtype=flat.dtype, op=op, algo=algorithm,
                timeout=timeout)

    def run():
        mod.run(call, flat, red)
        call.wait_sends()  # a send may still read buf: divide only after
        _finish_avg(op, flat, comm.size)
        done()
        return buf
    return execute(call, run, async_op)


@entry
def _all_gather(comm, out, buf, *, algorithm=None, timeout=None, async_op=False):
    key = _plan_key("all_gather", algorithm, timeout, async_op, 0, out, buf)
    if algorithm is not None and _keyed_plan(comm, key, out, buf):
        return out
    flat, _ = _host(buf, "buf", False)
    oflat, done = _host(out, "out", True)
    if oflat.size != comm.size * flat.size or oflat.dtype != flat.dtype:
        raise ValueError(f"all_gather: out must hold {comm.size} x {flat.size} elements of "
                         f"{flat.dtype}, got {oflat.size} of {oflat.dtype}")
    algo, mod = _pick("all_gather", comm, algorithm, oflat.nbytes, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "all_gather", algo, flat.size, flat.dtype,
                      oflat.nbytes, flat.nbytes, flat.size, flat.size)
    call = Call(comm, "all_gather", count=flat.size, dtype=flat.dtype, algo=algo, timeout=timeout)

    def run():
        mod.run(call, oflat, flat)
        done()
        return out
    return execute(call, run, async_op)


@entry
def _gather(comm, buf, out=None, root=0, *, algorithm=None, timeout=None, async_op=False):
    mine = out if comm.rank == root else None
    key = _plan_key("gather", algorithm, timeout, async_op, root, buf, mine)
    if algorithm is not None and _keyed_plan(comm, key, mine, buf):
        return mine
    root = _check_root(comm, root)
    flat, _ = _host(buf, "buf", False)
    oflat, done = None, _noop
    if comm.rank == root:
        if out is None:
            raise ValueError("gather: the root must pass out")
        oflat, done = _host(out, "out", True)
        if oflat.size != comm.size * flat.size or oflat.dtype != flat.dtype:
            raise ValueError(f"gather: out must hold {comm.size} x {flat.size} elements of "
                             f"{flat.dtype}, got {oflat.size} of {oflat.dtype}")
    algo, mod = _pick("gather", comm, algorithm, flat.nbytes * comm.size, timeout)
    if key is not None and (oflat is not None or comm.rank != root):
        plans.prepare(comm, state_of(comm), key, "gather", algo, flat.size, flat.dtype,
                      -1 if oflat is None else oflat.nbytes, flat.nbytes, flat.size,
                      flat.size, root)
    call = Call(comm, "gather", count=flat.size, dtype=flat.dtype, root=root, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, flat, oflat, root)
        done()
        return out if comm.rank == root else None
    return execute(call, run, async_op)


@entry
def _scatter(comm, out, buf=None, root=0, *, algorithm=None, timeout=None, async_op=False):
    mine = buf if comm.rank == root else None
    key = _plan_key("scatter", algorithm, timeout, async_op, root, out, mine)
    if algorithm is not None and _keyed_plan(comm, key, out, mine):
        return out
    root = _check_root(comm, root)
    oflat, done = _host(out, "out", True)
    flat = None
    if comm.rank == root:
        if buf is None:
            raise ValueError("scatter: the root must pass buf")
        flat, _ = _host(buf, "buf", False)
        if flat.size != comm.size * oflat.size or flat.dtype != oflat.dtype:
            raise ValueError(f"scatter: buf must hold {comm.size} x {oflat.size} elements of "
                             f"{oflat.dtype}, got {flat.size} of {flat.dtype}")
    algo, mod = _pick("scatter", comm, algorithm, oflat.nbytes * comm.size, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "scatter", algo, oflat.size, oflat.dtype,
                      oflat.nbytes, -1 if flat is None else flat.nbytes, oflat.size,
                      oflat.size, root)
    call = Call(comm, "scatter", count=oflat.size, dtype=oflat.dtype, root=root, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, oflat, flat, root)
        done()
        return out
    return execute(call, run, async_op)


@entry
def _reduce_scatter(comm, out, buf, op=SUM, *, algorithm=None, timeout=None, async_op=False):
    key = _plan_key(("reduce_scatter", op), algorithm, timeout, async_op, 0, out, buf)
    if algorithm is not None and _keyed_plan(comm, key, out, buf):
        return out
    flat, _ = _host(buf, "buf", False)
    oflat, done = _host(out, "out", True)
    if flat.size != comm.size * oflat.size or flat.dtype != oflat.dtype:
        raise ValueError(f"reduce_scatter: buf must hold {comm.size} x {oflat.size} elements of "
                         f"{oflat.dtype}, got {flat.size} of {flat.dtype}")
    op, red = _reducer(comm, op, flat.dtype)
    algo, mod = _pick("reduce_scatter", comm, algorithm, flat.nbytes, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "reduce_scatter", algo, oflat.size,
                      flat.dtype, oflat.nbytes, flat.nbytes, flat.size, oflat.size, 0, op,
                      red.hook)
    call = Call(comm, "reduce_scatter", count=oflat.size, dtype=flat.dtype, op=op, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, oflat, flat, red)
        call.wait_sends()
        _finish_avg(op, oflat, comm.size)
        done()
        return out
    return execute(call, run, async_op)


@entry
def _all_to_all(comm, out, buf, *, algorithm=None, timeout=None, async_op=False):
    key = _plan_key("all_to_all", algorithm, timeout, async_op, 0, out, buf)
    if algorithm is not None and _keyed_plan(comm, key, out, buf):
        return out
    flat, _ = _host(buf, "buf", False)
    oflat, done = _host(out, "out", True)
    if flat.size != oflat.size or flat.dtype != oflat.dtype or flat.size % comm.size:
        raise ValueError(f"all_to_all: buf and out must hold the same multiple of {comm.size} "
                         f"elements of one dtype, got {flat.size} {flat.dtype} and "
                         f"{oflat.size} {oflat.dtype}")
    algo, mod = _pick("all_to_all", comm, algorithm, flat.nbytes, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "all_to_all", algo, flat.size, flat.dtype,
                      oflat.nbytes, flat.nbytes, flat.size // comm.size,
                      flat.size // comm.size)
    call = Call(comm, "all_to_all", count=flat.size, dtype=flat.dtype, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, oflat, flat)
        done()
        return out
    return execute(call, run, async_op)


# -- variable-size collectives -------------------------------------------------------
def _counts(comm, counts, name):
    """counts as a list of comm.size non-negative ints (a clear error otherwise)."""
    if counts is None:
        raise ValueError(f"{name} must be given")
    try:
        out = [int(c) for c in counts]
        ok = all(isinstance(q, (int, np.integer)) and not isinstance(q, bool) for q in counts)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of {comm.size} ints, got {counts!r}") from None
    if not ok:
        raise TypeError(f"{name} must be a sequence of {comm.size} ints, got {list(counts)!r}")
    if len(out) != comm.size or any(c < 0 for c in out):
        raise ValueError(f"{name} must hold {comm.size} non-negative ints (one per rank), "
                         f"got {list(counts)!r}")
    return out


def _holds(what, flat, n, dtype, name, where):
    if flat.size != n or flat.dtype != dtype:
        raise ValueError(f"{what}: {name} must hold {n} elements of {dtype} ({where}), got "
                         f"{flat.size} of {flat.dtype}")


def _counts_key(counts):
    """counts as a tuple for a plan key, or None where they are not a sequence of
    Python ints (the argument checks then name what is wrong).  A plan made
    under such a key was made by a call whose checks passed with the same
    counts, shapes and dtypes, so a call that finds it needs no checks."""
    try:
        key = tuple(counts)
    except TypeError:
        return None
    for c in key:
        if type(c) is not int:
            break
    else:
        return key
    if all(type(c) is int or isinstance(c, np.integer) for c in key):
        return tuple(int(c) for c in key)       # NumPy ints: the same key
    return None


def _rooted_key(comm, kind, algorithm, timeout, async_op, root, a, b, counts):
    """gatherv's and scatterv's plan key (None: none) with their counts, and the
    counts to check (a tuple where they are the key's).  The root's counts are
    in the key; elsewhere counts are optional, and in the key as given (None
    or checked ints)."""
    key = _plan_key(kind, algorithm, timeout, async_op, root, a, b)
    if key is None:
        return None, counts
    cnt = None if counts is None else _counts_key(counts)
    if cnt is None and (counts is not None or comm.rank == root):
        return None, counts
    return key + (cnt,), (counts if cnt is None else cnt)


@entry
def _all_gatherv(comm, out, buf, counts, *, algorithm=None, timeout=None, async_op=False):
    """out (sum(counts) elements) receives every rank's buf in rank order; rank q's
    buf holds counts[q] elements (counts: the same list on every rank)."""
    key = _plan_key("all_gatherv", algorithm, timeout, async_op, 0, out, buf)
    if key is not None:
        cnt = _counts_key(counts)
        key = None if cnt is None else key + (cnt,)
        if _keyed_plan(comm, key, out, buf):
            return out
        counts = counts if cnt is None else cnt
    counts = _counts(comm, counts, "counts")
    flat, _ = _host(buf, "buf", False)
    oflat, done = _host(out, "out", True)
    _holds("all_gatherv", flat, counts[comm.rank], flat.dtype, "buf", f"counts[{comm.rank}]")
    _holds("all_gatherv", oflat, sum(counts), flat.dtype, "out", "sum(counts)")
    algo, mod = _pick("all_gatherv", comm, algorithm, oflat.nbytes, timeout)
    if key is not None:
        plans.prepare(comm, state_of(comm), key, "all_gatherv", algo, oflat.size, flat.dtype,
                      oflat.nbytes, flat.nbytes, counts, counts)
    call = Call(comm, "all_gatherv", count=oflat.size, dtype=flat.dtype, algo=algo,
                timeout=timeout)

    def run():
        mod.run(call, oflat, flat, counts)
        done()
        return out
    return execute(call, run, async_op)


@entry
def _gatherv(comm, buf, out=None, counts=None, root=0, *, algorithm=None, timeout=None,
            async_op=False):
    """Root's out (sum(counts) elements) receives every rank's buf in rank order;
    counts (rank q's buf holds counts[q]) are needed at the root only."""
    mine = out if comm.rank == root else None
    key, counts = _rooted_key(comm, "gatherv", algorithm, timeout, async_op, root, buf, mine,
                              counts)
    if _keyed_plan(comm, key, mine, buf):
        return mine
    root = _check_root(comm, root)
    flat, _ = _host(buf, "buf", False)
    oflat, done, cnt = None, _noop, None
    if comm.rank == root:
        cnt = _counts(comm, counts, "gatherv: counts (at the root)")
        if out is None:
            raise ValueError("gatherv: the root must pass out")
        oflat, done = _host(out, "out", True)
        _holds("gatherv", flat, cnt[root], flat.dtype, "buf", f"counts[{root}]")
        _holds("gatherv", oflat, sum(cnt), flat.dtype, "out", "sum(counts)")
    elif counts is not None:
        cnt = _counts(comm, counts, "gatherv: counts")
        _holds("gatherv", flat, cnt[comm.rank], flat.dtype, "buf", f"counts[{comm.rank}]")
    algo, mod = _pick("gatherv", comm, algorithm, flat.nbytes * comm.size, timeout)
    if key is not None:
        sizes = cnt or [flat.size if q == comm.rank else 0 for q in range(comm.size)]
        plans.prepare(comm, state_of(comm), key, "gatherv", algo, 0, flat.dtype,
                      -1 if oflat is None else oflat.nbytes, flat.nbytes, sizes, sizes, root)
    call = Call(comm, "gatherv", dtype=flat.dtype, root=root, algo=algo, timeout=timeout)

    def run():
        mod.run(call, flat, oflat, cnt, root)
        done()
        return out if comm.rank == root else None
    return execute(call, run, async_op)


@entry
def _scatterv(comm, out, buf=None, counts=None, root=0, *, algorithm=None, timeout=None,
             async_op=False):
    """Rank q's out (counts[q] elements) receives block q of root's buf (sum(counts)
    elements, packed in rank order); counts are needed at the root only."""
    mine = buf if comm.rank == root else None
    key, counts = _rooted_key(comm, "scatterv", algorithm, timeout, async_op, root, out, mine,
                              counts)
    if _keyed_plan(comm, key, out, mine):
        return out
    root = _check_root(comm, root)
    oflat, done = _host(out, "out", True)
    flat, cnt = None, None
    if comm.rank == root:
        cnt = _counts(comm, counts, "scatterv: counts (at the root)")
        if buf is None:
            raise ValueError("scatterv: the root must pass buf")
        flat, _ = _host(buf, "buf", False)
        _holds("scatterv", flat, sum(cnt), oflat.dtype, "buf", "sum(counts)")
        _holds("scatterv", oflat, cnt[root], oflat.dtype, "out", f"counts[{root}]")
    elif counts is not None:
        cnt = _counts(comm, counts, "scatterv: counts")
        _holds("scatterv", oflat, cnt[comm.rank], oflat.dtype, "out", f"counts[{comm.rank}]")
    algo, mod = _pick("scatterv", comm, algorithm, oflat.nbytes * comm.size, timeout)
    if key is not None:
        sizes = cnt or [oflat.size if q == comm.rank else 0 for q in range(comm.size)]
        plans.prepare(comm, state_of(comm), key, "scatterv", algo, 0, oflat.dtype,
                      oflat.nbytes, -1 if flat is None else flat.nbytes, sizes, sizes, root)
    call = Call(comm, "scatterv", dtype=oflat.dtype, root=root, algo=algo, timeout=timeout)

    def run():
        mod.run(call, oflat, flat, cnt, root)
        done()
        return out
    return execute(call, run, async_op)


@entry
def _all_to_allv(comm, out, buf, send_counts, recv_counts, *, algorithm=None, timeout=None,
                async_op=False):
    """send_counts[q] elements of buf (blocks packed in rank order) go to rank q, whose
    out receives them as its block r; recv_counts[q] elements of out come from rank q
    (rank q's send_counts[r] must equal this rank's recv_counts[q])."""
    key = _plan_key("all_to_allv", algorithm, timeout, async_op, 0, out, buf)
    if key is not None:
        sck, rck = _counts_key(send_counts), _counts_key(recv_counts)
        key = None if sck is None or rck is None else key + (sck, rck)
        if _keyed_plan(comm, key, out, buf):
            return out
        send_counts = send_counts if sck is None else sck
        recv_counts = recv_counts if rck is None else rck
    sc = _counts(comm, send_counts, "send_counts")
    rc = _counts(comm, recv_counts, "recv_counts")
    flat, _ = _host(buf, "buf", False)
    oflat, done = _host(out, "out", True)
    _holds("all_to_allv", flat, sum(sc), flat.dtype, "buf", "sum(send_counts)")
    _holds("all_to_allv", oflat, sum(rc), flat.dtype, "out", "sum(recv_counts)")
    r = comm.rank
    if sc[r] != rc[r]:
        raise ValueError(f"all_to_allv: send_counts[{r}] = {sc[r]} and recv_counts[{r}] = "
                         f"{rc[r]} (this rank's block to itself) differ")
    algo, mod = _pick("all_to_allv", comm, algorithm, flat.nbytes, timeout)
    if key is not None:
        # the schedule's counts[q][p] (q sends p): only this rank's row and column
        matrix = [[sc[p] if q == r else (rc[q] if p == r else 0) for p in range(comm.size)]
                  for q in range(comm.size)]
        plans.prepare(comm, state_of(comm), key, "all_to_allv", algo, 0, flat.dtype,
                      oflat.nbytes, flat.nbytes, matrix, matrix)
    call = Call(comm, "all_to_allv", dtype=flat.dtype, algo=algo, timeout=timeout)

    def run():
        mod.run(call, oflat, flat, sc, rc)
        done()
        return out
    return execute(call, run, async_op)


# -- objects ---------------------------------------------------------------------------
def _dumps(obj):
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


@entry
def broadcast_obj(comm, obj, root=0, *, timeout=None):
    """root's picklable obj, on every rank (peers are authenticated: unpickling is safe)."""
    root = _check_root(comm, root)
    call = Call(comm, "broadcast_obj", dtype=np.uint8, root=root, algo="binomial",
                timeout=timeout)

    def run():
        n = np.zeros(1, np.int64)
        if comm.rank == root:
            data = _dumps(obj)
            n[0] = data.size
        _binomial.run(call, n, root)
        if comm.rank != root:
            data = np.empty(int(n[0]), np.uint8)
        registry.module("broadcast", "pipeline" if n[0] >= 1 << 20 else "binomial").run(
            call, data, root)
        call.finish()
        return obj if comm.rank == root else pickle.loads(data)
    return execute(call, run, False)


@entry
def all_gather_obj(comm, obj, *, timeout=None):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    call = Call(comm, "all_gather_obj", dtype=np.uint8, algo="bruck", timeout=timeout)

    def run():
        data = _dumps(obj)
        sizes = np.empty(comm.size, np.int64)
        _bruck.run(call, sizes, np.array([data.size], np.int64))
        width = int(sizes.max()) if comm.size else 0
        mine = np.zeros(width, np.uint8)
        mine[:data.size] = data
        out = np.empty(comm.size * width, np.uint8)
        registry.module("all_gather", "ring" if width * comm.size >= 1 << 20 else "bruck").run(
            call, out, mine)
        call.finish()
        return [obj if q == comm.rank else pickle.loads(out[q * width:q * width + sizes[q]])
                for q in range(comm.size)]
    return execute(call, run, False)


@entry
def gather_obj(comm, obj, root=0, *, timeout=None):
    """[obj of rank 0, obj of rank 1, ...] at root; None elsewhere."""
    root = _check_root(comm, root)
    call = Call(comm, "gather_obj", dtype=np.uint8, root=root, algo="linear", timeout=timeout)

    def run():
        data = _dumps(obj)
        size = np.array([data.size], np.int64)
        sizes = np.empty(comm.size, np.int64) if comm.rank == root else None
        _gather_linear.run(call, size, sizes, root)
        if comm.rank != root:
            call.isend(data, root)
            call.finish()
            return None
        bufs = {q: np.empty(int(sizes[q]), np.uint8) for q in range(comm.size) if q != root}
        rvs = [call.irecv(bufs[q], q) for q in sorted(bufs)]
        call.waitall(rvs)
        return [obj if q == root else pickle.loads(bufs[q]) for q in range(comm.size)]
    return execute(call, run, False)


# -- communicators -----------------------------------------------------------------
@entry
def split(comm, color, key=None):
    """Ranks that pass the same color form a new communicator, ordered by (key, rank).

    color None (or negative) takes no part and gets None.  Every rank calls it."""
    if color is not None and (not isinstance(color, (int, np.integer)) or isinstance(color, bool)):
        raise TypeError(f"color must be an int or None, got {type(color).__name__}")
    if key is not None and (not isinstance(key, (int, np.integer)) or isinstance(key, bool)):
        raise TypeError(f"key must be an int or None, got {type(key).__name__}")
    c = -1 if color is None or color < 0 else int(color)
    k = comm.rank if key is None else int(key)
    call = Call(comm, "split", count=2, dtype=np.int64, algo="bruck")

    def run():
        table = np.empty(2 * comm.size, np.int64)
        _bruck.run(call, table, np.array([c, k], np.int64))
        call.finish()
        return table.reshape(comm.size, 2)

    table = execute(call, run, False)
    if c < 0:
        return None
    members = sorted((int(table[q, 1]), q) for q in range(comm.size) if table[q, 0] == c)
    return comm.channel.derive([q for _, q in members], ("split", call.seq, c))


@entry
def new_group(comm, ranks):
    """A communicator over `ranks` (in that order); every rank of comm calls it with
    the same ranks, non-members get None."""
    ranks = [int(r) for r in ranks]
    if len(set(ranks)) != len(ranks) or any(not 0 <= r < comm.size for r in ranks):
        raise ValueError(f"new_group: ranks must be distinct ranks of 0..{comm.size - 1}, got {ranks}")
    import hashlib

    digest = int.from_bytes(hashlib.blake2b(repr(ranks).encode(), digest_size=7).digest(), "little")
    call = Call(comm, "new_group", count=len(ranks), dtype=np.int64, algo="bruck")

    def run():
        table = np.empty(comm.size, np.int64)
        _bruck.run(call, table, np.array([digest], np.int64))
        call.finish()
        return table

    table = execute(call, run, False)
    differ = [q for q in range(comm.size) if table[q] != digest]
    if differ:
        raise CollectiveMismatchError(f"new_group: rank {comm.rank} passed {ranks}; ranks "
                                      f"{differ} passed other lists")
    return comm.channel.derive(ranks, ("group", call.seq))


# -- the compiled entry (collectives/_entry.pyx) --------------------------------------
from commrt.collectives._entry import (all_gather, all_gatherv, all_reduce,  # noqa: E402
                                       all_to_all, all_to_allv, barrier, broadcast, gather,
                                       gatherv, reduce, reduce_scatter, scatter, scatterv)

_entry.bind(state_of=state_of, concurrent=_concurrent, all_reduce=_all_reduce,
            all_reduce_rest=_small.finish_go, plans_run=plans.run, plans_finish=plans.finish,
            barrier=_barrier, barrier_rest=_small.finish_barrier,
            general={"broadcast": _broadcast, "reduce": _reduce, "all_gather": _all_gather,
                     "gather": _gather, "scatter": _scatter, "reduce_scatter": _reduce_scatter,
                     "all_to_all": _all_to_all, "all_gatherv": _all_gatherv,
                     "gatherv": _gatherv, "scatterv": _scatterv, "all_to_allv": _all_to_allv})
