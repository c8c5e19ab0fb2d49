"""Pairwise all-to-all.

Post the N-1 receives (block from rank q into out[q]), then send block r+k
to rank r+k for k = 1 .. N-1 (staggered so that no rank is every rank's
first target), and copy one's own block.  Over shared memory each block moves
in one copy where a stream through a ring costs two on cores that also send
(``copier``): where ranks outnumber cores its sender writes it below the
single-copy threshold (SENDER: N = 4 on 2 cores, freshly written, 1 MiB
373-457 -> 332-372 us against the receiver's reads, N = 3 290-368 ->
256-275; cost.written_where_crowded); its receiver reads it from there up,
and with a core each from 512 KiB blocks (EXCHANGE; reading took N = 4 1
MiB 487 -> 424 us, N = 2 85 -> 69 us against streaming).
Cost: (N-1)·(α + |block|·β), the messages in flight together.
Bytes sent per rank: (N-1)·|block|.
"""
from commrt.collectives.cost import written_where_crowded
from commrt.collectives.registry import Msg
from commrt.comm import Channel


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * (p.alpha + nbytes / n * p.beta)


def schedule(n, rank, count, root=0):
    """count: elements per block (recv positions in out, send positions in buf)."""
    m = count
    if n == 1:
        return []
    return [[Msg("recv", q, q * m, (q + 1) * m) for q in range(n) if q != rank]
            + [Msg("send", (rank + k) % n, (rank + k) % n * m, ((rank + k) % n + 1) * m)
               for k in range(1, n)]]


def copier(chan, cache, nbytes):
    """The copier of each receive of an nbytes block, the general path's and the
    plan's (plans.prepare): the module's text."""
    return written_where_crowded(chan, cache, nbytes, Channel.EXCHANGE)


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size // n
    who = copier(call.chan, call.state.cache, m * buf.itemsize)
    rvs = [call.irecv(out[q * m:(q + 1) * m], q, who) for q in range(n) if q != r]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    call.copy(out[r * m:(r + 1) * m], buf[r * m:(r + 1) * m], answering=rvs)
    call.waitall(rvs)
