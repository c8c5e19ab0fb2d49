"""Hierarchical all-reduce for multi-host jobs: within hosts over shared memory, across by ring.

Steps (H hosts, L ranks on a host, the lowest rank of each host is its leader):
  1. binomial reduce to the leader inside each host (shared memory), with
     reduce-receives where the reduction has a C loop (see reduce.py);
  2. ring all-reduce among the H leaders (the network);
  3. binomial (small) or pipelined (large) broadcast from the leader
     inside each host.
Each step runs on a communicator derived once and cached: the host group
and the leaders' group, each with its own context.

Cost: 2·ceil(log2 L)·(α_shm + K·β_shm) + ceil(log2 L)·K·γ
      + ring(H, K) with the network's α, β (``params.net()``)
      + 2·(c_gen + α_busy): its steps are three calls on the general path
      (the model charges every unplanned algorithm one c_gen), and twice a
      rank that waited through a step, long enough to sleep, is woken for
      the next (the leaders for the ring after the host reduce, the others
      for the host broadcast after the leaders' ring).
Only the leaders' K·2(H-1)/H bytes cross the network (instead of every
rank's); bytes inside a host are as for reduce_bcast.
"""
import contextlib
import math

from commrt.collectives.call import Call
from commrt.errors import CommError, renumbered
from commrt.collectives.all_reduce import ring
from commrt.collectives.broadcast import binomial as bcast_binomial
from commrt.collectives.broadcast import pipeline as bcast_pipeline
from commrt.collectives.reduce import binomial as reduce_binomial
from commrt.collectives.registry import on_context, relabel

# Test seam: a function (comm, rank) -> host id, replacing comm.host_of.
HOST_OF = None


TIE = 7
LINKS = True     # costs its steps inside a host and among the leaders itself


def host_groups(comm):
    """Ranks grouped by host, groups ordered by their lowest rank."""
    host_of = HOST_OF or (lambda c, q: c.host_of(q))
    groups = {}
    for q in range(comm.size):
        groups.setdefault(host_of(comm, q), []).append(q)
    return sorted(groups.values())


def eligible(comm):
    """Only for ranks on several hosts with more than one rank on some host."""
    groups = host_groups(comm)
    return len(groups) > 1 and any(len(g) > 1 for g in groups)


def cost(n, nbytes, p, comm=None, groups=None):
    if n == 1:
        return 0.0
    if groups is None and comm is not None:
        groups = host_groups(comm)
    if not groups:
        return float("inf")
    local = max(len(g) for g in groups)
    steps = math.ceil(math.log2(local)) if local > 1 else 0
    handoffs = 2 * (p.call + max(p.alpha, p.alpha_busy)) if steps else 0.0
    return (2 * steps * (p.nseg(nbytes) * p.alpha + nbytes * p.beta) + steps * nbytes * p.gamma
            + ring.cost(len(groups), nbytes, p.net()) + handoffs)


def broadcast_algo(nbytes):
    """The host broadcast's algorithm for a buffer of nbytes."""
    return "pipeline" if nbytes >= 1 << 20 else "binomial"


def schedule(n, rank, count, root=0, itemsize=4, groups=None):
    """run's messages with ranks grouped by host as `groups` (host_groups' form;
    default: one host): the host reduce and broadcast on the host's context
    (ctx ("host", its leader)), the leaders' ring on theirs (ctx "leaders")."""
    groups = [list(range(n))] if groups is None else [list(g) for g in groups]
    mine = next(g for g in groups if rank in g)
    leaders = [g[0] for g in groups]
    host, local = ("host", mine[0]), mine.index(rank)
    steps = []
    if len(mine) > 1:
        steps += relabel(on_context(host, reduce_binomial.schedule(len(mine), local, count, 0)),
                         mine)
    if rank in leaders and len(leaders) > 1:
        ring_steps = ring.schedule(len(leaders), leaders.index(rank), count, itemsize=itemsize)
        steps += relabel(on_context("leaders", ring_steps), leaders)
    if len(mine) > 1:
        bcast = (bcast_pipeline.schedule(len(mine), local, count, 0, itemsize)
                 if broadcast_algo(count * itemsize) == "pipeline"
                 else bcast_binomial.schedule(len(mine), local, count, 0))
        steps += relabel(on_context(host, bcast), mine)
    return steps


def communicators(call):
    """(host communicator, its members, leaders' communicator or None, its members),
    derived once per communicator; members are the call's ranks of each one's ranks."""
    comm = call.comm
    cached = call.state.cache.get("hierarchical")
    if cached is None:
        groups = host_groups(comm)
        mine = next(g for g in groups if comm.rank in g)
        heads = [g[0] for g in groups]
        local = comm.channel.derive(mine, ("hierarchical-host", mine[0]))
        leaders = comm.channel.derive(heads, ("hierarchical-leaders",))
        cached = call.state.cache["hierarchical"] = (local, mine, leaders, heads)
    return cached


def run(call, buf, red):
    if call.size == 1:
        return
    local, mine, leaders, heads = communicators(call)
    kw = dict(count=call.count, dtype=call.dtype, op=call.op, timeout=call.timeout, outer=call)
    if local.size > 1:
        with _in_parent_ranks(mine):
            sub = Call(local, "reduce", algo="binomial", label=f"{call.name} (its host reduce)",
                       **kw)
            sub.start()
            reduce_binomial.reduce_to(sub, buf, 0, red, acc=buf)
            sub.end()
    if leaders is not None and leaders.size > 1:
        with _in_parent_ranks(heads):
            sub = Call(leaders, "all_reduce", algo="ring",
                       label=f"{call.name} (its leaders' ring)", **kw)
            sub.start()
            ring.run(sub, buf, red)
            sub.end()
    if local.size > 1:
        algo = broadcast_algo(buf.nbytes)
        with _in_parent_ranks(mine):
            sub = Call(local, "broadcast", algo=algo, label=f"{call.name} (its host broadcast)",
                       **kw)
            sub.start()
            (bcast_pipeline if algo == "pipeline" else bcast_binomial).run(sub, buf, 0)
            sub.end()


@contextlib.contextmanager
def _in_parent_ranks(members):
    """A step on a derived communicator whose rank i is the call's rank members[i]:
    its errors name the call's ranks (a lost leader is the user's rank 3, not the
    leaders' rank 1), so the culprit this rank reports and aborts with is right."""
    try:
        yield
    except CommError as exc:
        new = renumbered(exc, members)
        if new is exc:
            raise
        raise new from exc
