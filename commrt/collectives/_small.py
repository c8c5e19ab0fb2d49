"""The small-message path: all-reduce by recursive doubling, and the barrier,
with no per-call set-up.

A tiny all-reduce (a loss, a flag, a counter) is all latency.  The general
path spends several microseconds in Python before its first message
(argument checks, the reducer, the cost model, a Call object), several
times the transport's own latency.  Here, the first call of a given
(shape, dtype, op) on a communicator that the cost model sends to
recursive doubling prepares a Plan: the fingerprint without its sequence
number, the partner and operand order of each step, a scratch buffer and
the NumPy ufunc that reduces (``commrt.kernels.reduce.binary_ufunc``).
Later calls only stamp the sequence number and, per step, make one engine
call (``Communicator._exchange``: post the receive, send, wait) and one
ufunc call.

The barrier gets the same treatment (its plan: the dissemination rounds).
The messages, fingerprints and operand order are exactly those of
``allreduce/recursive_doubling.py`` for a power-of-two world and of
``algorithms/barrier.py``, so a rank on this path and a rank on the
general one interoperate, and results stay bitwise equal.  Anything unusual -- no answer within the probe interval,
a send still in flight, an error, a fingerprint that differs -- hands the
call over to a Call with the same sequence number, which waits, probes,
reports mismatches and lost peers exactly as the general path does.
"""
import numpy as np

from commrt.collectives._engine import ALGO_CODE, DTYPE_CODE, KIND_CODE, TAG, Call, pack
from commrt.errors import CommError

ALGO = "recursive_doubling"
MAX_PLANS = 64          # distinct (shape, dtype, op) kept per communicator


class Plan:
    """One prepared collective: fingerprint base, steps (send to, receive from,
    whether our operand goes first), scratch, the reducing ufunc (None: barrier)."""
    __slots__ = ("kind", "algo", "base", "count", "nbytes", "dtype", "op", "ufunc", "tmp",
                 "steps", "exchange", "wait", "avg")

    def __init__(self, comm, st, kind, algo, buf, op, ufunc, avg, steps):
        self.kind, self.algo = kind, algo
        self.count = buf.size if ufunc is not None else 0
        self.nbytes = buf.nbytes
        self.dtype = buf.dtype if ufunc is not None else None
        self.op = op
        self.base = pack(0, KIND_CODE[kind], ALGO_CODE[algo], self.count,
                         DTYPE_CODE[buf.dtype] if ufunc is not None else 0,
                         op.value if op is not None else 0, 0)
        self.ufunc = ufunc
        self.tmp = np.empty_like(buf)
        self.steps = steps
        self.exchange = comm._coll._exchange
        self.wait = min(st.probe_s, st.timeout)
        self.avg = avg


def state_if_idle(comm):
    """The communicator's collectives state when the small path may run now: it has
    run a collective before, none is queued (async ones run first, in order), and
    no mismatch has poisoned it.  Else None."""
    st = comm.state.get("collectives")
    if st is None or st.pending or st.poisoned is not None:
        return None
    return st


def prepare(comm, st, buf, key, op):
    """Remember a Plan for all-reduces like this one, where the path applies."""
    from commrt.kernels.reduce import binary_ufunc

    n, r = comm.size, comm.rank
    if n < 2 or n & (n - 1) or buf.dtype not in DTYPE_CODE:
        return
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        return
    avg = op.name == "AVG"
    ufunc = binary_ufunc("sum" if avg else op.kernel, buf.dtype)
    if ufunc is None:
        return
    # exchange with r XOR mask; the lower rank's partial result is the left operand
    steps = []
    mask = 1
    while mask < n:
        steps.append((r ^ mask, r ^ mask, r < r ^ mask))
        mask <<= 1
    _keep(st, key, Plan(comm, st, "all_reduce", ALGO, buf, op, ufunc, avg, steps))


def prepare_barrier(comm, st):
    """The dissemination barrier's Plan (algorithms/barrier.py): round k sends an
    empty message to r + 2^k and receives one from r - 2^k."""
    n, r = comm.size, comm.rank
    steps = []
    d = 1
    while d < n:
        steps.append(((r + d) % n, (r - d) % n, True))
        d <<= 1
    plan = Plan(comm, st, "barrier", "dissemination", np.zeros(0, np.uint8), None, None,
                False, steps)
    _keep(st, "barrier", plan)
    return plan


def _keep(st, key, plan):
    if len(st.small) >= MAX_PLANS:
        st.small.clear()
    st.small[key] = plan


def run(comm, st, buf, plan):
    """Run the collective in place on buf along its Plan; returns buf, or None
    (having done nothing) when buf does not fit this path."""
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        return None
    seq = st.seq
    st.seq = seq + 1
    meta = plan.base | (seq & 0xFFFF)
    st.history.append((seq, meta, plan.count))
    tmp, f = plan.tmp, plan.ufunc
    for i, (dst, src, first) in enumerate(plan.steps):
        rq, sq = plan.exchange(buf, dst, tmp, src, TAG, meta, plan.wait)
        if not (rq.done and sq.done):
            return _resume(comm, buf, plan, seq, i, rq, sq)
        try:
            status = rq.status
        except CommError:
            return _resume(comm, buf, plan, seq, i, rq, sq)
        if status.meta != meta or status.nbytes != plan.nbytes:
            return _resume(comm, buf, plan, seq, i, rq, sq)
        if f is not None:
            _combine(f, buf, tmp, first)
    if plan.avg:
        _average(buf, comm.size)
    return buf


def _resume(comm, buf, plan, seq, i, rq, sq):
    """Finish the call from step i with a Call (same sequence number): it waits
    with deadlines and probes, and raises what the general path would."""
    call = Call(comm, plan.kind, count=plan.count, dtype=plan.dtype, op=plan.op,
                algo=plan.algo, seq=seq)
    call.start()
    tmp, f = plan.tmp, plan.ufunc
    try:
        call.complete_exchange(rq, sq, plan.steps[i][1], plan.nbytes)
        for j in range(i, len(plan.steps)):
            dst, src, first = plan.steps[j]
            if j > i:
                call.exchange(buf, dst, tmp, src)
            call.wait_sends()               # the partner has our copy; buf may change now
            if f is not None:
                _combine(f, buf, tmp, first)
        call.end()
    finally:
        call.state.current = None
    if plan.avg:
        _average(buf, comm.size)
    return buf


def _combine(f, buf, tmp, first):
    """buf = buf OP tmp, or tmp OP buf: the lower rank's operand always goes first."""
    if first:
        f(buf, tmp, out=buf)
    else:
        f(tmp, buf, out=buf)


def _average(buf, n):
    from commrt.kernels.reduce import scale_into

    scale_into(buf, n)
