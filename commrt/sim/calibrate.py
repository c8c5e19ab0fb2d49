"""This machine's α, β, γ for the simulator, from commrt's own calibration (cost.params),
and the fits that turn point-to-point patterns timed here (validate.py) into the
engine's parameters: the pattern is run through the engine itself and the
parameter solved for, so the engine gives back the measured time.

A module of its own: the spawned ranks of commrt.testing.World import the
function they run, which a ``python -m`` main module cannot give them.
"""


def _measure(comm):
    from commrt.collectives import cost

    p = cost.params(comm)
    return p.alpha, p.beta, p.gamma


def calibrated():
    """(α, β, γ) of shared memory and (α, β) of TCP on loopback, measured here."""
    from commrt.testing import World

    out = {}
    for transport in ("shm", "tcp"):
        with World(2, transport=transport, env={"COMMRT_COST_CACHE": ""}, timeout=120) as w:
            out[transport] = w.run(_measure)[0]
    return out


def pattern_steps(n, pairs_of, count):
    """rank -> steps of a point-to-point pattern: per (dst, src) of pairs_of(rank),
    one step that sends count elements to dst and receives as many from src at
    once, as an exchange step does (validate._exchange); no combining."""
    def steps(r):
        return [[("send", dst, 0, count), ("recv", src, 0, count)] for dst, src in pairs_of(r)]
    return steps


def shift_steps(n, count):
    """rank -> steps of the shift exchange ``validate``'s calibration times: in
    step d (1..n-1) every rank sends to rank + d and receives from rank - d."""
    return pattern_steps(n, lambda r: [((r + d) % n, (r - d) % n) for d in range(1, n)], count)


def bisect(sim, want, hi, iters=48):
    """The x >= 0 at which sim(x), non-decreasing, equals want (0 where sim(0)
    already reaches it)."""
    if sim(0.0) >= want:
        return 0.0
    lo = 0.0
    while sim(hi) < want:
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sim(mid) < want else (lo, mid)
    return (lo + hi) / 2


def fit_pattern(topo, field, steps, nsteps, seconds, itemsize=1, hi=None):
    """The value of topo's ``field`` (a float, or a curve given as ((1, x),)) at
    which the engine takes ``seconds`` per step of the pattern ``steps``."""
    import dataclasses

    from commrt.sim.engine import simulate

    curve = isinstance(getattr(topo, field), tuple)

    def sim(x):
        t = dataclasses.replace(topo, **{field: ((1, x),) if curve else x}, call=0.0)
        return simulate(t, steps, itemsize=itemsize, shortcut=False)
    return bisect(sim, seconds * nsteps, hi or seconds)


def fit_alpha(topo, nbytes, seconds, itemsize=1):
    """The α (s) at which the engine, on topo (its ``alpha_at`` replaced), takes
    ``seconds`` per step of shift_steps with nbytes messages: the measured
    time of all ranks exchanging at once, turned into the per-message cost the
    engine charges (it queues α with the copy on the shared cores).  Never
    below 0: a measurement faster than the copies alone gives 0."""
    import dataclasses

    if not topo.oversubscribed:
        raise ValueError("α per size is fitted only where ranks outnumber the cores")
    n = topo.ranks
    return fit_pattern(dataclasses.replace(topo, alpha_at=((1, 0.0),), alpha_oversub=None),
                       "alpha_at", shift_steps(n, max(1, nbytes // itemsize)), n - 1,
                       seconds, itemsize)
