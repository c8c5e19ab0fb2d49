"""Bruck all-gather (small messages), any N.

Work in a scratch of N blocks holding, at position i, the block of rank
r+i.  Step k (d = 2^k): send the first min(d, N-d) blocks to rank r-d,
receive as many from rank r+d into positions d..; after ceil(log2 N) steps
rotate the scratch into out.
Cost: ceil(log2 N)·α + (N-1)/N·K·β (K = bytes of out) + K·μ (the rotation);
α_busy for α where ranks outnumber cores.
Bytes sent per rank: (N-1)·|block|.
"""
import math

from commrt.collectives.registry import Msg

TIE = 0


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    block = nbytes / n
    # each step waits on the one before (a context switch where ranks outnumber
    # cores, as direct's one wait); the rotation into out is a local copy
    return (math.ceil(math.log2(n)) * p.step(n) + (n - 1) * block * p.beta * p.rho(n)
            + nbytes * p.mu)


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in the work buffer (block i: rank r+i)."""
    m, steps, d = count, [], 1
    while d < n:
        cnt = min(d, n - d)
        steps.append([Msg("recv", (rank + d) % n, d * m, (d + cnt) * m),
                      Msg("send", (rank - d) % n, 0, cnt * m)])
        d <<= 1
    return steps


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    if n == 1:
        call.copy(out[:m], buf)
        return
    work = call.state.scratch("bruck", n * m, buf.dtype)
    call.copy(work[:m], buf)
    d = 1
    while d < n:
        cnt = min(d, n - d)
        rv = call.irecv(work[d * m:(d + cnt) * m], (r + d) % n)
        call.isend(work[:cnt * m], (r - d) % n)
        call.wait(rv)
        d <<= 1
    call.wait_sends()
    # work[i] is the block of rank r+i
    out[r * m:] = work[:(n - r) * m]
    out[:r * m] = work[(n - r) * m:n * m]
