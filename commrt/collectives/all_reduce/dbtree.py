"""Double binary tree all-reduce (NCCL's "tree"): two complementary trees, each half the data.

Trees (N ranks):
  tree 0  an in-order binary tree on the ranks: a rank's height is its
          number of trailing zero bits, so odd ranks are the leaves; rank r
          with lowest set bit b hangs under (r - b) | 2b, or under r - b
          when that is past the last rank; rank 0 is the root, with one
          child (the highest power of two below N).
  tree 1  tree 0 mirrored (rank r plays N-1-r) when N is even, shifted by
          one (rank r plays r-1) when N is odd.
With N even every rank is a leaf in one tree and an inner node in at most
the other (N odd: rank 0 inner in both, as a root of one child in tree 0),
so each rank sends and receives about K per tree pass instead of 2K as in
one binary tree, and the two trees keep every link busy in both directions.

Steps: the buffer's two halves (K/2 each) are all-reduced on tree 0 and
tree 1 at once, each pipelined in segments of COMMRT_RING_SEGMENT_BYTES:
  up:   a node receives a segment from each child (posted one segment
        ahead), combines them into its own (first child, then second; with a
        C loop as reduce-receives, the second posted once the first landed,
        which keeps that order), and sends it to its parent;
  down: the root sends each reduced segment to its children; a node
        receives it from its parent into its buffer and forwards it at once.
The segments of the two trees take turns, segment by segment.  Each tree
runs on its own derived communicator (own context): between one pair of
ranks the trees' messages may cross in any order without matching each
other's receives.  The result is computed at each tree's root and sent
down, so every rank ends bitwise equal.

Cost (d = depth ~ log2 N, s = a segment, C segments of one half): the first
segment's trip up and down, 2d·(α + s·(β + γ)), then per further segment
index the busiest rank, an inner node of one tree and a leaf of the other:
in its inner tree it receives 2s from its children and s from its parent
and combines 2s, in its leaf tree it receives s: (C-1)·(4s·β + 2s·γ + 3α),
so 2K·β + K·γ for large K (Rabenseifner's 2(N-1)/N·K·β is less: the trees
win on latency, log depth with pipelined segments, not on bytes).  Bytes
sent per rank: about 2K for the busiest, K on average.
"""
import math

from commrt.collectives.all_reduce import tree as _tree
from commrt.collectives.call import Call
from commrt.collectives.chunking import bounds, seg_elems, segments
from commrt.collectives.registry import on_context

TIE = 5

_PARENTS = {}


def _btree_parents(n):
    """Parent of each rank in tree 0 (None for the root)."""
    parents = [None] * n
    for r in range(1, n):
        low = r & -r
        up = (r - low) | (low << 1)
        parents[r] = up if up < n else r - low
    return parents


def parents(n, which):
    """Parent of every rank in tree `which` (0 or 1) of N ranks (None: the root)."""
    key = (n, which)
    got = _PARENTS.get(key)
    if got is None:
        base = _btree_parents(n)
        if which == 0:
            got = base
        elif n % 2 == 0:   # mirror
            got = [None if base[n - 1 - r] is None else n - 1 - base[n - 1 - r]
                   for r in range(n)]
        else:              # shift by one
            got = [None if base[(r - 1) % n] is None else (base[(r - 1) % n] + 1) % n
                   for r in range(n)]
        _PARENTS[key] = got
    return got


_CHILDREN = {}


def tree(n, r, which):
    """(parent or None, [children, lower first]) of rank r in tree `which`."""
    par = parents(n, which)
    kids = _CHILDREN.get((n, which))
    if kids is None:   # every rank's at once: the simulator asks for all N
        kids = [[] for _ in range(n)]
        for c in range(n):
            if par[c] is not None:
                kids[par[c]].append(c)
        _CHILDREN[(n, which)] = kids
    return par[r], list(kids[r])


def depth(n):
    return max(1, math.ceil(math.log2(n))) if n > 1 else 0


def cost(n, nbytes, p, comm=None):
    if n == 1:
        return 0.0
    half = nbytes / 2
    c = p.nseg(half)
    seg = half / c
    g = p.g(seg)
    d = depth(n)
    # every further segment waits on a parent or child: a context switch where
    # ranks outnumber cores (as the ring's segments)
    lat = 2 * d * p.step(n) + (c - 1) * 3 * p.step(n)
    crit = 2 * d * seg * (p.beta + g) + (c - 1) * seg * (4 * p.beta + 2 * g)
    return p.time(n, lat, crit, (n - 1) * nbytes * (2 * p.beta + g))


def communicators(call):
    """The two trees' communicators (same ranks, own contexts), derived once."""
    cached = call.state.cache.get("dbtree")
    if cached is None:
        ranks = list(range(call.size))
        cached = call.state.cache["dbtree"] = tuple(
            call.comm.channel.derive(ranks, ("dbtree", t)) for t in (0, 1))
    return cached


class _Tree:
    """One tree's pass over buf[lo:hi] on its own Call."""

    def __init__(self, call, which, buf, lo, hi, red):
        self.call, self.buf, self.red, self.which = call, buf, red, which
        self.parent, self.children = tree(call.size, call.rank, which)
        self.pieces = segments(lo, hi, seg_elems(buf.itemsize))
        # combines that land need no slot: only the first child's is posted a
        # segment ahead, the second's once the first landed (operand order);
        # through scratch both are, two slots per child
        self.ahead = self.children if not red.lands else self.children[:1]
        self.down, self.forwarded = [], 0
        self.next_up = self._post_up(0) if self.children else []

    def _post_up(self, i):
        lo, hi = self.pieces[i]
        slot = ("dbtree", self.which)
        return [self.call.irecv_combine(self.buf[lo:hi], c, self.red, slot + (c, i % 2))
                for c in self.ahead]

    def step(self, i):
        """Segment i: combine the children's, send it up (or down, at the root)."""
        call, buf = self.call, self.buf
        lo, hi = self.pieces[i]
        cur = self.next_up
        if self.children and i + 1 < len(self.pieces):
            self.next_up = self._post_up(i + 1)
        for cb in cur:
            call.wait_combine(cb)
        for c in self.children[len(self.ahead):]:
            call.recv_combine(buf[lo:hi], c, self.red, ("dbtree", self.which, c))
        if self.parent is None:
            for c in self.children:
                call.isend(buf[lo:hi], c)
        else:
            call.isend(buf[lo:hi], self.parent)
            self.down.append((lo, hi, call.irecv(buf[lo:hi], self.parent)))
        self.forward(False)

    def forward(self, block):
        """Send on the result segments that have come down from the parent."""
        while self.forwarded < len(self.down):
            lo, hi, rv = self.down[self.forwarded]
            if block:
                self.call.wait(rv)
            elif not self.call.test(rv):
                return
            for c in self.children:
                self.call.isend(self.buf[lo:hi], c)
            self.forwarded += 1


def schedule(n, rank, count, root=0, itemsize=4):
    """Each tree's pass over its half (all_reduce/tree.pipelined, on the tree's
    own context, ctx ("dbtree", t)), the trees' blocks taking turns segment by
    segment as run's do."""
    if n == 1 or count == 0:
        return []
    b = bounds(count, 2)
    seg = seg_elems(itemsize)
    per_tree = []
    for t in (0, 1):
        if b[t + 1] > b[t]:
            parent, children = tree(n, rank, t)
            lag = 2 * _tree.level(parents(n, t), rank)
            blocks = _tree.pipelined(parent, children, segments(b[t], b[t + 1], seg), lag)
            per_tree.append([on_context(("dbtree", t), block) for block in blocks])
    steps = []
    for i in range(max(len(blocks) for blocks in per_tree)):
        for blocks in per_tree:
            if i < len(blocks):
                steps += blocks[i]
    return steps


def run(call, buf, red):
    n = call.size
    if n == 1 or buf.size == 0:
        return
    b = bounds(buf.size, 2)
    comms = communicators(call)
    kw = dict(count=call.count, dtype=call.dtype, op=call.op, timeout=call.timeout, outer=call)
    trees = []
    for t in (0, 1):
        if b[t + 1] > b[t]:
            sub = Call(comms[t], "all_reduce", algo="dbtree", label=f"{call.name} (tree {t})", **kw)
            sub.start()
            trees.append(_Tree(sub, t, buf, b[t], b[t + 1], red))
    for i in range(max(len(t.pieces) for t in trees)):
        for t in trees:   # the trees take turns, segment by segment
            if i < len(t.pieces):
                t.step(i)
    for t in trees:
        t.forward(True)
    for t in trees:
        t.call.end()
