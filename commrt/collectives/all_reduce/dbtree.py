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
  up:   a node receives a segment from each child and combines it into its
        own (first child, then second: (own OP first) OP second), and sends
        it to its parent;
  down: the root sends each reduced segment to its children; a node
        receives it from its parent into its buffer and forwards it.
Both trees run in rounds (up_rounds, schedule): segment s leaves rank v
upward in round s + D[v] and the root downward in round s + R0, one level
a round; a node's two children send a segment one round apart, which keeps
the operand order without holding a receive back.  Both ranks of every
message post it in the same round, so ranks that wait for a whole round,
sends included (the prepared plan, plans._all_reduce_dbtree), and ranks
whose sends do not wait (run, the general path) never wait on each other's
later rounds, in any mix.  Each tree has a lane of its own in the call (its
tag, fingerprint.LANE_TAGS[t], on the call's context): between one pair of
ranks the trees' messages never match each other's receives.  The result
is computed at each tree's root and sent down, so every rank ends bitwise
equal.  Both trees are one Call, so a mismatch, a lost peer or an abort
fails the call as it does any other.

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
from commrt.collectives.chunking import bounds, seg_elems, segments
from commrt.collectives.fingerprint import LANE_TAGS
from commrt.collectives.registry import Msg, on_context

TIE = 5
# each round waits on a parent or child busy with the round before, for a
# context switch where ranks outnumber cores, planned or not (cost.predict)
SEGMENT_WAITS = True
# every combine of its schedule is a reduce-receive where the reduction has a C
# loop (combined as it lands, no scratch), on its plan and on the general path:
# the simulator prices it as such (sim/engine.py land_at)
LANDS = True

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


_ROUNDS = {}


def up_rounds(n, which):
    """(D, R0) of tree `which`: rank v sends segment s up in round s + D[v]; the
    root sends segment s down in round s + R0.  Bottom-up, a leaf sends in
    round s, a node's first child as soon as it is ready and its second one
    round after the first at the earliest (so a node takes its children's
    copies one round apart: (own OP first) OP second, the general path's
    order), and a node is ready one round after its last child's."""
    key = (n, which)
    got = _ROUNDS.get(key)
    if got is None:
        kids = [tree(n, v, which)[1] for v in range(n)]
        d = [0] * n

        def ready(v):                   # the round offset v's segment is whole after
            at = -1
            for c in kids[v]:
                d[c] = max(ready(c), at + 1)
                at = d[c]
            return at + 1

        root = parents(n, which).index(None)
        got = _ROUNDS[key] = (d, ready(root))
    return got


def rounds(n, rank, count, itemsize=4):
    """{round: [Msg]} of rank's messages (see schedule): segment s of tree t goes
    up from v in round s + D[v] and down from the root in round s + R0, one
    level a round (up_rounds); each message on its tree's lane (ctx
    LANE_TAGS[t])."""
    out = {}
    if n == 1 or count == 0:
        return out
    b = bounds(count, 2)
    seg = seg_elems(itemsize)
    for t in (0, 1):
        if b[t + 1] <= b[t]:
            continue
        parent, children = tree(n, rank, t)
        d, r0 = up_rounds(n, t)
        depth = _tree.level(parents(n, t), rank)
        for s, (lo, hi) in enumerate(segments(b[t], b[t + 1], seg)):
            msgs = [(s + d[c], Msg("combine", c, lo, hi)) for c in children]
            if parent is not None:
                msgs += [(s + d[rank], Msg("send", parent, lo, hi)),
                         (s + r0 + depth - 1, Msg("recv", parent, lo, hi))]
            msgs += [(s + r0 + depth, Msg("send", c, lo, hi)) for c in children]
            for at, m in msgs:
                out.setdefault(at, []).extend(on_context(LANE_TAGS[t], [[m]])[0])
    return out


def schedule(n, rank, count, root=0, itemsize=4):
    """Both trees' messages in rounds, one step per round in which the rank has
    any (rounds): every message is posted by both of its ranks in the same
    round, so a rank that waits for a whole step, its sends included (a
    prepared plan's chain), never waits on a later round of another.  run()
    takes the same steps, its sends not waited for until the end."""
    r = rounds(n, rank, count, itemsize)
    return [r[k] for k in sorted(r)]


def run(call, buf, red):
    """The schedule's rounds in order: post a round's receives and sends, wait for
    its receives (combining each as it lands, or from scratch without a C
    loop), go on; the sends are waited for at the end of the call.  The
    receives are posted in the plan's order, so ranks on the plan (which also
    wait for each round's sends) and ranks here interoperate: every message is
    posted by both of its ranks in the same round."""
    if call.size == 1 or buf.size == 0:
        return
    for step in schedule(call.size, call.rank, buf.size, itemsize=buf.itemsize):
        recvs, combines = [], []
        for m in step:
            part = buf[m.lo:m.hi]
            if m.op == "send":
                call.isend(part, m.peer, m.ctx)
            elif m.op == "recv":
                recvs.append(call.irecv(part, m.peer, tag=m.ctx))
            else:   # one combine a round per (tree, child): its scratch slot
                combines.append(call.irecv_combine(part, m.peer, red, ("dbtree", m.ctx, m.peer),
                                                   tag=m.ctx))
        for cb in combines:
            call.wait_combine(cb)
        call.waitall(recvs)
