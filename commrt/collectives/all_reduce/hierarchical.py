"""Hierarchical all-reduce for multi-host jobs: within hosts over shared memory, across by ring.

Steps (H hosts, L ranks on a host, the lowest rank of each host is its leader):
  1. binomial reduce to the leader inside each host (shared memory), with
     reduce-receives where the reduction has a C loop (see reduce.py);
  2. ring all-reduce among the H leaders (the network);
  3. binomial (small) or pipelined (large) broadcast from the leader
     inside each host.
Each step is an algorithm of its own run on a group of the call's ranks
(call.Members): one call, one context, one fingerprint.  Between two ranks
the steps never send the same way (a host's reduce sends towards its leader,
its broadcast away from it; the ring joins leaders of different hosts), so
their messages cannot match each other's receives.

Cost: 2·ceil(log2 L)·(α_shm + K·β_shm) + ceil(log2 L)·K·γ
      + ring(H, K) with the network's α, β (``params.net()``)
      + 2·max(α, α_busy): twice a rank that waited through a step, long
      enough to sleep, is woken for the next (the leaders for the ring after
      the host reduce, the others for the host broadcast after the leaders'
      ring).
Only the leaders' K·2(H-1)/H bytes cross the network (instead of every
rank's); bytes inside a host are as for reduce_bcast.
"""
import math

from commrt.collectives.call import Members
from commrt.collectives.all_reduce import ring
from commrt.collectives.broadcast import binomial as bcast_binomial
from commrt.collectives.broadcast import pipeline as bcast_pipeline
from commrt.collectives.reduce import binomial as reduce_binomial
from commrt.collectives.registry import relabel
from commrt.comm import Channel

# Test seam: a function (comm, rank) -> host id, replacing comm.host_of (pretend_hosts).
HOST_OF = None


def pretend_hosts(comm, hosts):
    """Test seam: in this process, world rank w is on host hosts[w] in every
    communicator (None: the real hosts again).  comm: unused, so that a test
    world can run it on every rank (World.run)."""
    global HOST_OF
    HOST_OF = None if hosts is None else (lambda c, q: hosts[c.world_rank(q)])


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
    handoffs = 2 * max(p.alpha, p.alpha_busy) if steps else 0.0
    return (2 * steps * (p.nseg(nbytes) * p.alpha + nbytes * p.beta) + steps * nbytes * p.gamma
            + ring.cost(len(groups), nbytes, p.net()) + handoffs)


def broadcast_algo(nbytes):
    """The host broadcast's algorithm for a buffer of nbytes."""
    return "pipeline" if nbytes >= 1 << 20 else "binomial"


def phases(n, rank, count, itemsize=4, groups=None):
    """run's messages in its three steps, (host reduce, leaders' ring, host
    broadcast), with ranks grouped by host as `groups` (host_groups' form;
    default: one host), all on the call's context."""
    groups = [list(range(n))] if groups is None else [list(g) for g in groups]
    mine = next(g for g in groups if rank in g)
    leaders = [g[0] for g in groups]
    local = mine.index(rank)
    host_reduce, leaders_ring, host_bcast = [], [], []
    if len(mine) > 1:
        host_reduce = relabel(reduce_binomial.schedule(len(mine), local, count, 0), mine)
        bcast = (bcast_pipeline.schedule(len(mine), local, count, 0, itemsize)
                 if broadcast_algo(count * itemsize) == "pipeline"
                 else bcast_binomial.schedule(len(mine), local, count, 0))
        host_bcast = relabel(bcast, mine)
    if rank in leaders and len(leaders) > 1:
        leaders_ring = relabel(ring.schedule(len(leaders), leaders.index(rank), count,
                                             itemsize=itemsize), leaders)
    return host_reduce, leaders_ring, host_bcast


def schedule(n, rank, count, root=0, itemsize=4, groups=None):
    """run's messages, its steps one after another (phases)."""
    host_reduce, leaders_ring, host_bcast = phases(n, rank, count, itemsize, groups)
    return host_reduce + leaders_ring + host_bcast


def planned_phases(comm, cache, count, itemsize):
    """What the prepared plan lays out (plans._all_reduce_hierarchical): this
    communicator's phases, and who copies the host broadcast's receives, as
    run's broadcast chooses (the binomial's copier, the pipeline's reads)."""
    nbytes = count * itemsize
    who = (bcast_binomial.copier(comm.channel, cache) if broadcast_algo(nbytes) == "binomial"
           else Channel.RECEIVER)        # the pipeline's receivers read (its run's irecv)
    return phases(comm.size, comm.rank, count, itemsize, host_groups(comm)), who


def _groups(call):
    """(this rank's host group, the leaders), found once per communicator."""
    cached = call.state.cache.get("hierarchical")
    if cached is None:
        groups = host_groups(call.comm)
        mine = next(g for g in groups if call.rank in g)
        cached = call.state.cache["hierarchical"] = (mine, [g[0] for g in groups])
    return cached


def run(call, buf, red):
    if call.size == 1:
        return
    mine, heads = _groups(call)
    if len(mine) > 1:
        reduce_binomial.reduce_to(Members(call, mine), buf, 0, red, acc=buf)
        call.wait_sends()           # buf was sent up: the broadcast may overwrite it
    if call.rank in heads and len(heads) > 1:
        ring.run(Members(call, heads), buf, red)
        call.wait_sends()
    if len(mine) > 1:
        host = Members(call, mine)
        if broadcast_algo(buf.nbytes) == "pipeline":
            bcast_pipeline.run(host, buf, 0)
        else:
            bcast_binomial.run(host, buf, 0)
