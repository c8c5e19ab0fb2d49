"""Linear scatter.

The root sends block i to rank i (all at once, staggered from root+1) and
copies its own; every other rank receives its block.  A receiver copies
its block itself (Call.irecv's copier RECEIVER): over shared memory
straight from the root's buffer at any size, so the root's core copies
only its own block while the receivers copy theirs, instead of writing
every block into a ring (two copies, one of them on the root's core,
below the transport's single-copy threshold).
Cost: (N-1)·α + (N-1)·K_block·β at the root.  Bytes: the root sends
(N-1)·|block|; every other rank receives |block|.
"""
from commrt.collectives.registry import Msg
from commrt.comm import Channel


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
        call.recv(out, root, Channel.RECEIVER)
        return
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[...] = buf[root * m:(root + 1) * m]
