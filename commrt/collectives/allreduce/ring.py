"""Ring all-reduce: reduce-scatter then all-gather around a ring, segmented.

Steps (N ranks, K bytes, chunk c = c-th of N near-equal parts, right = r+1,
left = r-1, all mod N):
  1. reduce-scatter, N-1 steps: at step s rank r sends chunk r-s to the
     right and receives chunk r-s-1 from the left, reducing it into its own.
     Each chunk travels in segments (COMMRT_RING_SEGMENT_BYTES): as soon as
     a segment arrives it is reduced and sent on, so reducing one segment
     overlaps moving the next; receives of step s+1 are posted before step
     s is reduced (two scratch chunks, alternating).
  2. rank r now holds chunk r+1 fully reduced.
  3. all-gather, N-1 steps: rank r sends chunk r+1-s, receives chunk r-s
     straight into its buffer, and forwards each segment as it lands.
Every chunk is reduced by exactly one rank, so all ranks end bitwise equal.

Cost: 2(N-1)·α + 2·(N-1)/N·K·β + (N-1)/N·K·γ  (bandwidth-optimal; latency
grows with N).  Bytes sent per rank: 2K - |chunk r+1| - |chunk r+2|, i.e.
2(N-1)/N·K when N divides the count.
"""
from commrt.collectives._engine import bounds, seg_elems, segments


def cost(n, nbytes, p):
    if n == 1:
        return 0.0
    chunk = nbytes / n
    # every segment of every step waits on the left neighbour: with more ranks
    # than cores each such wait is a context switch (α_busy), not just a message
    lat = 2 * (n - 1) * p.nseg(chunk) * p.step(n)
    crit = (n - 1) * chunk * (2 * p.beta + p.g(min(chunk, p.segment)))
    return p.time(n, lat, crit, n * crit)


def reduce_scatter(call, buf, reduce):
    """Step 1 (segmented, pipelined): afterwards rank r holds chunk (r+1) mod N
    of buf fully reduced.  Returns the chunk bounds.  Also the first half of
    the ring reduce (collectives/algorithms/reduce.py)."""
    n_ranks, r = call.size, call.rank
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    b = bounds(buf.size, n_ranks)
    seg = seg_elems(buf.itemsize)
    width = b[1] - b[0]
    tmp = (call.state.scratch("ring0", width, buf.dtype),
           call.state.scratch("ring1", width, buf.dtype))

    def post(s):
        c = (r - s - 1) % n_ranks
        t, base = tmp[s % 2], b[c]
        return [(lo, hi, call.irecv(t[lo - base:hi - base], left))
                for lo, hi in segments(b[c], b[c + 1], seg)]

    nxt = post(0)  # receives first: the transport matches them without queueing
    for lo, hi in segments(b[r], b[r + 1], seg):
        call.isend(buf[lo:hi], right)
    for s in range(n_ranks - 1):
        cur = nxt
        last = s == n_ranks - 2
        if not last:
            nxt = post(s + 1)
        c = (r - s - 1) % n_ranks
        t, base = tmp[s % 2], b[c]
        for lo, hi, rv in cur:
            call.wait(rv)
            reduce(buf[lo:hi], t[lo - base:hi - base])
            if not last:
                call.isend(buf[lo:hi], right)
    return b


def run(call, buf, reduce):
    n_ranks, r = call.size, call.rank
    if n_ranks == 1:
        return
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    seg = seg_elems(buf.itemsize)

    # 1. reduce-scatter
    b = reduce_scatter(call, buf, reduce)

    def pieces(c):
        return segments(b[c], b[c + 1], seg)

    # 2. chunk r+1 is complete here
    own = (r + 1) % n_ranks
    # 3. all-gather: receives land in chunks whose sends must have completed
    call.wait_sends()
    posted = [[(lo, hi, call.irecv(buf[lo:hi], left)) for lo, hi in pieces((r - s) % n_ranks)]
              for s in range(n_ranks - 1)]
    for lo, hi in pieces(own):
        call.isend(buf[lo:hi], right)
    for s in range(n_ranks - 1):
        fwd = s < n_ranks - 2
        for lo, hi, rv in posted[s]:
            call.wait(rv)
            if fwd:
                call.isend(buf[lo:hi], right)
