"""Recursive-doubling all-reduce: log2(N) exchanges of the whole buffer (small messages).

Steps (p' = largest power of two <= N; non-powers of two fold first, see _fold):
  for mask = 1, 2, 4, ... < p': exchange the whole buffer with virtual rank
  v XOR mask and reduce the partner's copy into one's own.
Both partners combine the two partial results with the lower virtual rank's
as the left operand, so all ranks end bitwise equal even where an op does
not commute bit for bit (min of 0.0 and -0.0, NaN payloads).

Cost: log2(p')·(α + K·β + K·γ) [+ 2(α + K·β) + K·γ when N is not a power
of two].  The upper partner combines with the partner's copy as the left
operand straight into buf (the C loop's src_first), no copy back.
Fewest steps of all; moves K bytes per step, so only for small K.
Bytes sent per rank: log2(p')·K (+K for folded pairs).
"""
import math

from commrt.collectives.all_reduce import _fold
from commrt.collectives.registry import Msg


TIE = 1


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    p2, rem = _fold.plan(n)
    steps = int(math.log2(p2))
    # a step: exchange K, reduce K (into buf on both partners)
    g = p.g(nbytes)
    crit = steps * nbytes * (p.beta + g)
    work = p2 * steps * nbytes * (p.beta + g)
    fl, fc, fw = _fold.cost(n, nbytes, p)
    return p.time(n, steps * p.step(n) + fl, crit + fc, work + fw)


def schedule(n, rank, count, root=0):
    """The messages of each step (Msg: registry.py): the whole buffer exchanged
    with v XOR 2^k and combined ("combine": K·γ a step).  It is received into
    scratch and combined after the step with the lower rank's operand first,
    not as it lands (the order must hold on both partners), which the
    prepared plan does with a step hook (_small.py)."""
    p2, rem = _fold.plan(n)
    v = _fold.virtual(rank, rem)
    msgs = _fold.schedule_in(n, rank, count)
    mask = 1
    while v >= 0 and mask < p2:
        partner = _fold.real(v ^ mask, rem)
        msgs.append([Msg("send", partner, 0, count), Msg("combine", partner, 0, count)])
        mask <<= 1
    return msgs + _fold.schedule_out(n, rank, count)


def run(call, buf, red):
    n = call.size
    if n == 1:
        return
    p2, rem = _fold.plan(n)
    v = _fold.fold_in(call, buf, red, rem)
    if v >= 0:
        tmp = call.state.scratch("rd", buf.size, buf.dtype)
        mask = 1
        while mask < p2:
            partner = _fold.real(v ^ mask, rem)
            call.exchange(buf, partner, tmp, partner)
            call.wait_sends()  # the partner has our copy; buf may change now
            if v < v ^ mask:
                red(buf, tmp)
            else:  # same operand order on both partners (the lower rank's first):
                red.first(buf, tmp)  # bitwise equal even for min(0.0, -0.0) or NaN payloads
            mask <<= 1
    _fold.fold_out(call, buf, rem)
