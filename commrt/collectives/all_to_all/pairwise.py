"""Pairwise all-to-all.

Post the N-1 receives (block from rank q into out[q]), then send block r+k
to rank r+k for k = 1 .. N-1 (staggered so that no rank is every rank's
first target), and copy one's own block.  Every rank reads its blocks from
its peers' buffers (Call.irecv's copier EXCHANGE: where ranks share cores,
and with a core each from 512 KiB blocks): over shared memory one copy per
block, on its receiver's core, where a stream through a ring costs two on
cores that also send (freshly written blocks, 1 MiB: N = 4 on 2 cores 487
-> 424 us, N = 2 85 -> 69 us).
Cost: (N-1)·(α + |block|·β), the messages in flight together.
Bytes sent per rank: (N-1)·|block|.
"""
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


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size // n
    rvs = [call.irecv(out[q * m:(q + 1) * m], q, Channel.EXCHANGE) for q in range(n) if q != r]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[r * m:(r + 1) * m] = buf[r * m:(r + 1) * m]
    call.waitall(rvs)
