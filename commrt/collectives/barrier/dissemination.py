"""Dissemination barrier.

For k = 0, 1, ... while 2^k < N: send an empty message to rank r + 2^k and
receive one from rank r - 2^k.  After ceil(log2 N) rounds every rank has
heard, directly or not, from every other.
Cost: ceil(log2 N)·α.  Bytes: none (headers only).
"""
import math

from commrt.collectives.registry import Msg


class Empty(bytearray):
    """A barrier's empty message: no NumPy for a first barrier (docs/launcher.md).
    (It was also chosen over a memoryview when the garbage collector could drop a
    request's reference to its buffer with the export still open, which crashes
    a memoryview: Request is no_gc_clear since, transport/_core.pyx.)"""
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
