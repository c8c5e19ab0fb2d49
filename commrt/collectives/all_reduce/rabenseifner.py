"""Rabenseifner all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

Steps (p' = largest power of two <= N, blocks = p' near-equal parts of the
buffer; non-powers of two fold first, see _fold):
  1. halving, mask = p'/2 ... 1: virtual rank v keeps the lower half of its
     current block range if v & mask is 0, else the upper half; it sends
     the other half to v XOR mask and reduces the partner's copy of the
     half it keeps (combined in place as it lands where the reduction has
     a C loop, else received into scratch and reduced).  After log2(p')
     steps v owns block v, fully reduced.
  2. doubling, mask = 1 ... p'/2: exchange the blocks owned so far with
     v XOR mask (straight into the buffer); the owned range doubles.
Each block is reduced by one rank only, so all ranks end bitwise equal.

Cost: 2·log2(p')·α + 2·(p'-1)/p'·K·β + (p'-1)/p'·K·γ
      [+ 2(α + K·β) + K·γ when N is not a power of two].
Bandwidth-optimal like the ring with log2 latency; bytes sent per rank:
2·(p'-1)/p'·K (+K for folded pairs).
"""
import math

from commrt.collectives.chunking import bounds
from commrt.collectives.registry import Msg
from commrt.collectives.all_reduce import _fold


TIE = 0
# every combine of its schedule is a reduce-receive where the reduction has a C
# loop (combined as it lands, no scratch), on its plan and on the general path:
# the simulator prices it as such (sim/engine.py land_at)
LANDS = True


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    p2, rem = _fold.plan(n)
    steps = int(math.log2(p2))
    frac = (p2 - 1) / p2 * nbytes
    lat = 2 * steps * p.step(n)  # one message each way per step, whatever its size
    # halving step i reduces K/2^i, combined piece by piece (a ring chunk or a
    # CMA piece, <= a segment) as it lands: the in-cache γ of a segment, as
    # the ring's (a reduction without a C loop reduces the whole block at once)
    reduce = sum(nbytes / 2 ** i * p.g(min(nbytes / 2 ** i, p.segment))
                 for i in range(1, steps + 1))
    crit = 2 * frac * p.beta + reduce
    fl, fc, fw = _fold.cost(n, nbytes, p)
    return p.time(n, lat + fl, crit + fc, p2 * crit + fw)


def steps(p2, v, count, real=lambda q: q):
    """The pairwise steps of virtual rank v in a p2-rank (power of two) group over
    `count` elements: (partner, send lo, send hi, receive lo, receive hi, reduce)
    in elements, halving steps (reduce True) then doubling steps.  `real` maps a
    virtual rank to its communicator rank.  Shared by run() and the prepared
    plan of the small-call path (collectives/_small.py), so both send the same
    messages."""
    b = bounds(count, p2)
    out = []
    lo, hi = 0, p2
    mask = p2 >> 1
    while mask:
        mid = lo + (hi - lo) // 2
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        out.append((real(v ^ mask), b[give[0]], b[give[1]], b[keep[0]], b[keep[1]], True))
        lo, hi = keep
        mask >>= 1
    mask = 1
    while mask < p2:
        mine = (v // mask) * mask
        theirs = ((v ^ mask) // mask) * mask
        out.append((real(v ^ mask), b[mine], b[mine + mask], b[theirs], b[theirs + mask],
                    False))
        mask <<= 1
    return out


def schedule(n, rank, count, root=0):
    """The messages of each step on a power-of-two world (Msg: registry.py); the
    fold of other worlds is in _fold.schedule."""
    p2, rem = _fold.plan(n)
    v = _fold.virtual(rank, rem)
    msgs = _fold.schedule_in(n, rank, count)
    if v >= 0:
        for partner, s0, s1, r0, r1, combine in steps(p2, v, count, lambda q: _fold.real(q, rem)):
            msgs.append([Msg("send", partner, s0, s1),
                         Msg("combine" if combine else "recv", partner, r0, r1)])
    return msgs + _fold.schedule_out(n, rank, count)


def run(call, buf, red):
    n = call.size
    if n == 1:
        return
    p2, rem = _fold.plan(n)
    v = _fold.fold_in(call, buf, red, rem)
    if v >= 0:
        halving = True
        for partner, s0, s1, r0, r1, combine in steps(p2, v, buf.size,
                                                      lambda q: _fold.real(q, rem)):
            if combine:  # the half kept: combined as it lands, or through scratch
                call.exchange_combine(buf[s0:s1], partner, buf[r0:r1], partner, red, "rab")
            else:
                if halving:
                    call.wait_sends()  # the doubling writes into blocks we sent from
                    halving = False
                call.exchange(buf[s0:s1], partner, buf[r0:r1], partner)
    _fold.fold_out(call, buf, rem)
