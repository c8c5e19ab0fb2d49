"""Linear gatherv.

The root posts all N-1 receives at once, each into its block of out, and
copies its own; every other rank sends its one block (an empty one too, so
a count that disagrees is a size mismatch, not a hang).
Cost at the root: (N-1)·α + (K - |own|)·β.  Bytes: non-roots send their
block.
"""
from commrt.collectives.chunking import offsets


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * p.alpha + nbytes * p.beta


def run(call, buf, out, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.isend(buf, root)
        return
    offs = offsets(counts)
    rvs = [call.irecv(out[offs[q]:offs[q + 1]], q) for q in range(n) if q != root]
    out[offs[root]:offs[root + 1]] = buf
    call.waitall(rvs)
