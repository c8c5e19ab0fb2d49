"""Binomial broadcast (small messages).

Relative rank v = (r - root) mod N.  A rank receives the whole buffer from
v - lowbit(v), then sends it to v + 2^k for each 2^k below lowbit(v) (the
root: below N), largest first.
Cost: ceil(log2 N)·(α + K·β).  Bytes: the root sends ceil(log2 N)·K at
most; every other rank receives K once.
"""
import math

from commrt.collectives.registry import Msg

TIE = 0


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return math.ceil(math.log2(n)) * (p.nseg(nbytes) * p.alpha + nbytes * p.beta)


def schedule(n, rank, count, root=0):
    v = (rank - root) % n
    steps = []
    mask = 1
    while mask < n:
        if v & mask:
            steps.append([Msg("recv", (rank - mask) % n, 0, count)])
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if v + mask < n:
            sends.append(Msg("send", (rank + mask) % n, 0, count))
        mask >>= 1
    return steps + ([sends] if sends else [])


def run(call, buf, root):
    n, r = call.size, call.rank
    if n == 1:
        return
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
