"""The small-message path: all-reduce by recursive doubling, and the barrier,
with no per-call set-up.

A tiny all-reduce (a loss, a flag, a counter) is all latency.  The general
path spends several microseconds in Python before its first message
(argument checks, the reducer, the cost model, a Call object), several
times the transport's own latency.  Here, the first call of a given
(shape, dtype, op) on a communicator that the cost model sends to
recursive doubling prepares a Plan from that algorithm's own ``schedule``
(registry.Msg steps): the fingerprint without its sequence number, the
partner and operand order of each step, a scratch buffer, and a
persistent exchange chain (``Channel.exchange_chain``) bound to them,
whose steps end with the kernels' C combine loop for (op, dtype) with the
lower rank's operand first (``commrt.kernels.combine_address``).  Later
calls only stamp the sequence number and run the chain: one C call that,
step by step, posts the receive, sends, waits, checks and combines, and
allocates nothing.  Float16 has no C loop: its chain runs one step at a
time and a NumPy ufunc combines (``commrt.kernels.reduce.binary_ufunc``).

A larger all-reduce that the cost model sends to Rabenseifner gets a plan
too, on a power-of-two world when the reduction has a C loop (RangedPlan):
its halving and doubling steps are ranged chain steps over the buffer itself
(``all_reduce/rabenseifner.schedule``), each halving receive a
reduce-receive, so the whole call is again one C call with no scratch, and
its messages are exactly the general path's.

The barrier gets the same treatment (its plan: the dissemination rounds).
The messages, fingerprints and operand order are exactly those of
``all_reduce/recursive_doubling.py`` for a power-of-two world and of
``barrier/dissemination.py``, so a rank on this path and a rank on the general
one interoperate, and results stay bitwise equal.  Anything unusual -- no
answer within the probe interval, a send still in flight, an error, a
fingerprint or size that differs -- stops the chain at that step and hands
the step's requests and the call over to a Call with the same sequence
number, which waits, probes, reports mismatches and lost peers exactly as
the general path does.
"""
from commrt import _lazy

from commrt.collectives._entry import RANGED, SMALL, PlanCore
from commrt.collectives.call import Call
from commrt.collectives.fingerprint import DTYPE_CODE, SEQ_MASK, TAG, algo_code, kind_code, pack
from commrt.transport.buffers import aligned_empty
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)

ALGO = "recursive_doubling"
MAX_PLANS = 64          # distinct (shape, dtype, op) kept per communicator
# Rabenseifner plans only up to this size: what a plan saves is the general
# path's ~9 µs per call, under 0.1% beyond it; and at 64 MiB on N = 2 (32 MiB
# halves read with process_vm_readv) the planned call measured a heavier tail
# than the general one (median 7.2 against 6.8 ms, 6 interleaved slices; not
# understood yet), while at 16 MiB it was faster (1.01 against 1.10 ms).
RANGED_MAX_BYTES = 16 << 20


class Plan(PlanCore):
    """One prepared collective: fingerprint base, steps (send to, receive from,
    whether our operand goes first), scratch, the persistent exchange chain, and
    how to combine in Python (None: barrier).  `fused`: the chain combines with
    the kernels' C loop after each step, so one chain run is the whole call.
    (The fields the compiled entry reads are PlanCore's, _entry.pyx.)"""
    __slots__ = ("kind", "algo", "count", "nbytes", "op", "steps", "fused", "combine", "wait",
                 "avg", "first_last")
    ranged = False
    sched = False

    def __init__(self, comm, st, kind, algo, buf, op, kernel, ufunc, avg, steps):
        self.mode = SMALL
        self.kind, self.algo = kind, algo
        self.count = buf.size if kernel is not None else 0
        self.nbytes = buf.nbytes
        self.dtype = buf.dtype if kernel is not None else None
        self.op = op
        self.base, self.meta2 = pack(0, kind_code(kind), algo_code(kind, algo), self.count,
                         DTYPE_CODE[buf.dtype] if kernel is not None else 0,
                         op.value if op is not None else 0, 0)
        self.tmp = aligned_empty(buf.size, buf.dtype) if kernel is not None else buf   # barrier: 0 bytes
        self.steps = steps
        self.nsteps = len(steps)
        hooks = [0] * len(steps)
        self.combine = None
        self.fused = True
        if kernel is not None:
            from commrt.kernels import combine_address, combine_into

            hooks = [combine_address(kernel, buf.dtype, not first) for _, _, first in steps]
            if all(hooks):                  # C loop: the same one when finishing in Python
                self.combine = lambda b, t, first: combine_into(b, t, kernel, not first)
            else:                           # float16: one NumPy ufunc call per step
                hooks = [0] * len(steps)
                self.fused = False
                self.combine = lambda b, t, first: _combine(ufunc, b, t, first)
        self.chain = comm.channel.exchange_chain(
            [(dst, src, h) for (dst, src, _), h in zip(steps, hooks)], self.tmp, self.count, TAG)
        self.wait = min(st.probe_s, st.timeout)
        self.chain.stamp(self.base, self.meta2, self.wait, SEQ_MASK)
        self.avg = avg
        self.first_last = None if self.fused else 1   # how far the first chain run goes
        self.plain = self.fused and not avg             # nothing to do after a clean run


class RangedPlan(PlanCore):
    """A prepared Rabenseifner all-reduce: ranged chain steps over the in/out
    buffer (see the module text); the chain lets go of the buffer after each
    call, so a large buffer is not kept alive by the plan.  (plain stays False:
    finish() releases the buffer after every call.)"""
    __slots__ = ("kind", "algo", "count", "nbytes", "op", "steps", "fused", "wait", "avg",
                 "hook")
    ranged = True
    sched = False

    def __init__(self, comm, st, buf, op, hook, avg, steps):
        self.mode = RANGED
        self.kind, self.algo = "all_reduce", "rabenseifner"
        self.count, self.nbytes, self.dtype, self.op = buf.size, buf.nbytes, buf.dtype, op
        self.base, self.meta2 = pack(0, kind_code("all_reduce"),
                                     algo_code("all_reduce", "rabenseifner"),
                         buf.size,
                         DTYPE_CODE[buf.dtype], op.value, 0)
        self.steps = steps
        self.nsteps = len(steps)
        self.hook = hook
        isz = buf.itemsize
        self.chain = comm.channel.exchange_chain(
            [(p, p, s0 * isz, (s1 - s0) * isz, r0 * isz, (r1 - r0) * isz, hook if red else 0)
             for p, s0, s1, r0, r1, red in steps], None, 0, TAG, buf.nbytes, isz)
        self.fused = True
        self.wait = min(st.probe_s, st.timeout)
        self.chain.stamp(self.base, self.meta2, self.wait, SEQ_MASK)
        self.avg = avg

    first_last = None       # the first chain run is the whole call


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
    # the algorithm's own schedule: exchange with r XOR 2^k; the lower rank's
    # partial result is the left operand
    from commrt.collectives.all_reduce.recursive_doubling import schedule

    steps = [(snd.peer, rcv.peer, r < rcv.peer) for snd, rcv in _pairs(schedule(n, r, buf.size))]
    kernel = "sum" if avg else op.kernel
    _keep(st, key, Plan(comm, st, "all_reduce", ALGO, buf, op, kernel, ufunc, avg, steps))


def prepare_rabenseifner(comm, st, buf, key, op, hook):
    """Remember a RangedPlan for all-reduces like this one, where it applies."""
    from commrt.collectives.all_reduce.rabenseifner import schedule

    n = comm.size
    if n < 2 or n & (n - 1) or not hook or buf.dtype not in DTYPE_CODE:
        return
    if buf.nbytes > RANGED_MAX_BYTES:
        return
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        return
    steps = [(snd.peer, snd.lo, snd.hi, rcv.lo, rcv.hi, rcv.op == "combine")
             for snd, rcv in _pairs(schedule(n, comm.rank, buf.size))]
    _keep(st, key, RangedPlan(comm, st, buf, op, hook, op.name == "AVG", steps))


def prepare_barrier(comm, st):
    """The dissemination barrier's Plan (barrier/dissemination.py): round k sends an
    empty message to r + 2^k and receives one from r - 2^k."""
    from commrt.collectives.barrier.dissemination import Empty, schedule

    steps = [(snd.peer, rcv.peer, True) for snd, rcv in _pairs(schedule(comm.size, comm.rank))]
    plan = Plan(comm, st, "barrier", "dissemination", Empty(), None, None, None, False,
                steps)      # Empty: not a memoryview, which the collector may clear
    _keep(st, "barrier", plan)
    return plan


def _pairs(schedule):
    """(send, receive) Msg of each step of a pairwise schedule (registry.Msg): the
    plans run the algorithm's own schedule, never a re-derivation of it."""
    out = []
    for step in schedule:
        snd = [m for m in step if m.op == "send"]
        rcv = [m for m in step if m.op != "send"]
        if len(snd) != 1 or len(rcv) != 1:
            raise ValueError(f"not a pairwise step: {step}")
        out.append((snd[0], rcv[0]))
    return out


def _keep(st, key, plan):
    """Keep a plan, the oldest one making room beyond MAX_PLANS (a plan holds a
    chain and a scratch buffer: the cache must stay bounded; the entry's memos
    are dropped with it, so that no plan outside the cache runs again)."""
    if key not in st.small and len(st.small) >= MAX_PLANS:
        del st.small[next(iter(st.small))]
        st.forget_memos()
    plan.chain.spin = st.spin               # (set_spin sets it on every kept plan)
    st.small[key] = plan


def run(comm, st, buf, plan):
    """Run the collective in place on buf along its Plan; returns buf, or None
    (having done nothing) when buf does not fit this path.  (all_reduce runs
    these first lines itself, then finish(): a tiny call is ~1 µs, and each
    Python call level costs a tenth of it.)"""
    seq = st.seq
    meta = plan.base | (seq & SEQ_MASK)
    st.seq = seq + 1                        # begun (even if Ctrl-C stops the chain)
    st.history.append((seq, plan.base, plan.meta2))    # (readers OR the seq in)
    return finish(comm, st, buf, plan, seq, meta, plan.chain.run(buf, meta, plan.wait, 0,
                                                                  plan.first_last, plan.meta2))


def finish_go(comm, st, buf, plan, seq, i):
    """The compiled all_reduce's rest (collectives/_entry.pyx) once it has taken
    seq: i is what the plan's go() returned, or -2 when the plan is not plain
    (its first chain run is this function's)."""
    meta = plan.base | (seq & SEQ_MASK)
    if i == -2:
        i = plan.chain.run(buf, meta, plan.wait, 0, plan.first_last, plan.meta2)
    return finish(comm, st, buf, plan, seq, meta, i)


def finish_barrier(comm, st, plan, seq, i):
    """The compiled barrier's rest once its chain stopped at step i."""
    finish(comm, st, plan.tmp, plan, seq, plan.base | (seq & SEQ_MASK), i)


def finish(comm, st, buf, plan, seq, meta, i):
    """The rest of run() once the plan's first chain run returned i."""
    if plan.fused and i == plan.nsteps:     # the whole call, in one C call
        if plan.ranged:
            plan.chain.release()
        if plan.avg:
            _average(buf, comm.size)
        return buf
    if i < 0:                               # not C-contiguous and writable: nothing sent
        st.seq = seq
        st.history.pop()
        return None
    if not plan.fused:                      # one step per chain run, combined here
        j, n = 0, plan.nsteps
        while i == j + 1:
            plan.combine(buf, plan.tmp, plan.steps[j][2])
            j = i
            if j == n:
                break
            i = plan.chain.run(buf, meta, plan.wait, j, j + 1, plan.meta2)
        if i == n:
            if plan.avg:
                _average(buf, comm.size)
            return buf
    return _resume(comm, buf, plan, seq, i)


def _resume(comm, buf, plan, seq, i):
    """Finish the call from step i, whose requests the chain handed over, with a
    Call (same sequence number): it waits with deadlines and probes, and raises
    what the general path would."""
    rq, sq = plan.chain.handover()
    if plan.ranged:
        plan.chain.release()
    call = Call(comm, plan.kind, count=plan.count, dtype=plan.dtype, op=plan.op,
                algo=plan.algo, seq=seq)
    call.run(lambda: (_rest_ranged if plan.ranged else _rest)(call, buf, plan, i, rq, sq))
    if plan.avg:
        _average(buf, comm.size)
    return buf


def _rest(call, buf, plan, i, rq, sq):
    """Whole-buffer steps i.. as the general recursive doubling runs them."""
    tmp, combine = plan.tmp, plan.combine
    call.complete_exchange(rq, sq, plan.steps[i][1], plan.nbytes)
    for j in range(i, len(plan.steps)):
        dst, src, first = plan.steps[j]
        if j > i:
            call.exchange(buf, dst, tmp, src)
        call.wait_sends()               # the partner has our copy; buf may change now
        if combine is not None:
            combine(buf, tmp, first)


def _rest_ranged(call, buf, plan, i, rq, sq):
    """Ranged steps i.. as the general Rabenseifner runs them (Call.exchange,
    combining as the data lands)."""
    flat = buf.reshape(-1)
    isz = flat.itemsize
    partner, _, _, r0, r1, _ = plan.steps[i]
    call.complete_exchange(rq, sq, partner, (r1 - r0) * isz)
    call.wait_sends()                   # each step's send ends before the next step
    for partner, s0, s1, r0, r1, red in plan.steps[i + 1:]:
        call.exchange(flat[s0:s1], partner, flat[r0:r1], partner, plan.hook if red else 0)
        call.wait_sends()


def _combine(f, buf, tmp, first):
    """buf = buf OP tmp, or tmp OP buf: the lower rank's operand always goes first."""
    if first:
        f(buf, tmp, out=buf)
    else:
        f(tmp, buf, out=buf)


_scale = []


def _average(buf, n):
    if not _scale:
        from commrt.kernels.reduce import scale_into

        _scale.append(scale_into)
    _scale[0](buf, n)
