"""Pairwise all_to_allv.

Post the N-1 receives (recv_counts[q] elements from rank q into its place in
out), send send_counts[q] elements to each rank q = r+k, k = 1 .. N-1
(staggered so no rank is everyone's first target), copy one's own block.
Empty blocks are sent too: counts that disagree are a size mismatch.  Each
block is copied as an all-to-all's (``copier``, all_to_all/pairwise.py: its
sender writes it below the single-copy threshold where ranks crowd the
cores, else its receiver reads it), by its own size, and as half of the
exchange of two blocks with its peer (``copier_from``: cost.exchange_half).
Cost: (N-1)·α + max(bytes in, bytes out)·β.  Bytes sent per rank: the sum
of send_counts less one's own.
"""
from commrt.collectives.chunking import offsets
from commrt.collectives.all_to_all.pairwise import copier
from commrt.collectives.cost import exchange_half
from commrt.collectives.registry import Msg


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * p.alpha + nbytes * p.beta


def schedule(n, rank, counts, root=0):
    """counts[q][p]: elements rank q sends to rank p.  Receives give their place
    in out, sends their place in buf."""
    if n == 1:
        return []
    so = offsets(counts[rank])
    ro = offsets([counts[q][rank] for q in range(n)])
    recvs = [Msg("recv", q, ro[q], ro[q + 1]) for q in range(n) if q != rank]
    sends = [Msg("send", q, so[q], so[q + 1]) for q in ((rank + k) % n for k in range(1, n))]
    return [recvs + sends]


def copier_from(chan, cache, counts, rank, isz, peer):
    """The copier of the receive from peer, the general path's and the plan's
    (plans.prepare): an all-to-all's by its size, as half of the exchange of
    counts[peer][rank] and counts[rank][peer] elements (cost.exchange_half)."""
    return _copier(chan, cache, counts[peer][rank] * isz, counts[rank][peer] * isz)


def _copier(chan, cache, recv, send):
    return exchange_half(chan, cache, copier(chan, cache, recv), recv, send)


def run(call, out, buf, send_counts, recv_counts):
    n, r = call.size, call.rank
    so, ro = offsets(send_counts), offsets(recv_counts)
    cache, isz = call.state.cache, out.itemsize
    rvs = [call.irecv(out[ro[q]:ro[q + 1]], q,
                      _copier(call.chan, cache, recv_counts[q] * isz, send_counts[q] * isz))
           for q in range(n) if q != r]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[so[q]:so[q + 1]], q)
    call.copy(out[ro[r]:ro[r + 1]], buf[so[r]:so[r + 1]], answering=rvs)
    call.waitall(rvs)
