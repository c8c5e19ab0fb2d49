"""Rank-side functions of the prepared plans tests (collectives/plans.py)."""
import json
import os
import time

import numpy as np

import commrt.collectives as C
from commrt.collectives.plans import SchedPlan
from commrt.errors import CollectiveMismatchError, PeerLostError

from coll_ranks import check, data, digest, reference

KINDS = ["broadcast", "reduce", "gather", "scatter", "all_gather", "reduce_scatter",
         "all_to_all", "all_reduce"]
# kinds whose reference size (plans.applies's nbytes) is N blocks of the count
PER_BLOCK = ("gather", "scatter", "all_gather", "reduce_scatter", "all_to_all", "all_gatherv",
             "gatherv", "scatterv", "all_to_allv")


def planned(comm, kind, n=None):
    """Whether comm holds a plan of this collective (an all-reduce's: plans.py's on
    worlds that are not a power of two, _small.py's on the others); n: one for
    n elements per block."""
    return any(getattr(p, "kind", None) == kind and (isinstance(p, SchedPlan)
                                                     or kind == "all_reduce")
               and (n is None or kind in VKINDS or p.count in (n, comm.size * n))
               for p in comm.state["collectives"].small.values())


def call(comm, kind, seed, n, dtype="float32", op="SUM", root=0, general=False, comm_=None,
         algorithm=None):
    """One call of `kind` on fresh data (general: timeout= keeps it off the plan;
    algorithm: passed as algorithm=); checks it against NumPy; returns the
    digest of its output (None where the rank has none)."""
    c = comm_ or comm
    kw = {"timeout": 30} if general else {}
    if algorithm is not None:
        kw["algorithm"] = algorithm
    size, r = c.size, c.rank
    if kind == "broadcast":
        x = data(seed, r, n, dtype)
        assert C.broadcast(c, x, root, **kw) is x
        check(x, data(seed, root, n, dtype), None, "broadcast")
        return digest(x)
    if kind == "all_reduce":
        x = data(seed, r, n, dtype, op)
        assert C.all_reduce(c, x, op, **kw) is x
        want, tol = reference(seed, size, n, dtype, op)
        check(x, want, tol, "all_reduce")
        return digest(x)
    if kind == "reduce":
        x = data(seed, r, n, dtype, op)
        mine = x.copy()
        C.reduce(c, x, root, op, **kw)
        if r != root:
            check(x, mine, None, "reduce leaves non-roots alone")
            return None
        want, tol = reference(seed, size, n, dtype, op)
        check(x, want, tol, "reduce")
        return digest(x)
    if kind == "gather":
        x = data(seed, r, n, dtype)
        out = np.empty(size * n, dtype) if r == root else None
        res = C.gather(c, x, out, root, **kw)
        if r != root:
            assert res is None
            return None
        check(out, np.concatenate([data(seed, q, n, dtype) for q in range(size)]), None,
              "gather")
        return digest(out)
    if kind == "scatter":
        buf = data(seed, 1000, size * n, dtype) if r == root else None
        out = np.empty(n, dtype)
        C.scatter(c, out, buf, root, **kw)
        check(out, data(seed, 1000, size * n, dtype)[r * n:(r + 1) * n], None, "scatter")
        return digest(out)
    if kind == "all_gather":
        x = data(seed, r, n, dtype)
        out = np.empty(size * n, dtype)
        C.all_gather(c, out, x, **kw)
        check(out, np.concatenate([data(seed, q, n, dtype) for q in range(size)]), None,
              "all_gather")
        return digest(out)
    if kind == "reduce_scatter":
        x = data(seed, r, size * n, dtype, op)
        x0 = x.copy()
        out = np.empty(n, dtype)
        C.reduce_scatter(c, out, x, op, **kw)
        want, tol = reference(seed, size, size * n, dtype, op)
        sl = slice(r * n, (r + 1) * n)
        check(out, want[sl], None if tol is None else tol[sl], "reduce_scatter")
        check(x, x0, None, "reduce_scatter leaves buf alone")
        return digest(out)
    if kind == "all_to_all":
        x = data(seed, r, size * n, dtype)
        out = np.empty(size * n, dtype)
        C.all_to_all(c, out, x, **kw)
        want = np.concatenate([data(seed, q, size * n, dtype)[r * n:(r + 1) * n]
                               for q in range(size)])
        check(out, want, None, "all_to_all")
        return digest(out)
    if kind in VKINDS:
        return _vcall(c, kind, seed, n, dtype, root, kw)
    raise ValueError(kind)


# the variable-size collectives: rank q's block n + q elements (all_to_allv: rank q
# sends rank p n + (q + 2p) % 3)
VKINDS = ("all_gatherv", "gatherv", "scatterv", "all_to_allv")


def _vcall(c, kind, seed, n, dtype, root, kw):
    size, r = c.size, c.rank
    counts = [n + q for q in range(size)]
    blocks = [data(seed, q, counts[q], dtype) for q in range(size)]
    if kind == "all_gatherv":
        out = np.empty(sum(counts), dtype)
        C.all_gatherv(c, out, blocks[r], counts, **kw)
        check(out, np.concatenate(blocks), None, "all_gatherv")
        return digest(out)
    if kind == "gatherv":
        out = np.empty(sum(counts), dtype) if r == root else None
        res = C.gatherv(c, blocks[r], out, counts if r == root else None, root, **kw)
        if r != root:
            assert res is None
            return None
        check(out, np.concatenate(blocks), None, "gatherv")
        return digest(out)
    if kind == "scatterv":
        whole = data(seed, 1000, sum(counts), dtype)
        out = np.empty(counts[r], dtype)
        C.scatterv(c, out, whole if r == root else None, counts if r == root else None, root,
                   **kw)
        check(out, whole[sum(counts[:r]):sum(counts[:r + 1])], None, "scatterv")
        return digest(out)
    if kind == "all_to_allv":
        def cnt(q, p):
            return n + (q + 2 * p) % 3
        sends = [data(seed, q, sum(cnt(q, p) for p in range(size)), dtype) for q in range(size)]
        sc, rc = [cnt(r, p) for p in range(size)], [cnt(q, r) for q in range(size)]
        out = np.empty(sum(rc), dtype)
        C.all_to_allv(c, out, sends[r], sc, rc, **kw)
        want = np.concatenate([sends[q][sum(cnt(q, p) for p in range(r)):
                                        sum(cnt(q, p) for p in range(r + 1))]
                               for q in range(size)])
        check(out, want, None, "all_to_allv")
        return digest(out)
    raise ValueError(kind)


def same_results(comm, kind, n, dtype, op, root):
    """Planned calls against the general path on the same data: (planned digests,
    general digests, whether a plan was taken)."""
    call(comm, kind, 1, n, dtype, op, root)             # the first call prepares the plan
    planned_out = [call(comm, kind, 10 + i, n, dtype, op, root) for i in range(3)]
    general_out = [call(comm, kind, 10 + i, n, dtype, op, root, True) for i in range(3)]
    return planned_out, general_out, planned(comm, kind, n)


def layout_results(comm, kind, n, root):
    """same_results on the algorithm COMMRT_<KIND>_ALGO forces, with the algorithms
    of the plans comm then holds for kind."""
    res = same_results(comm, kind, n, "float32", "SUM", root)
    algos = sorted({p.algo for p in comm.state["collectives"].small.values()
                    if isinstance(p, SchedPlan) and p.kind == kind})
    return res, algos


def traffic(comm, kind, n, root=0):
    """Per-peer payload bytes sent and received, and header bytes, of one planned and
    one general call (after a warm-up that prepares the plan)."""
    out = []
    call(comm, kind, 1, n, root=root)
    for general in (False, True):
        C.barrier(comm)
        s0 = comm.stats()
        C.barrier(comm)
        call(comm, kind, 2, n, root=root, general=general)
        C.barrier(comm)
        s1 = comm.stats()
        C.barrier(comm)
        # (messages received would count a peer's barrier message racing the snapshot)
        out.append({q: [s1[q][f] - s0[q][f] for f in ("bytes_sent", "bytes_recv", "msgs_sent")]
                    for q in s1 if q in s0})
    return out, planned(comm, kind, n)


def binomial_reads(comm, n, root):
    """Header bytes this rank received from its parent in one planned and one
    general binomial broadcast of n float32 (after a warm-up that prepares the
    plan), whether the plan was taken, and the copier the algorithm chose."""
    v = (comm.rank - root) % comm.size
    parent = None if v == 0 else (comm.rank - (v & -v)) % comm.size
    call(comm, "broadcast", 1, n, root=root, algorithm="binomial")
    out = []
    for general in (False, True):
        C.barrier(comm)
        s0 = comm.stats()
        call(comm, "broadcast", 2 + general, n, root=root, general=general, algorithm="binomial")
        s1 = comm.stats()
        C.barrier(comm)
        out.append(None if parent is None else
                   s1[parent]["header_bytes_recv"] - s0[parent]["header_bytes_recv"])
    copier = comm.state["collectives"].cache.get("binomial copier")
    return out, planned(comm, "broadcast", n), copier


def broken_layout(comm, n, bad_rank):
    """Rank bad_rank's binomial-broadcast layout raises (a layout's bug): its
    calls run on the general path, beside the other ranks' plans.  Per rank:
    the digests of 4 calls from varying roots (checked against NumPy), whether
    it holds a plan, and the warnings it gave."""
    import warnings

    from commrt.collectives import plans

    if comm.rank == bad_rank:
        def broken(*args):
            raise ValueError("a layout bug")
        plans.LAYOUTS[("broadcast", "binomial")] = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [call(comm, "broadcast", 40 + i, n, root=i % comm.size, algorithm="binomial")
               for i in range(4)]
    return out, planned(comm, "broadcast", n), [str(w.message) for w in caught]


def mismatch(comm, kind):
    """Warm the plan on a fresh group, then rank 1 makes a call of another count
    (each rank still on its plan or falling to the general path)."""
    sub = C.new_group(comm, list(range(comm.size)))
    for _ in range(2):
        call(comm, kind, 1, 4, comm_=sub)
        call(comm, kind, 1, 5, comm_=sub)
    C.barrier(comm)
    try:
        call(comm, kind, 2, 5 if sub.rank == 1 else 4, comm_=sub)
        C.barrier(sub, timeout=30)
    except CollectiveMismatchError as exc:
        return "raised", str(exc), planned(sub, kind)
    except AssertionError as exc:           # a wrong result: the worst outcome
        return "wrong", str(exc), planned(sub, kind)
    return "no error", "", planned(sub, kind)


def late_rank(comm, kind, late_s, n):
    """The plan warmed, rank 1 comes late_s seconds after the others (beyond the
    probe interval): the others' chains stop and hand over.  Returns the digest."""
    for _ in range(2):
        call(comm, kind, 1, n)
    C.barrier(comm)
    if comm.rank == 1:
        time.sleep(late_s)
    return call(comm, kind, 3, n), planned(comm, kind)


def dead_peer(comm, kind, outdir):
    """The last rank dies after warming the plan; the others see PeerLostError."""
    for _ in range(3):
        call(comm, kind, 1, 16)
    try:
        C.barrier(comm)             # a rank slow to leave it may hear of the death here
        if comm.rank == comm.size - 1:
            os._exit(3)
        call(comm, kind, 2, 16)
        C.barrier(comm)
        err = None
    except PeerLostError as exc:
        err = str(exc)
    with open(os.path.join(outdir, f"{comm.rank}.json"), "w") as f:
        json.dump([err, planned(comm, kind)], f)


def bounded(comm, count):
    """`count` broadcasts of distinct sizes: how many plans the communicator keeps."""
    for k in range(count):
        C.broadcast(comm, np.ones(k + 1, np.float32), 0)
    return len(comm.state["collectives"].small)


def timeout_on_plan(comm, sleep_s):
    """The plan warmed (root 1), rank 1 stays away: rank 0, waiting on its planned
    broadcast, must raise the general path's CommTimeoutError naming the call and
    rank 1; rank 1's next call then hears of the failure."""
    from commrt.errors import CommError, CommTimeoutError

    sub = C.new_group(comm, list(range(comm.size)))
    for _ in range(3):
        C.broadcast(sub, np.ones(4, np.float32), 1)
    C.barrier(comm)
    if comm.rank == 1:
        time.sleep(sleep_s)
        try:
            C.broadcast(sub, np.ones(4, np.float32), 1)
            C.barrier(sub, timeout=10)
        except CommError as exc:
            return type(exc).__name__, str(exc), planned(sub, "broadcast")
        return "no error", "", planned(sub, "broadcast")
    t0 = time.monotonic()
    try:
        C.broadcast(sub, np.ones(4, np.float32), 1)
    except CommTimeoutError as exc:
        return "CommTimeoutError", str(exc), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def alternating(comm, kind):
    """Planned calls of one kind whose size, dtype, op and root change from call to
    call (each collective remembers the plan it ran last): every result checked."""
    size = comm.size
    shapes = [(3, "float32", "SUM", 0), (5, "float64", "MAX", size - 1),
              (3, "float32", "SUM", 1 % size), (3, "int32", "SUM", 0), (3, "float32", "MAX", 0)]
    for rnd in range(3):
        for i, (n, dtype, op, root) in enumerate(shapes):
            call(comm, kind, 100 * rnd + i, n, dtype, op, root)
    return True


def no_spin(comm, kind):
    """set_spin(comm, False) after a plan was made, calls with rank 1 late (the
    others' waits sleep at once), a plan made afterwards, the general path, then
    set_spin(comm, True): (spin of the kept plans' chains after False, after the
    new plan, after True; digests planned with spin off, general with spin off,
    general with spin on; whether plans ran)."""
    call(comm, kind, 1, 7)                             # a plan, made spinning
    C.set_spin(comm, False)
    off = [p.chain.spin for p in comm.state["collectives"].small.values()]
    planned_out = []
    for i in range(3):
        if comm.rank == 1:
            time.sleep(0.05)
        planned_out.append(call(comm, kind, 20 + i, 7))
    call(comm, kind, 2, 300)                           # a new plan, made not spinning
    made = [p.chain.spin for p in comm.state["collectives"].small.values()]
    general_off = [call(comm, kind, 20 + i, 7, general=True) for i in range(3)]
    C.set_spin(comm, True)
    on = [p.chain.spin for p in comm.state["collectives"].small.values()]
    general_on = [call(comm, kind, 20 + i, 7, general=True) for i in range(3)]
    return off, made, on, planned_out, general_off, general_on, planned(comm, kind, 7)


def no_plan_remembered(comm):
    """A reduce-scatter whose blocks are above the eager limit on more than two
    ranks has no plan (its layout refuses it): the first call records that, the
    later ones look it up instead of building the schedule again."""
    from unittest import mock

    from commrt.collectives import registry

    m = 8192                              # 32 KiB float32 blocks: above 16 KiB
    buf = np.ones(comm.size * m, np.float32)
    out = np.empty(m, np.float32)
    st = C.state_of(comm)
    comm.reduce_scatter(out, buf)
    assert np.all(out == comm.size)
    algo = C._cost.choose("reduce_scatter", comm, buf.nbytes)
    miss = set(st.cache.get("no plan", ()))
    mod = registry.module("reduce_scatter", algo)
    with mock.patch.object(mod, "schedule", side_effect=AssertionError("built again")):
        for _ in range(3):
            comm.reduce_scatter(out, buf)
    assert np.all(out == comm.size)
    return algo, len(miss), "reduce_scatter" in str(miss)


def forced(comm, kind, algo, n, dtype="float32", op="SUM", root=0):
    """Calls naming their algorithm (algorithm=): after the first, do they run on
    a plan (no Call object made: a Call is the general path's) from the
    compiled entry (the general path's Python, which looks the plan up with
    _keyed_plan, not entered) with the general path's results?  (digests of 3
    such calls, of the same 3 calls on the general path (timeout=), Calls
    made by the first three, how many of them entered the general path)."""
    made, keyed = [], []
    general_call, general_lookup = C.Call, C._keyed_plan

    class Counted(general_call):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("algo"))
            super().__init__(*args, **kwargs)

    def counted_lookup(*args):
        keyed.append(1)
        return general_lookup(*args)

    call(comm, kind, 1, n, dtype, op, root, algorithm=algo)         # prepares the plan
    C.Call, C._keyed_plan = Counted, counted_lookup
    try:
        planned_out = [call(comm, kind, 10 + i, n, dtype, op, root, algorithm=algo)
                       for i in range(3)]
    finally:
        C.Call, C._keyed_plan = general_call, general_lookup
    general_out = [call(comm, kind, 10 + i, n, dtype, op, root, True, algorithm=algo)
                   for i in range(3)]
    return planned_out, general_out, made, len(keyed)


def v_counts_checked_on_the_plan(comm):
    """With all_gatherv's plan made, counts that are not ints, or are a generator
    or NumPy ints: (error type of float counts as a list and as a tuple, of too
    few counts, generator result right, NumPy ints took the plan (no Call
    made))."""
    n, r = comm.size, comm.rank
    counts = [2 + q for q in range(n)]
    buf = np.full(counts[r], r, np.float32)
    out = np.empty(sum(counts), np.float32)
    want = np.concatenate([np.full(c, q, np.float32) for q, c in enumerate(counts)])
    for _ in range(2):
        C.all_gatherv(comm, out, buf, counts)
    errors = []
    for _ in range(2):
        C.all_gatherv(comm, out, buf, tuple(counts))      # the compiled entry's memo: a tuple
    for bad in ([float(c) for c in counts], tuple(float(c) for c in counts), counts[:-1]):
        try:
            C.all_gatherv(comm, out, buf, bad)
            errors.append(None)
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__)
    out[:] = -1
    C.all_gatherv(comm, out, buf, (c for c in counts))
    gen_ok = bool(np.array_equal(out, want))
    made = []
    general_call = C.Call

    class Counted(general_call):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    C.Call = Counted
    try:
        out[:] = -1
        C.all_gatherv(comm, out, buf, np.array(counts, np.int64))
    finally:
        C.Call = general_call
    return errors, gen_ok, bool(np.array_equal(out, want)) and not made


def dbtree_mixed(comm, n, general_ranks):
    """dbtree all-reduces of n float32 where the ranks in general_ranks take the
    general path (timeout=: its sends do not wait) and the others their plan
    (one round a step, sends waited for): the digests of 3 calls after the one
    that prepares the plans, each checked against NumPy, and whether this
    rank holds the plan."""
    general = comm.rank in general_ranks
    out = []
    for i in range(4):
        x = data(20 + i, comm.rank, n, "float32")
        C.all_reduce(comm, x, "SUM", "dbtree", **({"timeout": 30} if general else {}))
        want, tol = reference(20 + i, comm.size, n, "float32", "SUM")
        check(x, want, tol, "dbtree all_reduce")
        out.append(digest(x))
    return out[1:], planned(comm, "all_reduce", n)


def scatter_copies(comm, n, root):
    """At the root, per other rank, the messages it wrote into that rank's buffer
    (stats' pushes) and the header bytes it sent it in one planned and one
    general scatter of n float32 a block (after a warm-up that prepares the
    plan).  Every rank: whether the plan was taken, and the copier the
    algorithm chose (scatter/linear.copier)."""
    from commrt.collectives.scatter import linear

    call(comm, "scatter", 1, n, root=root)
    out = []
    for general in (False, True):
        C.barrier(comm)
        s0 = comm.stats()
        call(comm, "scatter", 2 + general, n, root=root, general=general)
        s1 = comm.stats()
        C.barrier(comm)
        out.append(None if comm.rank != root else
                   {q: (s1[q]["pushes"] - s0[q]["pushes"],
                        s1[q]["header_bytes_sent"] - s0[q]["header_bytes_sent"])
                    for q in range(comm.size) if q != root})
    chan = comm.channel
    return (out, planned(comm, "scatter", n),
            linear.copier(chan, comm.state["collectives"].cache, 4 * n), chan.cma_min)


def exchange_pushes(comm, kind, n):
    """Per peer, the messages this rank wrote into that peer's buffer (stats'
    pushes) in one planned and one general call of kind (all_gather, direct,
    or all_to_all) with blocks of n float32 (after a warm-up that prepares the
    plan), whether the plan was taken, and the copier its module chose."""
    from commrt.collectives.all_gather import direct
    from commrt.collectives.all_to_all import pairwise

    algo = "direct" if kind == "all_gather" else None
    call(comm, kind, 1, n, algorithm=algo)
    out = []
    for general in (False, True):
        C.barrier(comm)
        s0 = comm.stats()
        call(comm, kind, 2 + general, n, general=general, algorithm=algo)
        s1 = comm.stats()
        C.barrier(comm)
        out.append({q: s1[q]["pushes"] - s0[q]["pushes"] for q in range(comm.size)
                    if q != comm.rank})
    mod = direct if kind == "all_gather" else pairwise
    return (out, planned(comm, kind, n),
            mod.copier(comm.channel, comm.state["collectives"].cache, 4 * n))


def v_copies(comm, kind, algo, n, root=0):
    """What this rank sent each other rank in one planned and one general call of
    a variable-size kind (blocks of n + q float32, as _vcall's; after a warm-up
    that prepares the plan): per peer, (messages written into its buffer: stats'
    pushes, header bytes, messages).  Also whether the plan was taken, the
    copier of each receive in the plan ({peer: copier}), and the single-copy
    threshold."""
    from commrt.collectives.plans import RECV

    call(comm, kind, 1, n, root=root, algorithm=algo)
    out = []
    for general in (False, True):
        C.barrier(comm)
        s0 = comm.stats()
        call(comm, kind, 2 + general, n, root=root, general=general, algorithm=algo)
        s1 = comm.stats()
        C.barrier(comm)
        out.append({q: tuple(s1[q][k] - s0[q][k] for k in ("pushes", "header_bytes_sent",
                                                           "msgs_sent"))
                    for q in range(comm.size) if q != comm.rank})
    plan = [p for p in comm.state["collectives"].small.values()
            if isinstance(p, SchedPlan) and p.kind == kind and p.algo == algo][-1:]
    # (the last made: this size's; a world's earlier calls leave theirs)
    copiers = {m[1]: (m[8] if len(m) > 8 else 0) for p in plan for s in p.steps for m in s
               if m[0] == RECV}
    return out, bool(plan), copiers, comm.channel.cma_min


def v_compiled_entry(comm):
    """Per variable-size kind, after two calls that make its plan: how many of 20
    planned calls went through the Python plan lookup (plans.run, which the
    compiled entry never calls on a clean run), with counts as a list, the same
    counts as a tuple, and a new list object each call; then with NumPy int
    counts (the Python path's: still planned) and with other counts (a plan of
    their own).  Every output checked against NumPy."""
    from commrt.collectives import plans

    seen = {}
    python_runs = [0]
    plain_run = plans.run

    def counted(*args, **kwargs):
        python_runs[0] += 1
        return plain_run(*args, **kwargs)

    for kind in VKINDS:
        for _ in range(2):
            _vcall(comm, kind, 1, 5, "float32", 0, {})
        plans.run = counted
        try:
            per = {}
            for how in ("list", "tuple", "new list", "numpy", "other counts"):
                python_runs[0] = 0
                for i in range(20):
                    _vcall_counts(comm, kind, 2 + i, how)
                per[how] = python_runs[0]
            seen[kind] = per
        finally:
            plans.run = plain_run
    return seen


def _vcall_counts(c, kind, seed, how):
    """_vcall's call with its counts given as `how` says (5 + q elements a block, or
    6 + q for "other counts")."""
    size, r = c.size, c.rank
    base = 6 if how == "other counts" else 5
    counts = [base + q for q in range(size)]

    def given(cs):
        if how == "tuple":
            return tuple(cs)
        if how == "numpy":
            return np.array(cs, np.int64)
        return list(cs)                     # a new list object every call
    blocks = [data(seed, q, counts[q], "float32") for q in range(size)]
    if kind == "all_gatherv":
        out = np.empty(sum(counts), np.float32)
        C.all_gatherv(c, out, blocks[r], given(counts))
        check(out, np.concatenate(blocks), None, kind)
    elif kind == "gatherv":
        out = np.empty(sum(counts), np.float32) if r == 0 else None
        C.gatherv(c, blocks[r], out, given(counts) if r == 0 else None, 0)
        if r == 0:
            check(out, np.concatenate(blocks), None, kind)
    elif kind == "scatterv":
        whole = data(seed, 1000, sum(counts), "float32")
        out = np.empty(counts[r], np.float32)
        C.scatterv(c, out, whole if r == 0 else None, given(counts) if r == 0 else None, 0)
        check(out, whole[sum(counts[:r]):sum(counts[:r + 1])], None, kind)
    else:
        def cnt(q, p):
            return base + (q + 2 * p) % 3
        sends = [data(seed, q, sum(cnt(q, p) for p in range(size)), "float32")
                 for q in range(size)]
        out = np.empty(sum(cnt(q, r) for q in range(size)), np.float32)
        C.all_to_allv(c, out, sends[r], given([cnt(r, p) for p in range(size)]),
                      given([cnt(q, r) for q in range(size)]))
        want = np.concatenate([sends[q][sum(cnt(q, p) for p in range(r)):
                                        sum(cnt(q, p) for p in range(r + 1))]
                               for q in range(size)])
        check(out, want, None, kind)


def buffer_offsets(comm):
    """After every kind's planned calls and a ring reduce-scatter on the general
    path (receives into state scratch): each kept plan's scratch and each scratch
    buffer's start mod 64 (the kernel's copy is slow between addresses that
    differ there, and PyTorch's tensors start at multiples of 64)."""
    for kind in KINDS:
        call(comm, kind, 1, 3000)
        call(comm, kind, 2, 3000)
    buf = np.ones(comm.size * 5000, np.float32)
    C.reduce_scatter(comm, np.zeros(5000, np.float32), buf, algorithm="ring")
    st = comm.state["collectives"]
    plans = [p.tmp.ctypes.data % 64 for p in st.small.values()
             if getattr(p, "tmp", None) is not None and p.tmp.nbytes]
    return plans, [b.ctypes.data % 64 for b in st._scratch.values()]
