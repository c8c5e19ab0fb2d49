"""Ring all-gather (large messages).

At step s send block r-s to the right and receive block r-s-1 from the left
straight into out (N-1 steps); step 0 sends one's own block from the input
and copies it into out while it goes (the copy overlaps the peer's read,
which then finds lines this core has not just written: N = 2, 1 MiB,
freshly written, 67-80 -> 56-57 us; on the host's slow state, where lines
move between cores slowly, 295 -> 95-118; plans._own_block_from_input).
Each step is an exchange: over shared memory the receiver reads blocks of
512 KiB and more (Call.irecv's copier EXCHANGE; N = 2, freshly written
blocks of 1 MiB: 213 -> 158 us), smaller ones stream.
Cost: (N-1)·(α + K/N·β), each step waiting on the left neighbour's forward
(α_busy with more ranks than cores).  Bytes sent per rank: (N-1)·|block|.
"""
from commrt.collectives.registry import Msg
from commrt.comm import Channel

TIE = 1


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return (n - 1) * (p.step(n) + nbytes / n * p.beta * p.rho(n))


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in out."""
    m = count
    right, left = (rank + 1) % n, (rank - 1) % n
    steps = []
    for s in range(n - 1):
        c, d = (rank - s) % n, (rank - s - 1) % n
        steps.append([Msg("send", right, c * m, (c + 1) * m),
                      Msg("recv", left, d * m, (d + 1) * m)])
    return steps


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    if n == 1:
        call.copy(out[r * m:(r + 1) * m], buf)
        return
    right, left = (r + 1) % n, (r - 1) % n
    rvs = []
    for s in range(n - 1):
        c = (r - s - 1) % n
        rvs.append(call.irecv(out[c * m:(c + 1) * m], left, Channel.EXCHANGE))
    call.isend(buf, right)
    call.copy(out[r * m:(r + 1) * m], buf)
    for s in range(n - 1):
        call.wait(rvs[s])
        if s < n - 2:
            c = (r - s - 1) % n
            call.isend(out[c * m:(c + 1) * m], right)
