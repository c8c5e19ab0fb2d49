"""Binomial broadcast (small messages).

Relative rank v = (r - root) mod N.  A rank receives the whole buffer from
v - lowbit(v), then sends it to v + 2^k for each 2^k below lowbit(v) (the
root: below N), largest first.
Cost: ceil(log2 N)·(α + K·β).  Bytes: the root sends ceil(log2 N)·K at
most; every other rank receives K once.

Who copies (``copier``): over shared memory a message below the single-copy
threshold streams through the pair's ring: the sender's core writes it and
the receiver's reads it (two copies), and the send is done once written.
Where a host has READ_RANKS_PER_CORE ranks or more per core, each receiver
reads from its parent's buffer instead (Channel.RECEIVER: one copy, none on
the parent's core, for a handshake): there the copies of the many ranks
waiting for a core, not the tree's depth, bound the time.
"""
import math

from commrt.collectives.registry import Msg
from commrt.comm import Channel

TIE = 0


# Measured on 2 cores (bench collectives --kinds broadcast --algos all
# --fresh-inputs, medians of 3 alternated rounds, µs, streamed -> read):
# N = 8: 16 KiB 15.3 -> 12.8, 64 KiB 67.7 -> 43.6 and 72.6 -> 56.5, 256 KiB
# 165 -> 121 and 230 -> 178 (the pipeline's 124-175: tied now, 1.3-1.5x
# ahead before); N = 6: 16-64 KiB alike, 256 KiB 129 -> 107; but N = 3 64 KiB
# 12.1 -> 23.2 and N = 4 15.6 -> 23.7, where the streamed hops cost less than
# a read's handshake.  From COMMRT_CMA_MIN_BYTES up every message is read anyway.
READ_RANKS_PER_CORE = 3


def copier(chan, cache, nbytes=None):
    """The copier of this rank's receive (Channel.irecv's), the same on the
    general path and in the plan (plans.prepare): Channel.RECEIVER where this
    host has READ_RANKS_PER_CORE ranks or more of the group per core, else 0
    (the transport's choice), whatever the size (nbytes)."""
    c = cache.get("binomial copier")
    if c is None:
        from commrt.collectives.cost import _cores, ranks_on_my_host

        reads = ranks_on_my_host(chan) >= READ_RANKS_PER_CORE * _cores()
        c = cache["binomial copier"] = Channel.RECEIVER if reads else 0
    return c


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


def run(call, buf, root, who=None):
    """who: the receive's copier (None: ``copier``'s, as this algorithm's plan)."""
    n, r = call.size, call.rank
    if n == 1:
        return
    v = (r - root) % n
    if who is None:
        who = copier(call.chan, call.state.cache)
    mask = 1
    while mask < n:
        if v & mask:
            call.recv(buf, (r - mask) % n, who)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            call.isend(buf, (r + mask) % n)
        mask >>= 1
