"""Ring all-reduce: reduce-scatter then all-gather around a ring, segmented.

Steps (N ranks, K bytes, chunk c = c-th of N near-equal parts, right = r+1,
left = r-1, all mod N):
  1. reduce-scatter, N-1 steps: at step s rank r sends chunk r-s to the
     right and receives chunk r-s-1 from the left, reducing it into its own.
     This is reduce_scatter/ring.in_place (shared with the ring reduce):
     each chunk travels in segments (COMMRT_RING_SEGMENT_BYTES), each
     combined and sent on as soon as it arrives, so reducing one segment
     overlaps moving the next; combines that land in place are all posted
     up front, otherwise segments land in a few scratch slots in cache.
  2. rank r now holds chunk r+1 fully reduced: each of its segments is sent
     to the right as soon as its last combine is done, still inside step 1,
     so the all-gather's first bytes follow the reduce-scatter's last ones on
     the link with no pause (waiting for the whole reduce-scatter first left
     the link idle for a round trip: at N = 2 over TCP, half of the work).
  3. all-gather, N-1 steps: rank r sends chunk r+1-s, receives chunk r-s
     straight into its buffer (posted once the reduce-scatter's sends, which
     read those chunks, are done), and forwards each segment as it lands.
Every chunk is reduced by exactly one rank, so all ranks end bitwise equal.

Cost: 2(N-1)·α + 2·(N-1)/N·K·β + (N-1)/N·K·γ  (bandwidth-optimal; latency
grows with N).  Bytes sent per rank: 2K - |chunk r+1| - |chunk r+2|, i.e.
2(N-1)/N·K when N divides the count.
"""
from commrt.collectives.chunking import bounds, seg_elems, segments
from commrt.collectives.reduce_scatter import ring as ring_rs
from commrt.collectives.registry import Msg


TIE = 2
# every step waits on a neighbour: α_busy where ranks outnumber cores, planned or
# not (cost.predict)
SEGMENT_WAITS = True
# across hosts the ring's block placement sends one stream per host and direction
NET_SHARE = 1
# rank r's schedule is rank 0's with every peer turned by r (and chunk c by r):
# with N dividing the count the simulator need only list rank 0's (sim/engine.py)
ROTATES = True
# every combine of its schedule is a reduce-receive where the reduction has a C
# loop (combined as it lands, no scratch), on its plan and on the general path:
# the simulator prices it as such (sim/engine.py land_at)
LANDS = True


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    chunk = nbytes / n
    # every segment of every step waits on the left neighbour: with more ranks
    # than cores each such wait is a context switch (α_busy), not just a message
    lat = 2 * (n - 1) * p.nseg(chunk) * p.step(n)
    crit = (n - 1) * chunk * (2 * p.beta + p.g(min(chunk, p.segment)))
    return p.time(n, lat, crit, n * crit)


def schedule(n, rank, count, root=0, itemsize=4):
    """The in-place ring reduce-scatter's steps, each segment of chunk r+1 sent on
    as its last combine is done, then the all-gather's: each step receives a
    segment and forwards the one just received (but the last chunk's)
    (positions in buf)."""
    if n == 1:
        return []
    r = rank
    right, left = (r + 1) % n, (r - 1) % n
    steps = ring_rs.in_place_schedule(n, r, count, itemsize, send_own=True)
    b = bounds(count, n)
    seg = seg_elems(itemsize)
    for s in range(n - 1):
        c = (r - s) % n
        for lo, hi in segments(b[c], b[c + 1], seg):
            steps[-1].append(Msg("recv", left, lo, hi))
            steps.append([Msg("send", right, lo, hi)] if s < n - 2 else [])
    if not steps[-1]:
        steps.pop()
    return steps


def run(call, buf, red):
    n_ranks, r = call.size, call.rank
    if n_ranks == 1:
        return
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    seg = seg_elems(buf.itemsize)

    # 1. reduce-scatter; 2. each segment of chunk r+1 goes right once complete
    rs_sends = []

    def send_own(lo, hi):
        if not rs_sends:
            rs_sends.append(len(call.sends))    # every send before it is the reduce-scatter's
        call.isend(buf[lo:hi], right)

    b = ring_rs.in_place(call, buf, red, on_own=send_own)

    def pieces(c):
        return segments(b[c], b[c + 1], seg)

    # 3. all-gather: receives land in chunks the reduce-scatter's sends read
    call.wait_sends(rs_sends[0] if rs_sends else None)
    posted = [[(lo, hi, call.irecv(buf[lo:hi], left)) for lo, hi in pieces((r - s) % n_ranks)]
              for s in range(n_ranks - 1)]
    for s in range(n_ranks - 1):
        fwd = s < n_ranks - 2
        for lo, hi, rv in posted[s]:
            call.wait(rv)
            if fwd:
                call.isend(buf[lo:hi], right)
