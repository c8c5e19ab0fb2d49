"""Linear gatherv.

The root posts all N-1 receives at once, each into its block of out, and
copies its own; every other rank sends its one block (an empty one too, so
a count that disagrees is a size mismatch, not a hang).  The senders write
their blocks into out, as a gather's (gather/linear.py: copier SENDER).
Cost at the root: (N-1)·α + (K - |own|)·β.  Bytes: non-roots send their
block.
"""
from commrt.collectives.chunking import offsets
from commrt.collectives.registry import Msg
from commrt.comm import Channel


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * p.alpha + nbytes * p.beta


def schedule(n, rank, counts, root=0):
    """counts: every rank's block size.  The root receives each block into its
    place in out; the others send their buf, [0, counts[rank])."""
    if n == 1:
        return []
    if rank != root:
        return [[Msg("send", root, 0, counts[rank])]]
    offs = offsets(counts)
    return [[Msg("recv", q, offs[q], offs[q + 1]) for q in range(n) if q != root]]


def run(call, buf, out, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.isend(buf, root)
        return
    offs = offsets(counts)
    rvs = [call.irecv(out[offs[q]:offs[q + 1]], q, Channel.SENDER)
           for q in range(n) if q != root]
    call.copy(out[offs[root]:offs[root + 1]], buf, answering=rvs)
    call.waitall(rvs)
