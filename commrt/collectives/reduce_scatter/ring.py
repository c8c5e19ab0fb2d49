"""Ring reduce-scatter (large messages), and the in-place ring reduce-scatter
that the ring all-reduce and the ring reduce start with.

run (out of place; buf is never written)
  N-1 steps: at step s send the partial block r-s-1 to the right, receive
  the partial block r-s-2 from the left and reduce one's own copy into it;
  the last step's receive lands in out, so rank r ends with block r.
  Segmented (COMMRT_RING_SEGMENT_BYTES).
  Cost: (N-1)·(α + K/N·β + K/N·γ).  Bytes sent per rank: (N-1)·|block|.

in_place (buf holds the result; chunk c = c-th of N near-equal parts)
  N-1 steps: at step s rank r sends chunk r-s to the right and receives
  chunk r-s-1 from the left, combining it into its own; each chunk travels
  in segments, each forwarded as soon as it is combined.  Where the
  reduction combines as messages land (Reduction.lands) every receive is
  posted up front; otherwise segments land in a few segment-sized scratch
  slots (SLOTS) that stay in cache, each re-posted once reduced from.
  Afterwards rank r holds chunk r+1 fully reduced.  A caller may take each
  segment of it as soon as its last combine is done (``on_own``: the ring
  all-reduce sends it on at once, so its all-gather follows the
  reduce-scatter on the link without a pause between the two).
  Cost: (N-1)·(α + K/N·β + K/N·γ).  Bytes sent per rank: K - |chunk r+1|.
"""
import collections

from commrt.collectives.chunking import bounds, seg_elems, segments
from commrt.collectives.registry import Msg

TIE = 2   # after pairwise at equal cost (pairwise.py)

# Receive slots in flight without a C loop: each incoming segment lands in one
# of a few segment-sized buffers that stay in cache, is reduced from there and
# the slot takes the next receive.  (A chunk-sized scratch would push every
# byte out to memory and back once more: at 16 MiB a third more traffic.)
SLOTS = 4


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    block = nbytes / n
    return (n - 1) * (p.nseg(block) * p.alpha + block * (p.beta + p.gamma)) * p.rho(n)


def schedule(n, rank, count, root=0, itemsize=4):
    """run's messages.  count: elements of buf (N blocks of m = count // N).
    Sends give the partial block's place in buf (step 0 reads buf, later steps
    the scratch it was combined in); receives give the block's place in buf,
    but the last step's, which lands in out: its place there, [0, m).  Every
    receive is combined with one's own copy of the block, hence "combine"."""
    if n == 1:
        return []
    r, m = rank, count // n
    right, left = (r + 1) % n, (r - 1) % n
    pieces = segments(0, m, seg_elems(itemsize))
    c0 = (r - 1) % n
    steps = [[Msg("send", right, c0 * m + lo, c0 * m + hi) for lo, hi in pieces]]
    for s in range(n - 1):
        c = (r - s - 2) % n
        base = 0 if s == n - 2 else c * m
        for lo, hi in pieces:
            # the segment of step s-1 goes on once reduced (wait_sends between steps
            # only frees a scratch slot: no message of its own)
            steps[-1].append(Msg("combine", left, base + lo, base + hi))
            if s < n - 2:
                steps.append([Msg("send", right, c * m + lo, c * m + hi)])
    return steps


def in_place_schedule(n, rank, count, itemsize=4, send_own=False):
    """in_place's messages (chunk c of N near-equal parts of the buffer): the first
    step sends chunk r and combines the first incoming segment; each later one
    sends on the segment just combined (but the last step's: with send_own, as
    in the ring all-reduce, those go right too) and combines the next."""
    r = rank
    right, left = (r + 1) % n, (r - 1) % n
    b = bounds(count, n)
    seg = seg_elems(itemsize)
    steps = [[Msg("send", right, lo, hi) for lo, hi in segments(b[r], b[r + 1], seg)]]
    for s in range(n - 1):
        c = (r - s - 1) % n
        for lo, hi in segments(b[c], b[c + 1], seg):
            steps[-1].append(Msg("combine", left, lo, hi))
            steps.append([Msg("send", right, lo, hi)] if s < n - 2 or send_own else [])
    if not steps[-1]:
        steps.pop()
    return steps


def run(call, out, buf, red):
    n, r = call.size, call.rank
    if n == 1:
        call.copy(out, buf)
        return
    m = out.size
    right, left = (r + 1) % n, (r - 1) % n
    pieces = segments(0, m, seg_elems(buf.itemsize))
    tmp = (call.state.scratch("rsr0", m, buf.dtype), call.state.scratch("rsr1", m, buf.dtype))

    def target(s):  # where step s's incoming partial block lands
        return out if s == n - 2 else tmp[s % 2]

    def post(s):
        t = target(s)
        return [(lo, hi, call.irecv(t[lo:hi], left)) for lo, hi in pieces]

    c0 = (r - 1) % n
    for lo, hi in pieces:
        call.isend(buf[c0 * m + lo:c0 * m + hi], right)
    nxt = post(0)
    for s in range(n - 1):
        cur = nxt
        last = s == n - 2
        if not last:
            call.wait_sends()  # tmp[(s+1)%2] was forwarded from at step s-1
            nxt = post(s + 1)
        c = (r - s - 2) % n
        t = target(s)
        for lo, hi, rv in cur:
            call.wait(rv)
            red(t[lo:hi], buf[c * m + lo:c * m + hi])  # the incoming partial first
            if not last:
                call.isend(t[lo:hi], right)


def in_place(call, buf, red, on_own=None):
    """The in-place ring reduce-scatter (see the module text); returns the chunk
    bounds.  Rank r ends holding chunk (r+1) mod N of buf fully reduced;
    on_own(lo, hi) is called with each segment of it as soon as it is (after
    every send of the reduce-scatter has been posted)."""
    n, r = call.size, call.rank
    right, left = (r + 1) % n, (r - 1) % n
    b = bounds(buf.size, n)
    seg = seg_elems(buf.itemsize)
    # every segment that will arrive from the left, in the order it is sent
    incoming = [(s, lo, hi) for s in range(n - 1)
                for lo, hi in segments(b[(r - s - 1) % n], b[(r - s - 1) % n + 1], seg)]
    # a combine that lands needs no slot, so all may be in flight (a chunk is
    # received once and sent only after it was combined)
    window = len(incoming) if red.lands else min(SLOTS, len(incoming))
    posted = collections.deque()

    def post(i):
        s, lo, hi = incoming[i]
        posted.append((s, lo, hi, call.irecv_combine(buf[lo:hi], left, red, ("ring", i % window))))

    for i in range(window):            # receives first: matched without queueing
        post(i)
    for lo, hi in segments(b[r], b[r + 1], seg):
        call.isend(buf[lo:hi], right)
    nxt = window
    while posted:
        s, lo, hi, cb = posted.popleft()
        call.wait_combine(cb)
        if s < n - 2:
            call.isend(buf[lo:hi], right)
        elif on_own is not None:
            on_own(lo, hi)
        if nxt < len(incoming):        # the slot just reduced from is free again
            post(nxt)
            nxt += 1
    return b
