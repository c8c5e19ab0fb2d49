"""Direct reduce-scatter (small messages).

Send block j to rank j for every j != r (all at once), receive the N-1
copies of block r and reduce them with one pass (float16 accumulates in
float32 across all of them).  Where the reduction combines as messages land
(Reduction.lands) the copies are combined into out instead (our own block
first), one peer after another in the pass's order: no scratch, no pass.
The next peer's receive is posted once the previous one completed, since
combines posted together would apply in arrival order.
Cost: (N-1)·α + (N-1)/N·K·β + (N-1)/N·K·γ, all messages in flight together.
Bytes sent per rank: (N-1)·|block|.
"""
from commrt.collectives.registry import Msg

TIE = 0


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    block = nbytes / n
    return (n - 1) * (p.alpha + block * (p.beta + p.gamma)) * p.rho(n)


def schedule(n, rank, count, root=0):
    """count: elements of buf (N blocks of count // N, sent from buf); the combines
    land in out [0, m), one peer after another in peer order."""
    m = count // n
    if n == 1:
        return []
    peers = [q for q in range(n) if q != rank]
    first = [Msg("combine", peers[0], 0, m)]
    sends = [Msg("send", (rank + k) % n, (rank + k) % n * m, ((rank + k) % n + 1) * m)
             for k in range(1, n)]
    return [first + sends] + [[Msg("combine", q, 0, m)] for q in peers[1:]]


def run(call, out, buf, red):
    n, r = call.size, call.rank
    m = out.size
    if n == 1:
        call.copy(out, buf)
        return
    peers = [q for q in range(n) if q != r]
    if red.lands:
        call.copy(out, buf[r * m:(r + 1) * m])
        first = call.irecv_combine(out, peers[0], red, None)
        for k in range(1, n):
            q = (r + k) % n
            call.isend(buf[q * m:(q + 1) * m], q)
        call.wait_combine(first)
        for q in peers[1:]:
            call.recv_combine(out, q, red)
        return
    tmps = [call.state.scratch(("rsd", q), m, buf.dtype) for q in range(n - 1)]
    rvs = [call.irecv(t, q) for t, q in zip(tmps, peers)]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    call.copy(out, buf[r * m:(r + 1) * m])
    call.waitall(rvs)
    red.many(out, tmps)
