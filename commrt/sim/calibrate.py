"""This machine's α, β, γ for the simulator, from commrt's own calibration (cost.params).

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
