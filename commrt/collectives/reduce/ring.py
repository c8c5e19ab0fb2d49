"""Ring reduce (large messages: Rabenseifner's reduce).

The in-place ring reduce-scatter (reduce_scatter/ring.py, on a scratch copy
at non-roots) leaves each rank one chunk of N fully reduced; each sends it
to the root, which receives every other chunk straight into its buffer.
Cost: K·μ (the non-roots' scratch copy, which the root waits for)  +
(N-1)·α + (N-1)/N·K·β + (N-1)/N·K·γ  +  α + K/N·β (gather; the root
receives N-1 chunks).  Bytes: each non-root sends (N-1)/N·K + K/N (less its
own chunk sizes when N does not divide the count).
"""
from commrt.collectives.chunking import bounds
from commrt.collectives.reduce_scatter import ring as ring_rs
from commrt.collectives.registry import Msg

TIE = 1
# every segment waits on a neighbour: α_busy where ranks outnumber cores, planned or
# not (cost.predict)
SEGMENT_WAITS = True


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    chunk = nbytes / n
    # every segment waits on the left neighbour: a context switch where ranks
    # outnumber cores (α_busy), as in the ring all-reduce
    step = p.nseg(chunk) * p.step(n) + chunk * p.beta
    # the scratch copy was left out until 2026-12-03: at N = 2 and 16 MiB the model
    # then put the ring 13% below binomial where it ran 1.8x slower (3.8-4.0 ms
    # against 2.1-2.2, bench collectives --algos all), and auto took it
    return (nbytes * p.mu + p.rho(n) * ((n - 1) * (step + chunk * p.gamma))
            + (n - 1) * chunk * p.beta + p.alpha)


def schedule(n, rank, count, root=0, itemsize=4):
    """The in-place ring reduce-scatter's steps (on the scratch copy at non-roots),
    then chunk r+1 to the root, which receives every other rank's chunk."""
    if n == 1:
        return []
    steps = ring_rs.in_place_schedule(n, rank, count, itemsize)
    b = bounds(count, n)
    if rank != root:
        own = (rank + 1) % n
        return steps + [[Msg("send", root, b[own], b[own + 1])]]
    return steps + [[Msg("recv", q, b[(q + 1) % n], b[(q + 1) % n + 1])
                     for q in range(n) if q != root]]


def run(call, buf, root, red):
    n, r = call.size, call.rank
    if n == 1:
        return
    if r == root:
        work = buf
    else:
        work = call.state.scratch("red_work", buf.size, buf.dtype)
        call.copy(work, buf)
    b = ring_rs.in_place(call, work, red)
    # rank q owns chunk q+1: send it to the root, which receives every other chunk
    own = (r + 1) % n
    if r != root:
        call.isend(work[b[own]:b[own + 1]], root)
    else:
        call.wait_sends()
        rvs = [call.irecv(buf[b[(q + 1) % n]:b[(q + 1) % n + 1]], q) for q in range(n) if q != root]
        call.waitall(rvs)
