"""Ring all_gatherv.

Copy one's block into out; at step s send block r-s to the right and
receive block r-s-1 from the left straight into its place in out (N-1
steps).
Cost: (N-1)·α + (K - |own block|)·β, the largest block setting each step.
Bytes sent per rank: K - |block r+1|.
"""
from commrt.collectives.chunking import offsets

TIE = 1


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return (n - 1) * (p.step(n) + nbytes / n * p.beta * p.rho(n))


def run(call, out, buf, counts):
    n, r = call.size, call.rank
    offs = offsets(counts)
    out[offs[r]:offs[r + 1]] = buf
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    rvs = []
    for s in range(n - 1):
        c = (r - s - 1) % n
        rvs.append(call.irecv(out[offs[c]:offs[c + 1]], left))
    call.isend(out[offs[r]:offs[r + 1]], right)
    for s in range(n - 1):
        call.wait(rvs[s])
        if s < n - 2:
            c = (r - s - 1) % n
            call.isend(out[offs[c]:offs[c + 1]], right)
