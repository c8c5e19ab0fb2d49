"""Dissemination barrier.

For k = 0, 1, ... while 2^k < N: send an empty message to rank r + 2^k and
receive one from rank r - 2^k.  After ceil(log2 N) rounds every rank has
heard, directly or not, from every other.
Cost: ceil(log2 N)·α.  Bytes: none (headers only).
"""
import math

from commrt.collectives.registry import Msg


class Empty(bytearray):
    """A barrier's empty message: no NumPy for a first barrier (docs/launcher.md),
    and not a memoryview, which the garbage collector may clear while the engine
    holds an export of it ("memoryview has 2 exported buffers", then SIGSEGV): the
    collector clearing this (no slots, no dict) leaves a bytearray's storage alone."""
    __slots__ = ()
    nbytes = 0


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else math.ceil(math.log2(n)) * p.alpha


def schedule(n, rank, count=0, root=0):
    steps = []
    d = 1
    while d < n:
        steps.append([Msg("recv", (rank - d) % n, 0, 0), Msg("send", (rank + d) % n, 0, 0)])
        d <<= 1
    return steps


def run(call):
    n, r = call.size, call.rank
    d = 1
    while d < n:
        rv = call.irecv(Empty(), (r - d) % n)
        call.isend(Empty(), (r + d) % n)
        call.wait(rv)
        d <<= 1
