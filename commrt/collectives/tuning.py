"""Measured choice for large calls: the candidates the cost model cannot tell
apart are timed, once per size class, inside the first call that needs them.

Why.  From a few MiB up the model's one β (a 1 MiB exchange) misjudges what
happens on a real host: a one-way message whose both cores copy (a split read)
runs 2-3x faster per byte than an exchange's halves, segments that stay in
cache beat halves that do not, and the host's fast and slow states move all of
these.  At N = 2 from 8 MiB the model's Rabenseifner was 1.18-1.37x the best
fixed algorithm (docs/performance-collectives.md).  Such a call takes
milliseconds, so timing the plausible candidates once costs a few calls.

How.  `choice` runs inside the user's call, on every rank at the same point
(cost.choose runs there, as its calibration does): one internal "tune" call,
serving the user's, that takes no sequence number of its own.  The
candidates (predicted within SPREAD of the model's pick) run on scratch
buffers of the call's size (at most MAX_BYTES): one untimed round (a first
run pays for scratch and fresh pages, up to 4x), one timed round after which
those DROP slower than its fastest stop, then the rest of TIMED_ROUNDS, the
order reversed every other round so that a slow spell of the host hits all;
a barrier starts each run, so no candidate inherits another's skew.  Rank
0's medians decide (it times the whole call as its peers do) and it
broadcasts the winner, which holds for the call's size class (a power of
two) on that communicator.  The model's pick stands unless another is KEEP
faster: noise must not flip a choice the model already got right.
"""
import time

from commrt import _lazy, config

np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)

SPREAD = 2.5         # candidates: predicted within this factor of the model's best
KEEP = 1.05          # the model's choice stands unless another is this much faster
TIMED_ROUNDS = 5
DROP = 1.5           # after one round, candidates this much slower than its fastest stop
MAX_BYTES = 32 << 20  # larger calls are tuned at this size (the same memory-bound regime)
BUDGET_S = 0.5       # predicted seconds of the rounds that run every candidate


def size_class(nbytes):
    return int(nbytes).bit_length()


def applies(collective, comm, nbytes):
    """Whether a call of nbytes of collective is chosen by measurement."""
    return (collective in _TRIALS and comm.size > 1 and config.get("COMMRT_TUNE")
            and nbytes >= max(1, config.get("COMMRT_TUNE_MIN_BYTES")))


def tuned(collective, comm):
    """{size class: algorithm} measured so far for collective on comm."""
    from commrt.collectives.state import state_of

    return dict(state_of(comm).cache.get(("tuned", collective)) or {})


def choice(collective, comm, nbytes, pred, model, p, timeout=None):
    """The algorithm for a call of nbytes: its size class's measured winner,
    measured now if this is the class's first call.  pred: the cost model's
    {algorithm: seconds} at nbytes (every rank's the same); model: its pick."""
    from commrt.collectives.state import state_of

    memo = state_of(comm).cache.setdefault(("tuned", collective), {})
    cls = size_class(nbytes)
    algo = memo.get(cls)
    if algo is None or algo not in pred:
        cands = candidates(pred, model)
        algo = model if len(cands) < 2 else _measure(collective, comm, nbytes, cands, model,
                                                     p, timeout)
        memo[cls] = algo
    return algo


def candidates(pred, model):
    """The algorithms worth timing, in the registry's order: those predicted
    within SPREAD of the model's pick (always one of them), the slowest dropped
    while the two rounds that run them all (warm-up, first) would take more
    than BUDGET_S by the model."""
    best = pred[model]
    cands = [a for a, t in pred.items() if t <= SPREAD * best]
    while len(cands) > 2 and 2 * sum(pred[a] for a in cands) > BUDGET_S:
        cands.remove(max((a for a in cands if a != model), key=pred.get))
    return cands


def _measure(collective, comm, nbytes, cands, model, p, timeout):
    from commrt.collectives import plans, registry
    from commrt.collectives.barrier import dissemination as _barrier
    from commrt.collectives.broadcast import binomial as _bcast
    from commrt.collectives.call import Call
    from commrt.collectives.state import execute

    trial = _TRIALS[collective](comm, min(nbytes, MAX_BYTES))
    names = registry.names(collective)
    call = Call(comm, "tune", count=trial.count, dtype=np.float32, algo="binomial",
                timeout=timeout, serving=collective)

    def run():
        times = {a: [] for a in cands}
        alive = list(cands)
        for rnd in range(-1, TIMED_ROUNDS):     # round -1 warms up: a first run pays
            if rnd == 1:                        # for scratch and pages (up to 4x)
                alive = _survivors(comm, call, times, model)
            for a in (alive if rnd % 2 == 0 else alive[::-1]):
                mod = registry.module(collective, a)
                _barrier.run(call)
                t0 = time.perf_counter()
                trial.run(mod, call)
                call.wait_sends()
                if rnd >= 0:
                    times[a].append(time.perf_counter() - t0)
        pick = np.zeros(1, np.float64)
        if comm.rank == 0:
            # the trials all take the general path; a call that runs on a prepared
            # plan does not pay the general path's own cost (cost.Params.call)
            took = {a: sorted(times[a])[len(times[a]) // 2]
                    - (p.call if plans.applies(collective, a, comm.size, nbytes) else 0.0)
                    for a in alive}
            pick[0] = names.index(decide(took, model))
        _bcast.run(call, pick, 0)
        call.wait_sends()
        return names[int(pick[0])]

    return execute(call, run, False)


def decide(took, model):
    """The winner given {candidate: seconds} (the model's pick among them): the
    fastest, unless the model's pick is within KEEP of it."""
    fastest = min(took, key=took.get)
    return model if took[model] <= KEEP * took[fastest] else fastest


def _survivors(comm, call, times, model):
    """The candidates worth more rounds after the first: those within DROP of the
    first round's fastest on rank 0, and the model's, broadcast so that every
    rank runs the same."""
    from commrt.collectives.broadcast import binomial as _bcast

    keep = np.zeros(len(times), np.float64)
    if comm.rank == 0:
        best = min(t[0] for t in times.values())
        keep[:] = [a == model or t[0] <= DROP * best for a, t in times.items()]
    _bcast.run(call, keep, 0)
    call.wait_sends()
    return [a for a, k in zip(times, keep) if k]


class _Trial:
    """Scratch buffers of one collective's call and how to run an algorithm on them."""

    def __init__(self, count, fn):
        self.count, self.fn = count, fn

    def run(self, mod, call):
        self.fn(mod, call)


def _floats(count):
    out = np.zeros(max(1, count), np.float32)
    out.fill(0)                                     # touched: no page faults timed
    return out


def _sum():
    from commrt.collectives.reduction import Reduction

    return Reduction(None, "sum", np.dtype(np.float32), False)


def _all_reduce(comm, nbytes):
    buf, red = _floats(nbytes // 4), _sum()
    return _Trial(buf.size, lambda mod, call: mod.run(call, buf, red))


def _broadcast(comm, nbytes):
    buf = _floats(nbytes // 4)
    return _Trial(buf.size, lambda mod, call: mod.run(call, buf, 0))


def _reduce(comm, nbytes):
    buf, red = _floats(nbytes // 4), _sum()
    return _Trial(buf.size, lambda mod, call: mod.run(call, buf, 0, red))


def _all_gather(comm, nbytes):
    """nbytes: the output's (cost.choose's reference size)."""
    block = max(1, nbytes // 4 // comm.size)
    out, buf = _floats(block * comm.size), _floats(block)
    return _Trial(block, lambda mod, call: mod.run(call, out, buf))


def _reduce_scatter(comm, nbytes):
    """nbytes: the input's (cost.choose's reference size)."""
    block = max(1, nbytes // 4 // comm.size)
    out, buf, red = _floats(block), _floats(block * comm.size), _sum()
    return _Trial(block, lambda mod, call: mod.run(call, out, buf, red))


# the collectives with a choice to make whose calls take one size (the variable-
# size ones take per-rank counts the size alone does not give)
_TRIALS = {"all_reduce": _all_reduce, "broadcast": _broadcast, "reduce": _reduce,
           "all_gather": _all_gather, "reduce_scatter": _reduce_scatter}
