"""Folding a non-power-of-two world onto the largest power of two p' <= N.

With rem = N - p', ranks 0..2·rem-1 pair up: each even rank sends its whole
buffer to the odd rank above it, which reduces it and takes part in the
power-of-two algorithm under the virtual rank r // 2; ranks >= 2·rem take
part as r - rem.  The odd rank combines the even rank's buffer into its own
as it lands where the reduction has a C loop (reduce-receive), else receives
it into scratch and reduces.  Afterwards each odd rank sends the result back
down.
Extra cost: 2(α + K·β) + K·γ for the folded pairs.
"""


def cost(n, nbytes, p):
    """(latency, critical path bytes, work) the fold adds: the pair's whole buffer
    there and back."""
    p2, rem = plan(n)
    if not rem:
        return 0.0, 0.0, 0.0
    crit = nbytes * (2 * p.beta + p.g(nbytes))
    return 2 * p.step(n), crit, rem * crit


def plan(n):
    p2 = 1 << (n.bit_length() - 1)
    return p2, n - p2


def virtual(rank, rem):
    """Virtual rank in the power-of-two group, or -1 for a folded (even) rank."""
    if rank < 2 * rem:
        return -1 if rank % 2 == 0 else rank // 2
    return rank - rem


def real(v, rem):
    return 2 * v + 1 if v < rem else v + rem


def fold_in(call, buf, red, rem, scratch_slot="fold"):
    """Before: evens give their data to the odd rank above.  Returns the virtual rank."""
    r = call.rank
    v = virtual(r, rem)
    if r < 2 * rem:
        if v < 0:
            call.isend(buf, r + 1)
        else:  # the algorithm's first step: no send reads buf yet
            call.recv_combine(buf, r - 1, red, scratch_slot)
    return v


def fold_out(call, buf, rem):
    """After: odd ranks hand the result back to the even rank below."""
    r = call.rank
    if r < 2 * rem:
        if r % 2 == 0:
            call.wait_sends()  # our fold_in send read buf; now it may be overwritten
            call.recv(buf, r + 1)
        else:
            call.isend(buf, r - 1)


def schedule_in(n, rank, count):
    """The fold-in step's messages (Msg, registry.py): [] where there is none."""
    from commrt.collectives.registry import Msg

    rem = plan(n)[1]
    if rank >= 2 * rem:
        return []
    if rank % 2 == 0:
        return [[Msg("send", rank + 1, 0, count)]]
    return [[Msg("combine", rank - 1, 0, count)]]


def schedule_out(n, rank, count):
    from commrt.collectives.registry import Msg

    rem = plan(n)[1]
    if rank >= 2 * rem:
        return []
    if rank % 2 == 0:
        return [[Msg("recv", rank + 1, 0, count)]]
    return [[Msg("send", rank - 1, 0, count)]]
