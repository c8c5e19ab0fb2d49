"""Direct all_gatherv.

Receive every other rank's block straight into its place in out and send
one's own block (from the input) to every other rank, all at once (to r+k,
from r-k, k = 1 .. N-1), then copy it into out while they go.  Each block
is copied as the direct all-gather's (``copier``, all_gather/direct.py: its sender writes it below the
single-copy threshold where ranks crowd the cores, else its receiver reads
it), by its own size.
Cost: α_busy + (N-2)·α' + (K - |own block|)·β (K = bytes of out), α' each
message after the step's first (all_gather/direct.py's ``further``, the
mean block's size).
Bytes sent per rank: (N-1)·|own block|.
"""
from commrt.collectives.chunking import offsets
from commrt.collectives.all_gather.direct import copier, further
from commrt.collectives.cost import exchange_half
from commrt.collectives.registry import Msg

TIE = 0


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return (p.step(n) + (n - 2) * further(p, n, nbytes / n, True, comm)
            + (n - 1) * nbytes / n * p.beta * p.rho(n))


def schedule(n, rank, counts, root=0):
    """counts: every rank's block size; positions in out (the sends read buf,
    which holds the rank's own block of out)."""
    offs = offsets(counts)
    recvs = [Msg("recv", q, offs[q], offs[q + 1]) for q in ((rank - k) % n for k in range(1, n))]
    sends = [Msg("send", (rank + k) % n, offs[rank], offs[rank + 1]) for k in range(1, n)]
    return [recvs + sends] if n > 1 else []


def copier_from(chan, cache, counts, rank, isz, peer):
    """The copier of the receive of peer's block, the general path's and the plan's
    (plans.prepare): the direct all-gather's by its size, as half of an
    exchange of two blocks (cost.exchange_half)."""
    recv, send = counts[peer] * isz, counts[rank] * isz
    return exchange_half(chan, cache, copier(chan, cache, recv), recv, send)


def run(call, out, buf, counts):
    n, r = call.size, call.rank
    offs = offsets(counts)
    rvs = []
    for k in range(1, n):
        q = (r - k) % n
        block = out[offs[q]:offs[q + 1]]
        rvs.append(call.irecv(block, q, copier_from(call.chan, call.state.cache, counts, r,
                                                    buf.itemsize, q)))
    for k in range(1, n):
        call.isend(buf, (r + k) % n)
    call.copy(out[offs[r]:offs[r + 1]], buf, answering=rvs)
    call.waitall(rvs)
