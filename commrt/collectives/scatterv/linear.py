"""Linear scatterv.

The root sends block q to rank q (all at once, staggered from root+1) and
copies its own; every other rank receives its block into out, copied as a
scatter's (``copier``, scatter/linear.py: its root writes a block below the
single-copy threshold where ranks crowd the cores, else the receiver reads
it), by the receiver's own block size.
Cost at the root: (N-1)·α + (K - |own|)·β.  Bytes: the root sends every
block but its own.
"""
from commrt.collectives.chunking import offsets
from commrt.collectives.registry import Msg
from commrt.collectives.scatter.linear import copier


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * p.alpha + nbytes * p.beta


def schedule(n, rank, counts, root=0):
    """counts: every rank's block size.  The root sends block q of buf from its
    place there; the others receive theirs into out, [0, counts[rank])."""
    if n == 1:
        return []
    if rank != root:
        return [[Msg("recv", root, 0, counts[rank])]]
    offs = offsets(counts)
    return [[Msg("send", q, offs[q], offs[q + 1]) for q in ((root + k) % n for k in range(1, n))]]


def run(call, out, buf, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.recv(out, root, copier(call.chan, call.state.cache, out.nbytes))
        return
    offs = offsets(counts)
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[offs[q]:offs[q + 1]], q)
    call.copy(out, buf[offs[root]:offs[root + 1]])
