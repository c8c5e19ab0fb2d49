"""Linear scatter.

The root sends block i to rank i (all at once, staggered from root+1) and
copies its own; every other rank receives its block.
Cost: (N-1)·α + (N-1)·K_block·β at the root.  Bytes: the root sends
(N-1)·|block|; every other rank receives |block|.
"""
from commrt.collectives.registry import Msg


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * (p.alpha + nbytes / n * p.beta)


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in the root's buf (a receiver's: its out)."""
    m = count
    if n == 1:
        return []
    if rank != root:
        return [[Msg("recv", root, 0, m)]]
    return [[Msg("send", (root + k) % n, (root + k) % n * m, ((root + k) % n + 1) * m)
             for k in range(1, n)]]


def run(call, out, buf, root):
    n, r = call.size, call.rank
    m = out.size
    if r != root:
        call.recv(out, root)
        return
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[...] = buf[root * m:(root + 1) * m]
