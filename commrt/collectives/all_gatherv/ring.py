"""Ring all_gatherv.

At step s send block r-s to the right and receive block r-s-1 from the left
straight into its place in out (N-1 steps), each receive half of an
exchange (copier EXCHANGE); one's own block sent from the input and copied
into out while it goes (all as all_gather/ring.py's).
Cost: (N-1)·α + (K - |own block|)·β, the largest block setting each step.
Bytes sent per rank: K - |block r+1|.
"""
from commrt.collectives.chunking import offsets
from commrt.collectives.cost import exchange_half
from commrt.collectives.registry import Msg
from commrt.comm import Channel

TIE = 1


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return (n - 1) * (p.step(n) + nbytes / n * p.beta * p.rho(n))


def schedule(n, rank, counts, root=0):
    """counts: every rank's block size; positions in out.  Step s sends the block
    received at step s-1 (step 0: one's own) and receives block r-s-1."""
    if n == 1:
        return []
    offs = offsets(counts)
    right, left = (rank + 1) % n, (rank - 1) % n
    steps = []
    for s in range(n - 1):
        c, d = (rank - s) % n, (rank - s - 1) % n
        steps.append([Msg("send", right, offs[c], offs[c + 1]),
                      Msg("recv", left, offs[d], offs[d + 1])])
    return steps


def copier_from(chan, cache, counts, rank, isz, peer):
    """The copier of each receive, the general path's and the plan's
    (plans.prepare): EXCHANGE; at N = 2, where the one neighbour is both
    sides of each exchange, as its half (cost.exchange_half)."""
    if len(counts) != 2:
        return Channel.EXCHANGE
    recv, send = counts[peer] * isz, counts[rank] * isz
    return exchange_half(chan, cache, Channel.EXCHANGE, recv, send)


def run(call, out, buf, counts):
    n, r = call.size, call.rank
    offs = offsets(counts)
    if n == 1:
        call.copy(out[offs[r]:offs[r + 1]], buf)
        return
    right, left = (r + 1) % n, (r - 1) % n
    who = copier_from(call.chan, call.state.cache, counts, r, buf.itemsize, left)
    rvs = []
    for s in range(n - 1):
        c = (r - s - 1) % n
        rvs.append(call.irecv(out[offs[c]:offs[c + 1]], left, who))
    call.isend(buf, right)
    call.copy(out[offs[r]:offs[r + 1]], buf)
    for s in range(n - 1):
        call.wait(rvs[s])
        if s < n - 2:
            c = (r - s - 1) % n
            call.isend(out[offs[c]:offs[c + 1]], right)
