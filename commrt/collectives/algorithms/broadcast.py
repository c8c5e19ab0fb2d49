"""Broadcast: the root's buffer to every rank.

binomial (small messages)
  Relative rank v = (r - root) mod N.  A rank receives the whole buffer from
  v - lowbit(v), then sends it to v + 2^k for each 2^k below lowbit(v)
  (the root: below N), largest first.
  Cost: ceil(log2 N)·(α + K·β).  Bytes: the root sends ceil(log2 N)·K at
  most; every other rank receives K once.

pipeline (large messages)
  A chain root -> root+1 -> ... -> root-1 in segments of
  COMMRT_RING_SEGMENT_BYTES (C segments): each rank forwards a segment as
  soon as it lands, so all links are busy at once.
  Cost: (N - 2 + C)·(α + K/C·β) ~ K·β for large K.  Bytes: every rank but
  the last in the chain sends K; every rank but the root receives K.
"""
import math

from commrt.collectives._engine import seg_elems, segments

ALGORITHMS = ("binomial", "pipeline")


def cost(algo, n, nbytes, p):
    if n == 1:
        return 0.0
    if algo == "binomial":
        return math.ceil(math.log2(n)) * (p.nseg(nbytes) * p.alpha + nbytes * p.beta)
    c = p.nseg(nbytes)
    return (n - 2 + c) * (p.alpha + nbytes / c * p.beta) * p.rho(n)


def binomial(call, buf, root):
    n, r = call.size, call.rank
    v = (r - root) % n
    mask = 1
    while mask < n:
        if v & mask:
            call.recv(buf, (r - mask) % n)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            call.isend(buf, (r + mask) % n)
        mask >>= 1


def pipeline(call, buf, root):
    n, r = call.size, call.rank
    v = (r - root) % n
    prev, nxt = (r - 1) % n, (r + 1) % n
    pieces = segments(0, buf.size, seg_elems(buf.itemsize))
    last = v == n - 1
    if v == 0:
        for lo, hi in pieces:
            call.isend(buf[lo:hi], nxt)
        return
    posted = [(lo, hi, call.irecv(buf[lo:hi], prev)) for lo, hi in pieces]
    for lo, hi, rv in posted:
        call.wait(rv)
        if not last:
            call.isend(buf[lo:hi], nxt)


def run(algo, call, buf, root):
    if call.size > 1:
        (binomial if algo == "binomial" else pipeline)(call, buf, root)
