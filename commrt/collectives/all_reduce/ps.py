"""Parameter-server all-reduce: everyone sends to rank 0, which reduces and sends back.

Steps, per segment of COMMRT_RING_SEGMENT_BYTES (so the root's scratch is
(N-1) segments, N-2 with a C loop, and reducing one segment overlaps
receiving the next):
  1. every rank r > 0 sends the segment to rank 0;
  2. rank 0 receives the N-1 copies and reduces them into its own with one
     pass (float16 accumulates in float32 across all of them); where the
     reduction has a C loop rank 1's copy is combined as it lands instead
     (reduce-receive), and the pass takes the others;
  3. rank 0 sends the result to every rank.
Cost: 2(N-1)·C·α + (N-1)·K·(β + γ) + K·β, α a step's (α_busy where ranks
outnumber cores: each of the root's messages waits for its peer's turn on a
core): the root receives and reduces everything, then the others copy the
result at once.
Bytes: the root sends and receives (N-1)·K; every other rank sends and
receives K.  Simple and the best at N = 2 for mid sizes on some transports.
"""
from commrt.collectives.chunking import seg_elems, segments
from commrt.collectives.registry import Msg


TIE = 6
# on its plan every combine is a reduce-receive (plans._all_reduce_ps); on the
# general path only rank 1's copy lands, the others go through scratch: the
# simulator prices the planned calls' combines as landing (sim/engine.py land_at)
LANDS = "plan"


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    # every message of the root's, each way, costs a step's α: where ranks outnumber
    # cores each waits for its peer's turn on a core (at N = 8 on 2 cores, costed
    # at α beyond the first, ps was chosen for 8 B and ran 370 µs against
    # recursive doubling's 19)
    lat = (2 * (n - 1) * p.nseg(nbytes)) * p.step(n)
    g = p.g(min(nbytes, p.segment) * (n - 1))  # one pass over the N-1 copies of a segment
    crit = (n - 1) * nbytes * (p.beta + g) + nbytes * p.beta
    return p.time(n, lat, crit, (n - 1) * nbytes * (2 * p.beta + g))


def schedule(n, rank, count, root=0, itemsize=4):
    """Every other rank sends each segment to rank 0 and receives the results, all
    posted at once; rank 0 combines segment i from every rank while it sends
    segment i-1's result to every rank."""
    if n == 1:
        return []
    pieces = segments(0, count, seg_elems(itemsize))
    if rank != 0:
        return [[Msg("send", 0, lo, hi) for lo, hi in pieces]
                + [Msg("recv", 0, lo, hi) for lo, hi in pieces]]
    steps, prev = [], None
    for piece in pieces + [None]:
        step = [] if prev is None else [Msg("send", q, *prev) for q in range(1, n)]
        if piece is not None:
            step += [Msg("combine", q, *piece) for q in range(1, n)]
        steps.append(step)
        prev = piece
    return steps


def run(call, buf, red):
    n, r = call.size, call.rank
    if n == 1:
        return
    pieces = segments(0, buf.size, seg_elems(buf.itemsize))
    if r != 0:
        for lo, hi in pieces:
            call.isend(buf[lo:hi], 0)
        # rank 0 sends a result segment only after receiving ours: safe to land in buf
        rvs = [call.irecv(buf[lo:hi], 0) for lo, hi in pieces]
        call.waitall(rvs)
        return
    width = pieces[0][1] - pieces[0][0]
    # With a C loop rank 1's segment is combined into buf[lo:hi] as it lands
    # (first, as it is the first source of the one pass): no send reads that
    # segment before all its copies are in; the other ranks' land in scratch,
    # disjoint, and the pass adds them after it in rank order.
    first = 2 if red.lands else 1
    tmps = [[call.state.scratch(("ps", k, q), width, buf.dtype) for q in range(first, n)]
            for k in (0, 1)]

    def post(i):
        lo, hi = pieces[i]
        rvs = [call.irecv_combine(buf[lo:hi], 1, red, None)] if red.lands else []
        return rvs + [call.irecv(t[: hi - lo], q) for t, q in zip(tmps[i % 2], range(first, n))]

    nxt = post(0)
    for i, (lo, hi) in enumerate(pieces):
        cur = nxt
        if i + 1 < len(pieces):
            nxt = post(i + 1)
        if red.lands:
            call.wait_combine(cur[0])
        call.waitall(cur[1:] if red.lands else cur)
        if first < n:
            red.many(buf[lo:hi], [t[: hi - lo] for t in tmps[i % 2]])
        for q in range(1, n):
            call.isend(buf[lo:hi], q)
