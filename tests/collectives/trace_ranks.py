"""Rank side of test_schedule_trace.py: every message an algorithm posts through
its Call (isend, irecv, irecv_reduce, exchange), recorded where the runtime
posts it, for comparison with the algorithm's own schedule.

A record is (direction, op, world rank of the peer, context, place, elements):
direction "send" or "recv"; op "send", "recv" (plain receive) or "combine"
(a receive combined as it lands: irecv_reduce, or exchange with a hook);
context the communicator's context id and the message's tag (dbtree's
trees run on lanes of the call, tags of their own; hierarchical's steps on
derived communicators); place the element offset of the
message's buffer in the array the schedule's positions refer to (per
collective: ARRAYS), or None when it lies elsewhere (scratch: a partial
result, a receive slot; or a copy of the same data, as a block of buf that
the schedule places in out)."""
import numpy as np

import commrt.collectives as C
from commrt.collectives.call import Call
from commrt.collectives.fingerprint import TAG

_LOG = None          # list while recording, else None
_ARRAYS = {}         # "send" / "recv": the array the schedule's positions refer to


def _place(view, a):
    if a is None:
        return None
    addr = view.__array_interface__["data"][0]
    base = a.__array_interface__["data"][0]
    if base <= addr < base + a.nbytes and view.dtype == a.dtype:
        return (addr - base) // a.itemsize
    return None


def _record(call, direction, op, peer, view, tag=TAG):
    if _LOG is not None:
        view = np.asarray(view)     # a memoryview (the barrier's empty messages), as an array
        _LOG.append((direction, op, call.comm._world[peer], (call.comm._ctx, tag),
                     _place(view, _ARRAYS.get(direction)), view.size))


def _install():
    if getattr(Call, "_traced", False):
        return
    isend, irecv, irecv_reduce, exchange = Call.isend, Call.irecv, Call.irecv_reduce, Call.exchange

    def t_isend(self, buf, dst, tag=TAG):
        _record(self, "send", "send", dst, buf, tag)
        return isend(self, buf, dst, tag)

    def t_irecv(self, buf, src, copier=0, tag=TAG):
        _record(self, "recv", "recv", src, buf, tag)
        return irecv(self, buf, src, copier, tag)

    def t_irecv_reduce(self, buf, src, hook, copier=0, tag=TAG):
        _record(self, "recv", "combine", src, buf, tag)
        return irecv_reduce(self, buf, src, hook, copier, tag)

    def t_exchange(self, sbuf, dst, rbuf, src, hook=0):
        _record(self, "send", "send", dst, sbuf)
        _record(self, "recv", "combine" if hook else "recv", src, rbuf)
        return exchange(self, sbuf, dst, rbuf, src, hook)

    Call.isend, Call.irecv, Call.irecv_reduce, Call.exchange = (t_isend, t_irecv,
                                                                t_irecv_reduce, t_exchange)
    Call._traced = True


def _counts(n, seed):
    rng = np.random.default_rng(seed)
    return [int(c) for c in rng.choice([0, 1, 7, 300], n)]


def trace(comm, coll, algo, count, root=0, seed=0):
    """The records of one call of coll with algorithm algo (its arguments built
    from count, root and, for the variable-size collectives, counts from seed:
    the test rebuilds the same), after an untraced warm-up."""
    global _LOG
    _install()
    n, r = comm.size, comm.rank
    x = np.arange(count, dtype=np.float32)
    big = np.zeros(count * n, np.float32)
    small = np.zeros(count, np.float32)
    vc = _counts(n, seed)
    m = np.array([_counts(n, seed * 1000 + q) for q in range(n)])   # m[q][p]: q sends to p
    vin = np.ones(vc[r], np.float32)
    vout = np.zeros(sum(vc), np.float32)
    ain, aout = np.ones(int(m[r].sum()), np.float32), np.zeros(int(m[:, r].sum()), np.float32)
    inp = big.copy()
    arrays = {"all_reduce": (x, x), "broadcast": (x, x), "reduce": (x, x),
              "all_gather": (big, big), "reduce_scatter": (big, small), "gather": (x, big),
              "scatter": (big, small), "all_to_all": (inp, big), "barrier": (None, None),
              "all_gatherv": (vout, vout), "gatherv": (vin, vout), "scatterv": (vout, vin),
              "all_to_allv": (ain, aout)}[coll]
    kw = {"algorithm": algo, "timeout": 60}

    def once():
        if coll == "all_reduce":
            C.all_reduce(comm, x, "SUM", algo, timeout=60)
        elif coll == "broadcast":
            C.broadcast(comm, x, root, **kw)
        elif coll == "reduce":
            C.reduce(comm, x, root, "SUM", **kw)
        elif coll == "all_gather":
            C.all_gather(comm, big, x, **kw)
        elif coll == "reduce_scatter":
            C.reduce_scatter(comm, small, big, "SUM", **kw)
        elif coll == "gather":
            C.gather(comm, x, big if r == root else None, root, **kw)
        elif coll == "scatter":
            C.scatter(comm, small, big if r == root else None, root, **kw)
        elif coll == "all_to_all":
            C.all_to_all(comm, big, inp, **kw)
        elif coll == "barrier":
            C.barrier(comm, timeout=60)
        elif coll == "all_gatherv":
            C.all_gatherv(comm, vout, vin, vc, **kw)
        elif coll == "gatherv":
            C.gatherv(comm, vin, vout if r == root else None, vc, root, **kw)
        elif coll == "scatterv":
            C.scatterv(comm, vin, vout if r == root else None, vc, root, **kw)
        elif coll == "all_to_allv":
            C.all_to_allv(comm, aout, ain, [int(c) for c in m[r]], [int(c) for c in m[:, r]],
                          **kw)
        else:
            raise ValueError(coll)

    once()
    C.barrier(comm, timeout=60)
    _LOG = []
    _ARRAYS.update(send=arrays[0], recv=arrays[1])
    try:
        once()
    finally:
        log, _LOG = _LOG, None
        _ARRAYS.clear()
    C.barrier(comm, timeout=60)
    return log, schedule_of(comm, coll, algo, count, root, vc, m)


def schedule_of(comm, coll, algo, count, root, vc, m):
    """The algorithm's own schedule for this rank, as (op, peer, lo, hi, ctx) per
    message and step (computed here: the segment size is this rank's config)."""
    from commrt.collectives import registry

    mod = registry.module(coll, algo)
    n, r = comm.size, comm.rank
    kw = {}
    if coll == "all_reduce" and algo == "hierarchical":
        from commrt.collectives.all_reduce import hierarchical
        kw["groups"] = hierarchical.host_groups(comm)
    if coll == "all_to_allv":
        arg = [[int(c) for c in row] for row in m]
    elif coll.endswith("v"):
        arg = vc
    else:
        arg = count * n if coll == "reduce_scatter" else count
    return [[(msg.op, msg.peer, msg.lo, msg.hi, msg.ctx) for msg in step]
            for step in mod.schedule(n, r, arg, root, **kw)]
