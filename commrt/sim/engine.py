"""A discrete-event run of an algorithm's own schedule over a modelled cluster.

The input is what the runtime runs: per rank, a list of steps, each a list
of messages ``(op, peer, lo, hi)`` (op "send", "recv" or "combine": receive
and combine into elements [lo, hi)), every message of a step posted
together, a rank's next step starting once every receive of this one has
completed (collectives/registry.py's Msg).  Between one pair of ranks the
k-th send matches the k-th receive, as on the wire.

The model (``Topology``): nodes x ranks per node, ranks placed in blocks
(ranks 0..R-1 on node 0, ...), two link classes with their α and β
(``shm`` inside a node, ``net`` between nodes), one NIC per node shared by
its ranks (a message between nodes holds its sender's NIC egress and its
receiver's NIC ingress for bytes·β_net, first come first served), an
optional bisection limit of the fabric (all traffic between nodes shares
it), γ per combined byte at the receiver, and segment pipelining: a message
between nodes moves in segments of ``segment`` bytes, so its receiver
combines all but the last segment while the rest is still on the wire (on
shared memory the receiver's own core copies, then combines: no overlap).

A message sent at t by a rank arrives at t + α + bytes·β (later if its NIC
or the fabric is busy); a receive posted at p completes at max(p, arrival)
+ (combine) min(bytes, segment)·γ, or bytes·γ on shared memory.  With ``cores`` (per node) the CPU is a
resource too, for more ranks than cores: a receive's work, its copy on
shared memory (bytes·β_shm, the receiver copies) and its combining
(bytes·γ), runs on the node's earliest free core once the message can
start (both sides posted; on the network its first segment in), and the
receive completes when that work and the message's arrival are done.
Events run in time order, so NIC queues serve in the order messages are
sent.  Every rank is simulated;
there is no symmetry shortcut yet (``MAX_MESSAGES`` bounds a run).
"""
import heapq
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Optional

MAX_MESSAGES = 5_000_000


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

    @property
    def ranks(self):
        return self.nodes * self.ranks_per_node

    def node(self, rank):
        return rank // self.ranks_per_node


class ScheduleError(ValueError):
    """A schedule that cannot run: unmatched messages, a peer out of range."""


def simulate(topo, steps_of, itemsize=4):
    """Seconds until the last rank finishes, for ``steps_of(rank)`` -> that rank's
    steps; message sizes are (hi - lo) elements of ``itemsize`` bytes."""
    n = topo.ranks
    steps = [steps_of(r) for r in range(n)]
    total = sum(len(m) for s in steps for m in s)
    if total > MAX_MESSAGES:
        raise ScheduleError(f"{total} messages exceed the simulator's {MAX_MESSAGES}: fewer "
                            f"ranks, or an algorithm with fewer steps")
    egress = [0.0] * topo.nodes
    ingress = [0.0] * topo.nodes
    fabric = [0.0]
    sent = defaultdict(deque)      # (src, dst) -> ((arrival, sent at, same node), bytes)
    waiting = defaultdict(deque)   # (src, dst) -> (post time, nbytes, combine) not yet sent
    left = [0] * n                 # receives of the current step still to complete
    done_at = [0.0] * n            # when the current step's receives have completed
    index = [0] * n
    finish = [0.0] * n
    events = [(0.0, r) for r in range(n)]
    heapq.heapify(events)
    free = [[0.0] * topo.cores for _ in range(topo.nodes)] if topo.cores else None

    def on_cpu(dst, post, sent_at, arrival, nbytes, combine, local):
        """Completion of a receive whose work needs one of its node's cores."""
        first = min(nbytes, topo.segment)
        if local:
            ready = max(post, sent_at) + topo.alpha_shm
            work, floor = nbytes * topo.beta_shm, ready
        else:
            ready = max(post, arrival - (nbytes - first) * topo.beta_net)
            work, floor = 0.0, max(post, arrival)
        if combine:
            work += nbytes * topo.gamma
            floor += first * topo.gamma
        cores = free[topo.node(dst)]
        start = max(ready, heapq.heappop(cores))
        heapq.heappush(cores, start + work)
        return max(start + work, floor)

    def complete(dst, post, msg, nbytes, combine, now):
        arrival, sent_at, local = msg
        if free is not None:
            t = on_cpu(dst, post, sent_at, arrival, nbytes, combine, local)
        else:
            t = max(post, arrival)
            if combine:  # shared memory: the receiver's core copies, then combines
                t += (nbytes if local else min(nbytes, topo.segment)) * topo.gamma
        done_at[dst] = max(done_at[dst], t)
        left[dst] -= 1
        if left[dst] == 0:
            heapq.heappush(events, (max(done_at[dst], now), dst))

    def depart(src, dst, nbytes, t):
        if topo.node(src) == topo.node(dst):
            return t + topo.alpha_shm + nbytes * topo.beta_shm
        a, b = topo.node(src), topo.node(dst)
        wire = nbytes * topo.beta_net
        start = max(t, egress[a], ingress[b])
        if topo.bisection:
            start = max(start, fabric[0])
            fabric[0] = start + nbytes / topo.bisection
        egress[a] = ingress[b] = start + wire
        return start + topo.alpha_net + wire

    while events:
        t, r = heapq.heappop(events)
        if index[r] == len(steps[r]):
            finish[r] = t
            continue
        msgs = steps[r][index[r]]
        index[r] += 1
        recvs = [m for m in msgs if m[0] != "send"]
        left[r] = len(recvs)
        done_at[r] = t
        for op, peer, lo, hi in msgs:
            if not 0 <= peer < n:
                raise ScheduleError(f"rank {r}: peer {peer} outside 0..{n - 1}")
            nbytes = (hi - lo) * itemsize
            if op == "send":
                msg = (depart(r, peer, nbytes, t), t, topo.node(r) == topo.node(peer))
                q = waiting[(r, peer)]
                if q:
                    post, size, combine = q.popleft()
                    if size != nbytes:
                        raise ScheduleError(f"{r} -> {peer}: {nbytes} bytes sent, {size} "
                                            "expected")
                    complete(peer, post, msg, nbytes, combine, t)
                else:
                    sent[(r, peer)].append((msg, nbytes))
        for op, peer, lo, hi in recvs:
            nbytes = (hi - lo) * itemsize
            q = sent[(peer, r)]
            if q:
                msg, size = q.popleft()
                if size != nbytes:
                    raise ScheduleError(f"{peer} -> {r}: {size} bytes sent, {nbytes} expected")
                complete(r, t, msg, nbytes, op == "combine", t)
            else:
                waiting[(peer, r)].append((t, nbytes, op == "combine"))
        if not recvs:
            heapq.heappush(events, (t, r))
    stuck = [r for r in range(n) if index[r] < len(steps[r]) or left[r]]
    if stuck:
        raise ScheduleError(f"ranks {stuck[:8]} never finished: a receive with no matching "
                            "send")
    return max(finish)
