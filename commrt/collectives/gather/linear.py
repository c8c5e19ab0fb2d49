"""Linear gather.

Every rank sends its block to the root, which posts all N-1 receives at
once (into out, in rank order) and copies its own.  The senders copy
(Call.irecv's copier SENDER): over shared memory each writes its block
straight into the root's out while the root copies its own, where the root
would otherwise copy every block itself.
Cost: (N-1)·α + (N-1)·K_block·β at the root (its link carries everything; a
tree would not move fewer bytes through it).  Bytes: the root receives
(N-1)·|block|; every other rank sends |block|.
"""
from commrt.collectives.registry import Msg
from commrt.comm import Channel


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * (p.alpha + nbytes / n * p.beta)


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in the root's out (a sender's: its buf)."""
    m = count
    if n == 1:
        return []
    if rank != root:
        return [[Msg("send", root, 0, m)]]
    return [[Msg("recv", q, q * m, (q + 1) * m) for q in range(n) if q != root]]


def run(call, buf, out, root):
    n, r = call.size, call.rank
    m = buf.size
    if r != root:
        call.isend(buf, root)
        return
    rvs = [call.irecv(out[q * m:(q + 1) * m], q, Channel.SENDER) for q in range(n) if q != root]
    call.copy(out[root * m:(root + 1) * m], buf, answering=rvs)
    call.waitall(rvs)
