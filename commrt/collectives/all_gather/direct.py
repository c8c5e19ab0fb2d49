"""Direct all-gather (large messages, more ranks than cores).

Receive every other rank's block straight into out and send one's own, from
the input, to every other rank, all at once (to r+k, from r-k, k = 1 .. N-1,
so no rank is everyone's first target); then copy it into out while they
go, as ring.py's first step does.  One round instead of
the ring's N-1 dependent steps: where a rank must wait for a context switch
before it can forward (ranks outnumber cores), that wait is paid once.  On
shared memory each block moves in one copy (``copier``): where ranks
outnumber cores its sender writes it below the single-copy threshold
(SENDER: N = 4 on 2 cores, freshly written, 256 KiB 63-75 -> 47-48 us, 1
MiB 297-312 -> 241-280 against the receiver's reads; cost.written_where_crowded),
its receiver reads it from there up and with a core per rank from 512 KiB
(EXCHANGE; reading at N = 4, 1 MiB took 385 -> 335 us against streaming).
Cost: α_busy + (N-2)·α' + (N-1)/N·K·β, α' the cost of each message after
the step's first: half a step where blocks go eagerly (COMMRT_EAGER_LIMIT)
or their senders write them (where ranks outnumber cores, below the
single-copy threshold), their waits overlapping the first's, else a whole α
(each its own RTS, read and FIN, one after another).  With a whole α for
written blocks too the model tied direct and the ring exactly where ranks
outnumber cores (α ≥ α_busy here) and the tie went to the ring, while
direct measured faster at N = 3 and 4 from 64 KiB to 16 MiB once its
blocks were written (N = 4 1 MiB 245 against 342 µs, N = 3 175 against
211; 2026-12-05, docs/performance-collectives.md).  Measured at 8 B - 1 KiB blocks on 2 cores,
planned: a step (the ring's per step) 1.3 µs at N = 3, 1.8 at N = 4, 5 at
N = 8; each further message of direct's one step 0.8, 1.0 and 2.0 µs.  With
a whole α for every message the model took the ring at N = 3, 17% slower
than direct, and Bruck at N = 4, 8-10% slower; with half a step for large
blocks too, direct at 1 MiB at N = 3 and 4, 12-15% slower than the ring.
Bytes sent per rank: (N-1)·|block|.
"""
from commrt import config
from commrt.collectives.cost import single_copy_min, written_where_crowded
from commrt.collectives.registry import Msg
from commrt.comm import Channel

TIE = 2


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    return (p.step(n) + (n - 2) * further(p, n, nbytes / n, True, comm)
            + (n - 1) * nbytes / n * p.beta * p.rho(n))


def further(p, n, block, written=False, comm=None):
    """α' of each message of a step after its first (see the module's text): half
    a step where blocks go eagerly, or where their senders write them
    (written: this algorithm's copier, where ranks outnumber cores below the
    single-copy threshold), their waits overlapping the first's; else α."""
    if block <= config.get("COMMRT_EAGER_LIMIT"):
        return p.step(n) / 2
    if written and p.oversubscribed(n) and block < single_copy_min(comm):
        return p.step(n) / 2
    return p.alpha


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in out."""
    m = count
    if n == 1:
        return []
    recvs = [Msg("recv", (rank - k) % n, (rank - k) % n * m, ((rank - k) % n + 1) * m)
             for k in range(1, n)]
    sends = [Msg("send", (rank + k) % n, rank * m, (rank + 1) * m) for k in range(1, n)]
    return [recvs + sends]


def copier(chan, cache, nbytes):
    """The copier of each receive of an nbytes block, the general path's and the
    plan's (plans.prepare): the module's text."""
    return written_where_crowded(chan, cache, nbytes, Channel.EXCHANGE)


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    who = copier(call.chan, call.state.cache, buf.nbytes)
    rvs = []
    for k in range(1, n):
        q = (r - k) % n
        rvs.append(call.irecv(out[q * m:(q + 1) * m], q, who))
    for k in range(1, n):
        call.isend(buf, (r + k) % n)
    call.copy(out[r * m:(r + 1) * m], buf, answering=rvs)
    call.waitall(rvs)
