"""Every algorithm's schedule IS what the runtime sends: each algorithm runs for
real (shared memory, N = 2..6, several segments per chunk), every message it
posts through its Call is recorded (trace_ranks.py), and per rank, peer,
direction and context the recorded messages must be the schedule's, in order:
same peer, same size, same op (a receive combined as it lands is a schedule
"combine"; a plain receive is a "recv", or a "combine" whose combining
happens after it lands), and the same place in the user's buffer wherever the
runtime reads or writes one (scratch: partial results, receive slots, has no
place to check).  So neither the plans nor the simulator can run a schedule
that has drifted from the code."""
import collections
import itertools

import pytest

import trace_ranks as T
from commrt.collectives import registry
from commrt.collectives.all_reduce import hierarchical
from commrt.testing import World

# 1 KiB segments: 256 float32, so a few thousand elements make several segments
# per ring chunk and many per tree pass
ENV = {"COMMRT_RING_SEGMENT_BYTES": "1024", "COMMRT_COLL_PROBE_S": "0.5",
       "COMMRT_COST_CACHE": ""}
COUNT = 3001
ROOTED = ("broadcast", "reduce", "gather", "scatter", "gatherv", "scatterv")


def _cases():
    for coll in registry.collectives():
        for algo in registry.names(coll):
            yield coll, algo


def _sequences(items):
    """{(peer, direction): [one sequence per context]} from (direction, op, peer,
    ctx, lo, size) items in posting order."""
    per = collections.defaultdict(lambda: collections.defaultdict(list))
    for direction, op, peer, ctx, lo, size in items:
        per[(peer, direction)][ctx].append((op, lo, size))
    return {k: list(v.values()) for k, v in per.items()}


def _same(rec, sched):
    if len(rec) != len(sched):
        return False
    for (rop, rlo, rsize), (sop, slo, ssize) in zip(rec, sched):
        if rsize != ssize:
            return False
        if rop == "send" or sop == "send":
            if rop != sop:
                return False
        elif rop == "combine" and sop != "combine":
            return False
        if rlo is not None and rsize and rlo != slo:
            return False
    return True


def check(coll, algo, n, rank, log, steps):
    rec = _sequences(log)
    sched = _sequences((("send" if op == "send" else "recv"), op, peer, ctx, lo, hi - lo)
                       for step in steps for op, peer, lo, hi, ctx in step)
    where = f"{coll}/{algo} N={n} rank {rank}"
    assert set(rec) == set(sched), (where, "peers and directions", sorted(rec), sorted(sched))
    for key, seqs in rec.items():
        want = sched[key]
        assert len(seqs) == len(want), (where, key, "contexts", len(seqs), len(want))
        assert any(all(_same(a, b) for a, b in zip(seqs, perm))
                   for perm in itertools.permutations(want)), \
            (where, key, "recorded", seqs, "schedule", want)


@pytest.fixture(scope="module", params=[2, 3, 4, 5, 6], ids=lambda n: f"shm{n}")
def world(request):
    with World(request.param, transport="shm", env=ENV, timeout=120) as w:
        yield w


@pytest.mark.timeout(600)
def test_every_schedule_is_what_the_runtime_sends(world):
    n = world.size
    checked = 0
    for coll, algo in _cases():
        root = 1 if coll in ROOTED else 0
        for count in (COUNT, 5):
            out = world.run(T.trace, coll, algo, count, root, 3)
            for rank, (log, steps) in enumerate(out):
                check(coll, algo, n, rank, log, steps)
                checked += len(log)
    assert checked > 0


@pytest.mark.timeout(600)
def test_hierarchical_over_hosts_is_its_schedule():
    """Two ranks to a host (hierarchical's host seam), so the host reduce, the
    leaders' ring and the host broadcast all run; at 1 MiB the host broadcast
    is the pipelined one."""
    with World(5, transport="shm", env=ENV, timeout=120) as w:
        w.run(hierarchical.pretend_hosts, [0, 0, 1, 1, 2])
        for count in (COUNT, (1 << 18) + 3):
            out = w.run(T.trace, "all_reduce", "hierarchical", count)
            for rank, (log, steps) in enumerate(out):
                check("all_reduce", "hierarchical", 5, rank, log, steps)
