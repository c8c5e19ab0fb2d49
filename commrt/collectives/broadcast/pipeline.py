"""Pipelined chain broadcast (large messages).

A chain root -> root+1 -> ... -> root-1 in segments of
COMMRT_RING_SEGMENT_BYTES (C segments): each rank forwards a segment as soon
as it lands, so all links are busy at once.  A receiver reads each segment
from the rank before it (Channel.RECEIVER: one copy where ranks share
cores, instead of streaming it through the pair's ring, two).
Cost: (N - 2 + C)·(α + K/C·β) ~ K·β for large K (α_busy for α, and the
whole times N/cores, where ranks outnumber cores).  Bytes: every rank but
the last in the chain sends K; every rank but the root receives K.
"""
from commrt.collectives.chunking import seg_elems, segments
from commrt.collectives.registry import Msg
from commrt.comm import Channel

TIE = 1
# every segment waits on a neighbour: α_busy where ranks outnumber cores, planned or
# not (cost.predict)
SEGMENT_WAITS = True


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    c = p.nseg(nbytes)
    # every segment waits on the rank before it in the chain: with more ranks than
    # cores each such wait is a context switch (α_busy), as the ring's segments
    # (N = 3 on 2 cores: with α per segment the model took the pipeline from 1 MiB,
    # where the binomial tree ran 4 MiB in 901 µs against 1300-1373)
    return (n - 2 + c) * (p.step(n) + nbytes / c * p.beta) * p.rho(n)


def schedule(n, rank, count, root=0, itemsize=4):
    """The root sends every segment at once; every other rank receives segment k
    and, but the last in the chain, forwards it in the next step."""
    if n == 1:
        return []
    v = (rank - root) % n
    prev, nxt = (rank - 1) % n, (rank + 1) % n
    pieces = segments(0, count, seg_elems(itemsize))
    if v == 0:
        return [[Msg("send", nxt, lo, hi) for lo, hi in pieces]]
    steps = [[]]
    for lo, hi in pieces:
        steps[-1].append(Msg("recv", prev, lo, hi))
        steps.append([Msg("send", nxt, lo, hi)] if v < n - 1 else [])
    if not steps[-1]:
        steps.pop()
    return steps


def run(call, buf, root):
    n, r = call.size, call.rank
    if n == 1:
        return
    v = (r - root) % n
    prev, nxt = (r - 1) % n, (r + 1) % n
    pieces = segments(0, buf.size, seg_elems(buf.itemsize))
    last = v == n - 1
    if v == 0:
        for lo, hi in pieces:
            call.isend(buf[lo:hi], nxt)
        return
    posted = [(lo, hi, call.irecv(buf[lo:hi], prev, Channel.RECEIVER)) for lo, hi in pieces]
    for lo, hi, rv in posted:
        call.wait(rv)
        if not last:
            call.isend(buf[lo:hi], nxt)
