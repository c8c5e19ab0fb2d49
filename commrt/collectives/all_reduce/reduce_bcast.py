"""Reduce + broadcast all-reduce: binomial reduce to rank 0, then binomial broadcast.

Steps:
  1. binomial reduce to rank 0 (see collectives/reduce/binomial.py), in place,
     each child's partial result combined as it lands where the reduction
     has a C loop (reduce-receive);
  2. binomial broadcast from rank 0 (see collectives/broadcast/binomial.py).
The result is computed once, at rank 0, so all ranks end bitwise equal.

Cost: 2·ceil(log2 N)·(α + K·β) + ceil(log2 N)·K·γ.  In the textbook form for
a root that talks to everyone at once, 2(α + S/B) + N·S·C (S = K bytes,
B = bandwidth = 1/β, C = γ): two message times plus the root's N reductions.
Bytes: every non-root sends K in the reduce; rank 0 sends ceil(log2 N)·K in
the broadcast; internal nodes forward K per child.
"""
import math

from commrt.collectives.broadcast import binomial as bcast_binomial
from commrt.collectives.reduce import binomial as reduce_binomial


TIE = 3


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    steps = math.ceil(math.log2(n))
    g = p.g(nbytes)
    crit = steps * nbytes * (2 * p.beta + g)
    return p.time(n, 2 * steps * p.step(n), crit, (n - 1) * nbytes * (2 * p.beta + g))


def schedule(n, rank, count, root=0):
    """The binomial reduce to rank 0, then the binomial broadcast from it."""
    return reduce_binomial.schedule(n, rank, count, 0) + bcast_binomial.schedule(n, rank, count, 0)


def run(call, buf, red):
    if call.size == 1:
        return
    reduce_binomial.reduce_to(call, buf, 0, red, acc=buf)
    call.wait_sends()  # our partial result left; the broadcast overwrites buf
    # the transport's copier, as this algorithm's plan (plans._all_reduce_reduce_bcast)
    bcast_binomial.run(call, buf, 0, who=0)
