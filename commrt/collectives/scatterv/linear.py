"""Linear scatterv.

The root sends block q to rank q (all at once, staggered from root+1) and
copies its own; every other rank receives its block into out.
Cost at the root: (N-1)·α + (K - |own|)·β.  Bytes: the root sends every
block but its own.
"""
from commrt.collectives.chunking import offsets


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * p.alpha + nbytes * p.beta


def run(call, out, buf, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.recv(out, root)
        return
    offs = offsets(counts)
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[offs[q]:offs[q + 1]], q)
    out[...] = buf[offs[root]:offs[root + 1]]
