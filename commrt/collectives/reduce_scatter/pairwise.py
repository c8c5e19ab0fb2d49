"""Pairwise reduce-scatter (blocks too large to be sent eagerly).

N-1 steps: at step k send block r+k to rank r+k and combine the copy of
block r that rank r-k sends into out (our own block first), one step after
another.  Each step pairs every rank with one sender and one receiver, so
the steps match from rank to rank: a prepared plan runs it at any size,
where the direct algorithm's all-at-once sends must complete before its
receives are taken one peer after another, which only eager blocks do.
Operand order: out = own block, then the copies of ranks r-1, r-2, ...,
r-N+1 (mod N), one after another.
Cost: (N-1)·(α + K/N·β + K/N·γ).  Bytes sent per rank: (N-1)·|block|.
"""
from commrt.collectives.reduce_scatter.direct import cost  # noqa: F401 (the registry's)
from commrt.collectives.registry import Msg

# before the ring at equal cost: planned both, the ring's steps wait on the
# partial its left neighbour just combined, pairwise's on inputs (N = 3 and 4 on
# 2 cores, 64 KiB - 1 MiB: the ring 1.12-1.27x slower; 2026-12-05)
TIE = 1
# cost: direct's (the same N-1 messages and combines); a plan at any size is
# what sets the two apart, and the model charges that (plans.applies)


def schedule(n, rank, count, root=0):
    """count: elements of buf (N blocks of m = count // N, sent from buf); each
    step's combine lands in out [0, m)."""
    m = count // n
    if n == 1:
        return []
    steps = []
    for k in range(1, n):
        dst = (rank + k) % n
        steps.append([Msg("combine", (rank - k) % n, 0, m),
                      Msg("send", dst, dst * m, (dst + 1) * m)])
    return steps


def run(call, out, buf, red):
    n, r = call.size, call.rank
    m = out.size
    call.copy(out, buf[r * m:(r + 1) * m])
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        cb = call.irecv_combine(out, src, red, "combine")
        call.isend(buf[dst * m:(dst + 1) * m], dst)
        call.wait_combine(cb)
