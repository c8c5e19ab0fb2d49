"""Binary-tree all-reduce, pipelined in segments.

Tree: heap order on ranks (parent (r-1)//2, children 2r+1 and 2r+2), root 0.
Steps, per segment of COMMRT_RING_SEGMENT_BYTES (C segments):
  up:   receive the segment from each child (posted one segment ahead, two
        scratch slots per child), reduce both into one's own, first child
        first, send it to the parent.  Where the reduction has a C loop the
        children's segments are reduce-receives, combined into one's own as
        they land (no scratch); the second child's is posted once the
        first's has completed, which keeps that order;
  down: the root sends each reduced segment to its children at once; every
        other rank receives it from its parent into its buffer and forwards
        it to its children as soon as it lands.
Segments stream up and down concurrently, so for large K the time tends to
one pass of K through a node rather than depth passes.  A result segment
can only arrive after the parent received ours, so it lands in the buffer
the up-send read.

Cost (d = ceil(log2(N+1)) - 1, s = K/C, k children): the first segment's trip
up and down, d·(k+1)·α + 2d·s·(β + γ) (a node takes its children's copies
one after the other), then one segment per busiest-node time,
(C-1)·(k·s·(β + γ) + s·β + (k+1)·α).
Bytes: a leaf sends K; an inner node sends K up and K per child down; the
root sends K per child.
"""
import math

from commrt.collectives.chunking import seg_elems, segments
from commrt.collectives.registry import Msg


TIE = 4


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    depth = max(1, math.ceil(math.log2(n + 1)) - 1)
    c = p.nseg(nbytes)
    seg = nbytes / c
    kids = min(2, n - 1)
    g = p.g(seg)
    # the busiest node per segment: the root receives and reduces its children's;
    # rank 1 also receives the parent's result
    per_seg = max(kids, (3 < n) + (4 < n) + 1) * seg * (p.beta + g) - (seg * g if n > 3 else 0)
    # every further segment waits on a parent or child: a context switch where
    # ranks outnumber cores (as the ring's segments); on the way up a node takes
    # its children's copies one after the other (the second child's is posted
    # once the first's is combined), so the first segment's trip is depth·kids
    # waits up and depth down (with one α a level, its prepared plan, N = 5 on
    # 2 cores, was chosen over recursive doubling at 8 B: 17 µs against 10-11)
    lat = depth * (kids + 1) * p.step(n) + (c - 1) * (kids + 1) * p.step(n)
    crit = 2 * depth * seg * (p.beta + g) + (c - 1) * per_seg
    return p.time(n, lat, crit, (n - 1) * nbytes * (2 * p.beta + g))


def pipelined(parent, children, pieces, lag):
    """One tree's messages at a rank, one block of steps per segment: combine
    segment i from the children (and send on the result segment received in
    the block before), then send it up
    and receive result segment i - lag from the parent.  The runtime forwards a
    result segment whenever it has landed (it tests between segments); in the
    schedule it is received `lag` segments behind the one sent up (lag: twice
    the rank's depth, the segments in flight up to the root and back)."""
    blocks, fwd = [], None
    down = list(pieces) if parent is not None else []
    nxt = 0                           # the next result segment to receive
    for i, (lo, hi) in enumerate(pieces):
        first = [Msg("send", c, *fwd) for c in children] if fwd else []
        fwd = None
        first += [Msg("combine", c, lo, hi) for c in children]
        if parent is None:            # the root: the result goes down next block
            blocks.append([first])
            fwd = (lo, hi)
            continue
        second = [Msg("send", parent, lo, hi)]
        if i - lag >= nxt:
            second.append(Msg("recv", parent, *down[nxt]))
            fwd = down[nxt]
            nxt += 1
        blocks.append([first, second] if first else [second])
    tail = []
    while nxt < len(down) or fwd:
        step = [Msg("send", c, *fwd) for c in children] if fwd else []
        fwd = None
        if nxt < len(down):
            step.append(Msg("recv", parent, *down[nxt]))
            fwd = down[nxt]
            nxt += 1
        if step:
            tail.append(step)
    return blocks + ([tail] if tail else [])


def level(parents, r):
    """Depth of rank r below the root of a tree given by each rank's parent."""
    d = 0
    while parents[r] is not None:
        r, d = parents[r], d + 1
    return d


def schedule(n, rank, count, root=0, itemsize=4):
    """run's messages (see pipelined)."""
    if n == 1:
        return []
    parent = (rank - 1) // 2 if rank else None
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]
    depth = (rank + 1).bit_length() - 1
    blocks = pipelined(parent, children, segments(0, count, seg_elems(itemsize)), 2 * depth)
    return [step for block in blocks for step in block]


def run(call, buf, red):
    n, r = call.size, call.rank
    if n == 1:
        return
    parent = (r - 1) // 2 if r else None
    children = [c for c in (2 * r + 1, 2 * r + 2) if c < n]
    pieces = segments(0, buf.size, seg_elems(buf.itemsize))
    # With a C loop each child's segment is combined into buf[lo:hi] as it
    # lands: nothing reads that segment before its receives complete (the
    # up-send follows them) and nothing else writes it until the parent's
    # result, which is posted after the up-send.  The second child's is
    # posted only once the first child's has completed: posted together they
    # would combine in arrival order (rank 2, a leaf, is usually first), and
    # the result must be (own OP first) OP second, as from scratch.  The next
    # segment's first-child receive is in flight meanwhile.  (Through scratch,
    # both children's are posted a segment ahead, two slots per child.)
    ahead = children if not red.lands else children[:1]

    def post_up(i):
        lo, hi = pieces[i]
        return [call.irecv_combine(buf[lo:hi], c, red, ("tree", c, i % 2)) for c in ahead]

    down = []          # (lo, hi, receive) of result segments from the parent
    forwarded = 0

    def forward_ready(block):
        nonlocal forwarded
        while forwarded < len(down):
            lo, hi, rv = down[forwarded]
            if block:
                call.wait(rv)
            elif not call.test(rv):
                return
            for c in children:
                call.isend(buf[lo:hi], c)
            forwarded += 1

    nxt = post_up(0) if children else []
    for i, (lo, hi) in enumerate(pieces):
        cur = nxt
        if children and i + 1 < len(pieces):
            nxt = post_up(i + 1)
        for cb in cur:
            call.wait_combine(cb)
        for c in children[len(ahead):]:
            call.recv_combine(buf[lo:hi], c, red, ("tree", c))
        if parent is None:
            for c in children:
                call.isend(buf[lo:hi], c)
        else:
            call.isend(buf[lo:hi], parent)
            down.append((lo, hi, call.irecv(buf[lo:hi], parent)))
            forward_ready(False)
    forward_ready(True)
