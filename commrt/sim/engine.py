"""A discrete-event run of an algorithm's own schedule over a modelled cluster.

The input is what the runtime runs: per rank, a list of steps, each a list
of messages ``(op, peer, lo, hi)`` (op "send", "recv" or "combine": receive
and combine into elements [lo, hi)), every message of a step posted
together, a rank's next step starting once every receive of this one has
completed (collectives/registry.py's Msg).  Between one pair of ranks the
k-th send of a context matches the k-th receive of that context, as on the
wire (a message's context is its ``ctx``: None, a lane of the call -- the
tag of one of dbtree's trees -- or the derived communicator's of
hierarchical's steps).

The model (``Topology``): nodes x ranks per node, ranks placed in blocks
(ranks 0..R-1 on node 0, ...), two link classes with their α and β
(``shm`` inside a node, ``net`` between nodes), one NIC per node shared by
its ranks (a message between nodes holds its sender's NIC egress and its
receiver's NIC ingress for bytes·β_net, first come first served), an
optional bisection limit of the fabric (all traffic between nodes shares
it), γ per combined byte at the receiver, and segment pipelining: a message
between nodes moves in segments of ``segment`` bytes, so its receiver
combines all but the last segment while the rest is still on the wire (on
shared memory the receiver's own core copies, then combines: no overlap,
except where the schedule marks a combine as the sender's copy
(``copier`` "sender", registry.sender_copies: the binomial reduce's, whose
sender's core streams it through the pair's ring while the receiver's
combines, so the receiver's core holds only the combining and the message
ends no sooner than the sender's copy).
A combine of s bytes costs s·γ(s): γ in cache, γ_mem (``gamma_mem``, the
cost model's out-of-cache kernel figure) from 16 MiB, geometric between.

A message between nodes sent at t arrives at t + α + bytes·β (later if its
NIC or the fabric is busy); a receive posted at p completes at max(p,
arrival) + (combine) min(bytes, segment)·γ.  On shared memory the receiver
copies (process_vm_readv, or the chunks of the two-copy path), so a rank is
a resource: each receive's α_shm + bytes·β(bytes) (``beta_at``: β measured
per message size) and its combining (bytes·γ) run on the receiving rank's
thread, one receive after another, from the moment both sides have posted.
With ``cores`` (per node) the CPU is shared too, for more ranks than cores:
that work (and a network receive's combining) also holds one of the node's
cores, in the first gap long enough from when it is ready (work is booked
as messages are matched, often for later than work matched after it:
_Cores), and α_shm becomes ``alpha_oversub`` (a hop of an
8-byte ring pass round the node's ranks on its cores: matching and waking a
descheduled receiver) where it is given.
Events run in time order, so NIC queues serve in the order messages are
sent.  ``MAX_MESSAGES`` bounds a run.

Terms the validation measures point to point (commrt/sim/validate.py), each
off by default: ``alpha_at``, α per message size where ranks outnumber the
cores (fitted, through this engine, to every rank exchanging at once:
calibrate.fit_alpha); ``shared_cores``, ``cores`` that are the machine's,
shared by every node (namespace hosts on one machine); ``beta_net_at``, β_net
per message size; ``net_cpu``, the CPU a network message's copies cost (TCP's:
the sender's and the receiver's, charged to the receiver, from the first byte's
arrival), which holds a core where cores are modelled; ``eager``, the largest
message sent at once: a larger one (a rendezvous) moves only once its receive
is posted, and its sender's call ends only once it has been taken (its
receiver's copy done, or its last byte on the wire); ``call``, each rank's own
work per call before its first step (on a core where they are shared);
``bus_at``, the part of a shared-memory copy's β(s) that takes the node's
memory, one copy at a time (first come, first served; β(s) is then a copy's
alone, and two ranks copying at once, as in an exchange, take longer);
``alpha_wait``, where ranks outnumber cores α is a wait before the copy that
holds no core (the receiver's wait for its turn), not work queued with it;
``oneway_at``, β per size of a message that both ranks' cores move, where
each rank has a core of its own: one sent in its sender's last step, which
only sends (the sender waits for it to be taken, and its core copies half
of a large one, or streams it through the pair's ring while the receiver
copies out: transport/shm.pxi), or a combine the sender copies
(``copier`` "sender"); measured as a ping-pong's one way, where the
exchange's β (``beta_at``) is two copies at once; ``land_at``, per size,
what a shared-memory receive that combines as it lands (a reduce-receive:
the transport combines each ring chunk, or each piece read into a buffer
that stays in cache, instead of copying it) costs per byte beyond the
plain copy, for algorithms whose combines all do (the modules' ``LANDS``),
where otherwise a combine costs the copy and then γ per byte: measured as
the same exchange chain with and without the combine, about nothing up to
1 MiB and 20-75 ps/B beyond (γ_mem 69), here.  ``footprint``,
where a call's buffers overflow the caches (the validation sets it where
the node's ranks' buffers together reach its last-level cache), the bytes
of a rank's: a shared-memory message of that call moves no faster per
byte than β at that size (``Topology.b``).  ``crowd_spin``, where ranks
outnumber cores: a shared-memory message's α grows with the ranks busy when
it is matched, from α_shm with no more than the cores busy to the fitted α
with all busy (``Topology.crowded``); busy: copying, or within crowd_spin of
starting a step (a waiter's spin before it sleeps).  ``gamma_busy``: γ_mem of
a shared-memory combine that starts while another rank of its node combines
(two kernels on one memory); one alone takes γ_mem (``Topology.g``; a combine
booked first does not see one booked after it).  ``link_rate``,
``link_burst``, ``beta_burst``: each node's link, each way, shaped by a
token bucket (tc's tbf, as the namespace hosts' links are): a message
between nodes that finds k tokens ends k / rate sooner than at the measured
(sustained) β_net, no sooner than its bytes at ``beta_burst`` (_Bucket).
With ``calls`` > 1 the run repeats the call, every rank starting the next
once the last has ended, the links' state carried over: a loop of calls
finds the buckets as the call before left them, not full.

The symmetry shortcut (``uniform``; exact, not an approximation): where
every rank provably follows rank 0's timeline, only rank 0 is run.  The
proof is checked on the schedule itself, for every rank and step: (1) every
rank's step k holds the same messages as rank 0's up to the peers (same
ops, same sizes, same order), and (2) every receive of step k is matched by
its peer's send in step k, and every send by a receive there.  The
topology must leave no resource whose queue order could tell ranks apart:
no ``cores``, and either one node or one rank per node with at most one
send and one receive per step (each NIC then carries one message each way
per step), and no bisection limit.  Then by induction on k every rank
starts step k at rank 0's time, its peers' sends leave at that time, and
each NIC's egress and ingress are free at the same time on every node, so
rank 0's own arithmetic (below, the same as the full run's) gives every
rank's.  Power-of-two Rabenseifner and recursive doubling with a count
divisible by the ranks pass; a binomial tree, uneven blocks, or ranks
sharing a NIC do not, and run in full.

Rotation (``steps_of.rotation``, the ring's): a schedule whose rank r is
rank 0's turned by r (every peer p becomes p + r mod N, sizes and ops
unchanged, where the blocks are equal: the count divisible by N).  Checking
(1) and (2) above then needs rank 0's steps only: (1) holds by the rotation,
and (2) holds when each receive of rank 0's step k from p has a send of the
same size to -p mod N in that step and each send to q a receive from -q
(the peer's step k is rank 0's turned by p).  The rotation itself is the
schedule's claim, which tests/sim test for every rank at small N and the run
re-checks against a sample of ranks (the first, the last, the middle, eight
more); the ring at 16,384 ranks has 5·10⁸ messages, too many to list.
"""
import bisect
import heapq
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Optional

MAX_MESSAGES = 5_000_000
_G_SMALL, _G_LARGE = 1 << 20, 16 << 20   # as collectives/cost.py's GAMMA_SMALL, GAMMA_LARGE


@dataclass
class Topology:
    nodes: int
    ranks_per_node: int
    alpha_shm: float
    beta_shm: float
    alpha_net: float
    beta_net: float
    gamma: float
    segment: int = 1 << 20
    bisection: Optional[float] = None   # bytes/s of the fabric between nodes (None: unlimited)
    cores: Optional[int] = None         # per node (None: a core per rank, never shared)
    gamma_mem: Optional[float] = None   # γ of a combine too large for the caches (None: γ)
    beta_at: tuple = ()                 # ((bytes, β_shm), ...) measured per size (): β_shm
    alpha_oversub: Optional[float] = None   # α_shm where a node's ranks outnumber its cores
    alpha_at: tuple = ()                # ((bytes, α), ...) per size where they do (): α_oversub
    shared_cores: bool = False          # ``cores`` are the machine's, shared by every node
    beta_net_at: tuple = ()             # ((bytes, β_net), ...) measured per size (): β_net
    net_cpu: float = 0.0                # s/B of CPU a network message costs (TCP's copies)
    eager: Optional[int] = None         # largest send not held until received (None: all)
    call: float = 0.0                   # s of CPU a call costs each rank before its first step
    alpha_wait: bool = False            # oversubscribed α: a wait, not a core's work
    bus_at: tuple = ()                  # ((bytes, s/B), ...): the part of β(bytes) that a
                                        # node's copies take one at a time (its memory)
    oneway_at: tuple = ()               # ((bytes, β), ...) of a message both ranks' cores
                                        # move (ping-pong's; module docstring)
    land_at: tuple = ()                 # ((bytes, s/B), ...): what a shared-memory receive
                                        # that combines as it lands costs per byte beyond
                                        # the copy, instead of γ (module docstring)
    link_rate: Optional[float] = None   # B/s of each node's shaped link, each way, where a
                                        # token bucket shapes it (tc tbf; None: not shaped)
    link_burst: int = 0                 # bytes the bucket holds (tbf's burst)
    beta_burst: float = 0.0             # s/B of the bytes the bucket lets through at once
    footprint: int = 0                  # bytes of each rank's buffer where the call's overflow
                                        # the caches (0: they fit): its shared-memory messages
                                        # move no faster per byte than one this large (``b``)
    gamma_busy: Optional[float] = None  # γ_mem of a shared-memory combine while another rank
                                        # of its node combines (None: γ_mem for every one)
    crowd_spin: Optional[float] = None  # where ranks outnumber cores, α scaled by the ranks
                                        # busy when a message is matched (``crowded``): a
                                        # rank is busy this long (s) after it starts a
                                        # step (its waiter's spin), and while it copies

    def b(self, nbytes):
        """β of a shared-memory message of nbytes: the measured curve (``beta_at``,
        log-linear between its sizes, its ends beyond them), no less than its
        value at the call's ``footprint``, else β_shm.  The curve comes from
        messages sent again and again from buffers of their size, which a small
        one finds in the caches; a segment of a call whose buffers overflow them
        streams from memory as the call's buffers do."""
        if not self.beta_at:
            return self.beta_shm
        beta = curve(self.beta_at, nbytes)
        return max(beta, curve(self.beta_at, self.footprint)) if self.footprint > nbytes else beta

    def b1(self, nbytes):
        """β of a shared-memory message that its sender's core helps move (module
        docstring): the ping-pong curve ``oneway_at``, else b(nbytes)."""
        return curve(self.oneway_at, nbytes) if self.oneway_at else self.b(nbytes)

    def land(self, nbytes):
        """Per byte of a shared-memory combine beyond its copy: the curve ``land_at``
        (a receive that combines as it lands), else γ(nbytes) (copy, then combine)."""
        return curve(self.land_at, nbytes) if self.land_at else self.g(nbytes)

    def m(self, nbytes):
        """The part of β(nbytes) a node's shared-memory copies serialise on (bus_at)."""
        return curve(self.bus_at, nbytes) if self.bus_at else 0.0

    def bn(self, nbytes):
        """β of a network message of nbytes: the curve ``beta_net_at``, else β_net."""
        return curve(self.beta_net_at, nbytes) if self.beta_net_at else self.beta_net

    @property
    def oversubscribed(self):
        """Whether ranks outnumber the cores they share (a node's, or the machine's)."""
        if not self.cores:
            return False
        sharing = self.ranks if self.shared_cores else self.ranks_per_node
        return sharing > self.cores

    def a(self, nbytes):
        """α of a shared-memory message of nbytes: where ranks outnumber the cores,
        the per-size curve ``alpha_at`` (fitted to all ranks exchanging at once,
        calibrate.fit_alpha), else α_oversub; otherwise α_shm."""
        if self.oversubscribed:
            if self.alpha_at:
                return curve(self.alpha_at, nbytes)
            if self.alpha_oversub:
                return self.alpha_oversub
        return self.alpha_shm

    def crowded(self, nbytes, busy):
        """α of a shared-memory message matched while ``busy`` of the ranks sharing
        its cores are busy (the receiver included): α_shm with no more busy ranks
        than cores, a(nbytes) (fitted to every rank exchanging at once) with all
        busy, linear between: a woken receiver waits for a core only behind the
        ranks that want one (spinning or copying), not behind ranks asleep."""
        a = self.a(nbytes)
        if not self.crowd_spin or not self.oversubscribed:
            return a
        sharing = self.ranks if self.shared_cores else self.ranks_per_node
        f = min(1.0, max(0.0, (busy - self.cores) / (sharing - self.cores)))
        return self.alpha_shm + (a - self.alpha_shm) * f if a > self.alpha_shm else a

    @property
    def a_shm(self):
        """α of a shared-memory message of no size (``a(0)``)."""
        return self.a(0)

    def g(self, nbytes, together=True):
        """γ of a combine of nbytes at once: γ in cache, γ_mem from 16 MiB, geometric
        between (the cost model's Params.g, measured by the same kernels); with
        ``gamma_busy``, γ_mem is that where another rank combines at the same
        time (together) and γ_mem alone otherwise."""
        mem = self.gamma_mem
        if together and self.gamma_busy:
            mem = max(mem or 0.0, self.gamma_busy)
        if not mem or mem <= self.gamma or nbytes <= _G_SMALL:
            return self.gamma
        if nbytes >= _G_LARGE:
            return mem
        f = math.log(nbytes / _G_SMALL) / math.log(_G_LARGE / _G_SMALL)
        return self.gamma * (mem / self.gamma) ** f

    @property
    def ranks(self):
        return self.nodes * self.ranks_per_node

    def node(self, rank):
        return rank // self.ranks_per_node


def curve(pts, nbytes):
    """The value at nbytes of a measured curve ((bytes, value), ...) in ascending
    bytes: log-linear between its sizes, its end values beyond them."""
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
        if nbytes <= k1:
            f = math.log(nbytes / k0) / math.log(k1 / k0)
            return v0 + (v1 - v0) * f
    return pts[-1][1]


class ScheduleError(ValueError):
    """A schedule that cannot run: unmatched messages, a peer out of range."""


def simulate(topo, steps_of, itemsize=4, shortcut=True, calls=1):
    """Seconds until the last rank finishes, for ``steps_of(rank)`` -> that rank's
    steps; message sizes are (hi - lo) elements of ``itemsize`` bytes.  calls:
    that many calls one after another, every rank starting each once the last
    has ended the one before; the last call's time.  The links' state carries
    from one to the next (a shaped link's bucket starts the next call as the
    last left it, as in a loop of calls), so calls=2 gives a call's time in such
    a loop where the first finds every bucket full."""
    return run(topo, steps_of, itemsize, shortcut, calls)[0]


ROTATION_SAMPLE = 8


def run(topo, steps_of, itemsize=4, shortcut=True, calls=1):
    """(seconds of the last of `calls` calls, True where the exact symmetry
    shortcut ran rank 0 alone)."""
    n = topo.ranks
    if calls < 1:
        raise ValueError(f"calls must be at least 1, not {calls}")
    if shortcut and getattr(steps_of, "rotation", False) and _free(topo) and n > 1:
        first = steps_of(0)
        if _rotates(n, first, steps_of) and _matched_by_rotation(n, first, topo.nodes > 1):
            return _repeat(_rank0, topo, first, itemsize, calls), True
    steps, total = [], 0
    for r in range(n):
        steps.append(steps_of(r))
        total += sum(len(m) for m in steps[-1])
        # every rank sends what it receives on average: rank 0's share times N is a
        # fair estimate, so a run far past the bound stops before listing it all
        if total > MAX_MESSAGES or (r == 0 and total * n > 4 * MAX_MESSAGES):
            raise ScheduleError(f"more than {MAX_MESSAGES} messages (the simulator's bound): "
                                "fewer ranks, or an algorithm with fewer steps")
    for r, s in enumerate(steps):
        for msgs in s:
            for m in msgs:
                if not 0 <= m[1] < n:
                    raise ScheduleError(f"rank {r}: peer {m[1]} outside 0..{n - 1}")
    if shortcut and uniform(topo, steps):
        return _repeat(_rank0, topo, steps[0], itemsize, calls), True
    return _repeat(_full, topo, steps, itemsize, calls), False


def _repeat(one, topo, steps, itemsize, calls):
    """The time of the last of `calls` runs of one(topo, steps, itemsize, links,
    t0), each starting when the one before ended, on the links it left."""
    links, t0 = _Links(topo), 0.0
    for _ in range(calls):
        t1 = one(topo, steps, itemsize, links, t0)
        t0, took = t1, t1 - t0
    return took


class _Links:
    """The network's state, which outlives a call: when each node's NIC is free
    each way, the fabric, and each way's token bucket."""
    __slots__ = ("egress", "ingress", "fabric", "out_bucket", "in_bucket")

    def __init__(self, topo):
        self.egress = [0.0] * topo.nodes
        self.ingress = [0.0] * topo.nodes
        self.fabric = [0.0]
        self.out_bucket = [_Bucket(topo) for _ in range(topo.nodes)]
        self.in_bucket = [_Bucket(topo) for _ in range(topo.nodes)]


def _shape(msgs):
    return [(m[0], m[3] - m[2]) for m in msgs]


def _free(topo):
    """No resource whose queue order could tell ranks apart (module docstring)."""
    return not (topo.bisection or topo.cores or (topo.nodes > 1 and topo.ranks_per_node > 1)
                or (topo.bus_at and topo.ranks_per_node > 1))


def _rotates(n, first, steps_of):
    """Whether sampled ranks' steps are rank 0's turned by their rank."""
    import random

    sample = {1, n - 1, n // 2} | set(random.Random(n).sample(range(1, n), min(n - 1,
                                                                            ROTATION_SAMPLE)))
    for r in sorted(sample):
        mine = steps_of(r)
        if len(mine) != len(first):
            return False
        for a, b in zip(mine, first):
            if [(m[0], m[1], m[3] - m[2]) for m in a] != \
                    [(m[0], (m[1] + r) % n, m[3] - m[2]) for m in b]:
                return False
    return True


def _matched_by_rotation(n, first, one_each):
    for msgs in first:
        sends = [(m[1], m[3] - m[2]) for m in msgs if m[0] == "send"]
        recvs = [(m[1], m[3] - m[2]) for m in msgs if m[0] != "send"]
        if one_each and (len(sends) > 1 or len(recvs) > 1):
            return False
        if sorted(((-p) % n, k) for p, k in recvs) != sorted(sends):
            return False
    return True


def uniform(topo, steps):
    """Whether every rank's timeline is provably rank 0's (module docstring)."""
    n = topo.ranks
    if not _free(topo):
        return False
    ref = [_shape(msgs) for msgs in steps[0]]
    if any(len(s) != len(ref) for s in steps):
        return False
    one_each = topo.nodes > 1
    for r in range(n):
        for k, msgs in enumerate(steps[r]):
            if _shape(msgs) != ref[k]:
                return False
            sends = [m for m in msgs if m[0] == "send"]
            recvs = [m for m in msgs if m[0] != "send"]
            if one_each and (len(sends) > 1 or len(recvs) > 1):
                return False
            for op, peer, lo, hi in recvs:   # the peer's send in this very step
                if not any(m[0] == "send" and m[1] == r and m[3] - m[2] == hi - lo
                           for m in steps[peer][k]):
                    return False
            for op, peer, lo, hi in sends:
                if not any(m[0] != "send" and m[1] == r and m[3] - m[2] == hi - lo
                           for m in steps[peer][k]):
                    return False
    return True


COMBINE, STREAMED = 1, 2   # a receive that combines: the receiver copies, or the sender


def _kind(m):
    """0 (a plain receive), COMBINE, or STREAMED (a combine the sender copies:
    registry.sender_copies)."""
    if m[0] != "combine":
        return 0
    return STREAMED if getattr(m, "copier", None) == "sender" else COMBINE


def _rank0(topo, steps, itemsize, links, t0=0.0):
    """Rank 0's timeline where every rank's is the same (``uniform``): the full run's
    arithmetic with every peer in rank 0's state.  On the network a step then
    holds one send and one receive of one size, so every NIC's egress and
    ingress are busy until the same time (``free``), and every bucket holds
    the same (rank 0's egress stands for all)."""
    t, free = t0 + topo.call, links.egress[0]
    bucket = links.out_bucket[0]
    for msgs in steps:
        done = cpu = t    # cpu: when rank 0's core is done with this step's copies
        for m in msgs:
            op, peer, lo, hi = m[:4]
            if op == "send":
                continue
            nbytes = (hi - lo) * itemsize
            if topo.node(0) == topo.node(peer):   # its own core copies, then combines
                work = topo.a(nbytes) + nbytes * topo.b(nbytes)
                if _kind(m) == STREAMED:          # (the sender's core copies meanwhile)
                    work = topo.a(nbytes) + nbytes * max(topo.b(nbytes), topo.g(nbytes))
                elif op == "combine":
                    work += nbytes * topo.land(nbytes)
                cpu += work     # the full run's sum, term for term
                done = max(done, cpu)
                continue
            start = max(t, free)
            wire = bucket.wire(start, nbytes, nbytes * topo.bn(nbytes))
            bucket.take(start, nbytes, wire)
            free = start + wire
            end = start + topo.alpha_net + wire
            if op == "combine":
                part = min(nbytes, topo.segment)
                end += part * topo.g(part)
            done = max(done, end)
        t = done
    links.egress[0] = free
    return t


class _Bucket:
    """A link shaped by a token bucket (``link_rate``, ``link_burst``; tc's tbf):
    the tokens it holds at a message's start let that many bytes through at
    once, at ``beta_burst`` per byte, instead of at the shaped rate.  The
    measured β_net is the sustained figure (a bucket kept empty by messages
    back to back), so a message whose start finds k tokens ends k / rate
    sooner, but no sooner than its bytes at beta_burst, and never later than
    at the measured β.  Without a rate the
    wire time is the measured one, as before."""
    __slots__ = ("rate", "depth", "floor", "level", "at")

    def __init__(self, topo):
        self.rate, self.depth = topo.link_rate, topo.link_burst
        self.floor = topo.beta_burst
        self.level, self.at = float(self.depth), 0.0     # full at the start

    def tokens(self, t):
        if not self.rate:
            return 0.0
        return min(self.depth, self.level + (t - self.at) * self.rate)

    def wire(self, start, nbytes, sustained, tokens=None):
        """Seconds nbytes hold the link from start (sustained: at the measured β)."""
        k = self.tokens(start) if tokens is None else tokens
        if not k:
            return sustained
        # tokens only help: where the unshaped path is the slower (the link's
        # rate not binding, beta_burst above the measured β) the measured β holds
        return min(sustained, max(nbytes * self.floor, sustained - min(k, nbytes) / self.rate))

    def take(self, start, nbytes, wire):
        """nbytes sent from start, holding the link for wire seconds."""
        if self.rate:
            self.level = max(0.0, min(self.depth, self.tokens(start) - nbytes
                                      + wire * self.rate))
            self.at = start + wire


class _Cores:
    """C cores: the busy intervals booked on each.  A piece of work may start on
    any core from its ready time on, in the first gap long enough for it:
    work is booked as messages are matched, often for later than work booked
    after it (a network segment's copies when its data lands, a local copy
    now), and a core booked for later is still free before."""
    __slots__ = ("busy",)

    def __init__(self, count):
        self.busy = [[] for _ in range(count)]     # per core: [(start, end), ...] sorted

    def earliest(self, ready, work):
        """(start, core) of the first gap of `work` seconds from `ready` on."""
        best = None
        for c, booked in enumerate(self.busy):
            start = ready
            for b0, b1 in booked:
                if b1 <= start:
                    continue
                if b0 >= start + work:
                    break
                start = b1
            if best is None or start < best[0]:
                best = (start, c)
        return best

    def book(self, core, start, end):
        bisect.insort(self.busy[core], (start, end))

    def forget(self, before):
        """Drop the intervals that ended before `before` (nothing starts earlier)."""
        for c, booked in enumerate(self.busy):
            i = 0
            while i < len(booked) and booked[i][1] <= before:
                i += 1
            if i:
                del booked[:i]


def _full(topo, steps, itemsize, links, t0=0.0):
    n = topo.ranks
    egress, ingress, fabric = links.egress, links.ingress, links.fabric
    out_bucket, in_bucket = links.out_bucket, links.in_bucket
    # (src, dst, ctx) -> ((arrival, sent at, same node), bytes, src): sent, not yet
    # received (arrival None: a rendezvous message waiting for its receive)
    sent = defaultdict(deque)
    waiting = defaultdict(deque)   # (src, dst, ctx) -> (post time, nbytes, combine) not sent
    left = [0] * n                 # receives of the current step still to complete
    done_at = [t0] * n             # when the current step's receives have completed
    index = [0] * n
    finish = [t0] * n
    pool = _Cores(topo.cores) if topo.cores and topo.shared_cores else None
    free = ([pool if pool is not None else _Cores(topo.cores) for _ in range(topo.nodes)]
            if topo.cores else None)
    events = []
    for r in range(n):      # each rank's own call (its Python) first, on a core where shared
        start = t0
        if free is not None and topo.call:
            cores = free[topo.node(r)]
            start, core = cores.earliest(t0, topo.call)
            cores.book(core, start, start + topo.call)
        events.append((start + topo.call, r))
    heapq.heapify(events)
    mine = [t0] * n                # when each rank (one thread) is done with its copies
    bus = [t0] * topo.nodes        # when each node's memory is free of copies (bus_at)
    eager = topo.eager

    crowd = topo.crowd_spin if topo.crowd_spin and topo.oversubscribed else None
    began = [t0] * n               # when each rank started its current step (crowd)
    over = [False] * n             # past its last step (crowd)

    # each rank's latest shared-memory receive that combines, its work's span (gamma_busy)
    combining = [(t0, t0)] * n

    def node_ranks(dst):
        first = topo.node(dst) * topo.ranks_per_node
        return range(first, first + topo.ranks_per_node)

    def together(dst, at):
        """Whether another rank of dst's node combines at `at` (Topology.g)."""
        if not topo.gamma_busy:
            return True
        return any(combining[r][0] <= at < combining[r][1] for r in node_ranks(dst) if r != dst)

    def busy(dst, now):
        """The ranks sharing dst's cores busy at now (``Topology.crowded``), dst too:
        copying, or in their waiter's spin after starting a step (every rank at
        the call's start)."""
        ranks = range(n) if topo.shared_cores else node_ranks(dst)
        return 1 + sum(1 for r in ranks if r != dst and (
            mine[r] > now or (not over[r] and began[r] <= now < began[r] + crowd)))

    sends_done = [t0] * n         # when each rank's rendezvous sends have been taken
    pending = [0] * n              # its rendezvous sends not yet matched and taken
    ending = [False] * n           # at its end, waiting for them

    def awaited(nbytes):
        """Whether a send of nbytes is a rendezvous: its data moves once the receive
        is posted, and the call ends once it has been taken."""
        return eager is not None and nbytes > eager

    def on_cpu(dst, post, sent_at, arrival, nbytes, combine, local, alone=False, now=None):
        """Completion of a receive whose work runs on its rank's thread (one receive
        at a time) and, where ranks share cores, on one of its node's cores.
        combine: 0, COMBINE (the receiver copies, then combines) or STREAMED."""
        first = min(nbytes, topo.segment)
        alpha = (topo.a if crowd is None or now is None
                 else lambda k: topo.crowded(k, busy(dst, now)))
        streamed = local and combine == STREAMED
        # alone, or streamed (the sender's core copies it, by its copier): β of one
        # message moved by both cores, where each rank has its own (b1)
        beta = topo.b1 if (alone or streamed) and not topo.oversubscribed else topo.b
        if streamed:
            # the sender's core streams it through the pair's ring while the
            # receiver's combines it as it lands: the receiver's work is the
            # combining, done no sooner than the sender's copy (and the combining
            # of its last piece) after both have posted
            ready = max(post, sent_at)
            a = alpha(nbytes)
            both = together(dst, max(ready, mine[dst]))
            work = a + nbytes * topo.g(nbytes, both)
            floor = ready + a + nbytes * beta(nbytes) + first * topo.g(first, both)
            if topo.alpha_wait and topo.oversubscribed:
                ready, work, a = ready + a, work - a, 0.0
        elif local:
            # the receiver copies (process_vm_readv, or the ring's chunks): one
            # message after another on its own thread; sharing cores, the
            # message's α (matching, waking the receiver) queues with the copy
            ready = max(post, sent_at)
            a = alpha(nbytes)
            work, floor = a + nbytes * beta(nbytes), ready + a
            if topo.alpha_wait and topo.oversubscribed:
                # α a wait (the receiver's turn on a core), no core held for it
                ready, work, a = floor, work - a, 0.0
        else:
            # as the data starts to land; TCP's copies (net_cpu: the sender's and the
            # receiver's, charged here) hold a core where ranks share them
            ready = max(post, arrival - (nbytes - first) * topo.bn(nbytes))
            work, floor = nbytes * topo.net_cpu, max(post, arrival)
        if combine and not streamed:
            if local and not topo.land_at:
                both = together(dst, max(ready, mine[dst]))
                g = lambda k: topo.g(k, both)   # noqa: E731
            else:
                g = topo.land if local else topo.g
            work += nbytes * g(nbytes)
            floor += first * g(first)
        if not work or (free is None and not local):   # as the network run always was
            return floor
        start = max(ready, mine[dst])
        cores = free[topo.node(dst)] if free is not None else None
        if cores is not None:
            start, core = cores.earliest(start, work)
        if local and topo.bus_at and not streamed:
            # the copy's share of the node's memory (bus_at): one copy's at a time,
            # the core held (and the copy's other part waiting) meanwhile
            node = topo.node(dst)
            at = max(start + a, bus[node])
            bus[node] = at + nbytes * topo.m(nbytes)
            work += at - (start + a)
        if cores is not None:
            cores.book(core, start, start + work)   # (bus_at's wait may overlap a booking)
        if combine and local and topo.gamma_busy:
            combining[dst] = (start, start + work)
        mine[dst] = start + work
        return max(start + work, floor)

    def finished(r, t, now):
        """One receive, or awaited send, of rank r's step done at t."""
        done_at[r] = max(done_at[r], t)
        left[r] -= 1
        if left[r] == 0:
            heapq.heappush(events, (max(done_at[r], now), r))

    def complete(src, dst, post, msg, nbytes, combine, now):
        arrival, sent_at, local, alone = msg
        t = on_cpu(dst, post, sent_at, arrival, nbytes, combine, local, alone, now)
        if awaited(nbytes):
            # a rendezvous send completes once its data is taken: on shared memory
            # when the receiver's copy ends, on the network when the last byte left;
            # the sender's call waits for it at its end (the general path's
            # wait_sends), not at its next step
            sends_done[src] = max(sends_done[src], t if local else arrival - topo.alpha_net)
            pending[src] -= 1
            if not pending[src] and ending[src]:
                ending[src] = False
                heapq.heappush(events, (max(sends_done[src], now), src))
        finished(dst, t, now)

    def depart(src, dst, nbytes, t):
        if topo.node(src) == topo.node(dst):   # unused: the receiver's copy sets its time
            return t + topo.a(nbytes) + nbytes * topo.b(nbytes)
        a, b = topo.node(src), topo.node(dst)
        start = max(t, egress[a], ingress[b])
        if topo.bisection:
            start = max(start, fabric[0])
            fabric[0] = start + nbytes / topo.bisection
        # the bytes pass the sender's bucket and then the receiver's (its switch port)
        tokens = min(out_bucket[a].tokens(start), in_bucket[b].tokens(start))
        wire = out_bucket[a].wire(start, nbytes, nbytes * topo.bn(nbytes), tokens)
        out_bucket[a].take(start, nbytes, wire)
        in_bucket[b].take(start, nbytes, wire)
        egress[a] = ingress[b] = start + wire
        return start + topo.alpha_net + wire

    def message(src, dst, nbytes, t, post=None, alone=False):
        """(arrival, sent at, same node, alone) of a send at t (alone: its sender's
        core helps move it, on_cpu); a rendezvous message moves only once its
        receive is posted (post; None: not yet: arrival None)."""
        local = topo.node(src) == topo.node(dst)
        if awaited(nbytes) and not local:
            if post is None:
                return None, t, local, alone
            return depart(src, dst, nbytes, max(t, post)), t, local, alone
        return depart(src, dst, nbytes, t), t, local, alone

    pools = {id(c): c for c in free} if free is not None else {}
    popped = 0
    while events:
        t, r = heapq.heappop(events)
        popped += 1
        if pools and not popped % 256:
            # no work is ready before the event being handled: what ended is history
            for c in pools.values():
                c.forget(t)
        if index[r] == len(steps[r]):
            over[r] = True
            if pending[r]:              # a send not yet taken: its completion ends it
                ending[r] = True
                continue
            finish[r] = max(t, sends_done[r])
            continue
        msgs = steps[r][index[r]]
        index[r] += 1
        began[r] = t
        recvs = [m for m in msgs if m[0] != "send"]
        left[r] = started = len(recvs)
        # a message whose sender's step only sends, its last: the sender's core,
        # idle until it is taken, moves it too (on_cpu)
        alone = not started and index[r] == len(steps[r])
        done_at[r] = t
        for m in msgs:
            op, peer, lo, hi = m[:4]
            nbytes = (hi - lo) * itemsize
            if op == "send":
                pending[r] += awaited(nbytes)
                q = waiting[(r, peer, getattr(m, "ctx", None))]
                if q:
                    post, size, combine = q.popleft()
                    if size != nbytes:
                        raise ScheduleError(f"{r} -> {peer}: {nbytes} bytes sent, {size} "
                                            "expected")
                    complete(r, peer, post, message(r, peer, nbytes, t, post, alone),
                             nbytes, combine, t)
                else:
                    sent[(r, peer, getattr(m, "ctx", None))].append(
                        (message(r, peer, nbytes, t, alone=alone), nbytes))
        for m in recvs:
            op, peer, lo, hi = m[:4]
            nbytes = (hi - lo) * itemsize
            q = sent[(peer, r, getattr(m, "ctx", None))]
            if q:
                msg, size = q.popleft()
                if size != nbytes:
                    raise ScheduleError(f"{peer} -> {r}: {size} bytes sent, {nbytes} expected")
                if msg[0] is None:      # a rendezvous message: it moves now
                    msg = message(peer, r, nbytes, msg[1], t, alone=msg[3])
                complete(peer, r, t, msg, nbytes, _kind(m), t)
            else:
                waiting[(peer, r, getattr(m, "ctx", None))].append((t, nbytes, _kind(m)))
        if not started:
            heapq.heappush(events, (t, r))
    stuck = [r for r in range(n) if index[r] < len(steps[r]) or left[r] or pending[r]]
    if stuck:
        raise ScheduleError(f"ranks {stuck[:8]} never finished: a receive with no matching "
                            "send")
    return max(finish)
