"""Ring all-reduce: reduce-scatter then all-gather around a ring, segmented.

Steps (N ranks, K bytes, chunk c = c-th of N near-equal parts, right = r+1,
left = r-1, all mod N):
  1. reduce-scatter, N-1 steps: at step s rank r sends chunk r-s to the
     right and receives chunk r-s-1 from the left, reducing it into its own.
     Each chunk travels in segments (COMMRT_RING_SEGMENT_BYTES): as soon as
     a segment arrives it is reduced and sent on, so reducing one segment
     overlaps moving the next.  Where the reduction has a C loop
     (reduce.hook) every receive is a reduce-receive posted up front: the
     transport combines each piece into the buffer as it lands, so received
     bytes are never stored and read back.  Otherwise segments land in a
     few segment-sized receive slots (SLOTS) that stay in cache; a slot
     takes the next receive, whatever its step, once it has been reduced from.
  2. rank r now holds chunk r+1 fully reduced.
  3. all-gather, N-1 steps: rank r sends chunk r+1-s, receives chunk r-s
     straight into its buffer, and forwards each segment as it lands.
Every chunk is reduced by exactly one rank, so all ranks end bitwise equal.

Cost: 2(N-1)·α + 2·(N-1)/N·K·β + (N-1)/N·K·γ  (bandwidth-optimal; latency
grows with N).  Bytes sent per rank: 2K - |chunk r+1| - |chunk r+2|, i.e.
2(N-1)/N·K when N divides the count.
"""
import collections

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


# Receive slots in flight: each incoming segment lands in one of a few
# segment-sized buffers that stay in cache, is reduced from there and the
# slot takes the next receive.  (A chunk-sized scratch would push every byte
# out to memory and back once more: at 16 MiB that is a third more traffic.)
SLOTS = 4


def reduce_scatter(call, buf, reduce):
    """Step 1 (segmented, pipelined): afterwards rank r holds chunk (r+1) mod N
    of buf fully reduced.  Returns the chunk bounds.  Also the first half of
    the ring reduce (collectives/algorithms/reduce.py)."""
    n_ranks, r = call.size, call.rank
    right, left = (r + 1) % n_ranks, (r - 1) % n_ranks
    b = bounds(buf.size, n_ranks)
    seg = seg_elems(buf.itemsize)
    # every segment that will arrive from the left, in the order it is sent: (step, lo, hi)
    incoming = [(s, lo, hi) for s in range(n_ranks - 1)
                for lo, hi in segments(b[(r - s - 1) % n_ranks], b[(r - s - 1) % n_ranks + 1], seg)]
    hook = getattr(reduce, "hook", 0)
    if hook:
        _reduce_scatter_in_place(call, buf, b, seg, incoming, hook, right, left)
        return b
    width = max(hi - lo for _, lo, hi in incoming)
    slots = [call.state.scratch(f"ring{k}", width, buf.dtype)
             for k in range(min(SLOTS, len(incoming)))]
    posted = collections.deque()

    def post(i):
        s, lo, hi = incoming[i]
        t = slots[i % len(slots)][: hi - lo]
        posted.append((s, lo, hi, t, call.irecv(t, left)))

    for i in range(len(slots)):        # receives first: matched without queueing
        post(i)
    for lo, hi in segments(b[r], b[r + 1], seg):
        call.isend(buf[lo:hi], right)
    nxt = len(slots)
    while posted:
        s, lo, hi, t, rv = posted.popleft()
        call.wait(rv)
        reduce(buf[lo:hi], t)
        if s < n_ranks - 2:
            call.isend(buf[lo:hi], right)
        if nxt < len(incoming):        # the slot just reduced from is free again
            post(nxt)
            nxt += 1
    return b


def _reduce_scatter_in_place(call, buf, b, seg, incoming, hook, right, left):
    """Step 1 with reduce-receives: each incoming segment is combined into its
    place in buf by the transport, so all can be posted at once (a chunk is
    received once and sent only after it was reduced: no receive overlaps a
    send); then each is forwarded as it completes."""
    n_ranks, r = call.size, call.rank
    posted = [(s, lo, hi, call.irecv_reduce(buf[lo:hi], left, hook)) for s, lo, hi in incoming]
    for lo, hi in segments(b[r], b[r + 1], seg):
        call.isend(buf[lo:hi], right)
    for s, lo, hi, rv in posted:
        call.wait(rv)
        if s < n_ranks - 2:
            call.isend(buf[lo:hi], right)


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
