"""The prepared plans of every collective (collectives/plans.py; the
all-reduce's on worlds that are not a power of two, _small.py's on the
others, which test_small_allreduce.py holds too): the same
results, traffic and failures as the general path that runs the same schedule.

A call with timeout= keeps to the general path, so each test compares the
two on the same world."""
import json

import pytest

import plan_ranks as P
from commrt.collectives import plans
from commrt.collectives.all_reduce import hierarchical
from commrt.testing import World, WorldError

# the all-reduce's plans are recursive doubling's (whatever the cost model would
# pick on a loaded host)
# Probes (and a plan's hand-over to the general path) after 0.3 s; a late rank comes
# LATE_S after the others, past that interval with room for a loaded host.
PROBE_S, LATE_S = 0.3, 0.45
ENV = {"COMMRT_COLL_PROBE_S": str(PROBE_S), "COMMRT_ALLREDUCE_ALGO": "recursive_doubling"}


@pytest.fixture(scope="module", params=[(2, "shm"), (3, "shm"), (4, "shm"), (5, "shm"),
                                        (3, "tcp")], ids=lambda p: f"{p[1]}{p[0]}")
def world(request):
    n, transport = request.param
    with World(n, transport=transport, env=ENV, timeout=120) as w:
        yield w


CASES = [("float32", "SUM"), ("float64", "MAX"), ("int32", "AVG"), ("uint8", "BXOR")]


@pytest.mark.parametrize("kind", P.KINDS)
@pytest.mark.parametrize("n", [0, 1, 7, 3000])
def test_planned_equals_general(world, kind, n):
    for dtype, op in (CASES if kind in ("reduce", "reduce_scatter", "all_reduce")
                      else CASES[:2]):
        for root in ((0, world.size - 1) if kind in ("broadcast", "reduce", "gather", "scatter")
                     else (0,)):
            res = world.run(P.same_results, kind, n, dtype, op, root)
            for r, (planned, general, has_plan) in enumerate(res):
                assert planned == general, (kind, n, dtype, op, root, r)
                assert has_plan, (kind, n, dtype, op, root, r)


@pytest.mark.parametrize("kind", P.KINDS)
def test_planned_sends_the_general_paths_messages(world, kind):
    for n in (5, 5000):
        res = world.run(P.traffic, kind, n, world.size - 1)
        # (a reduce-scatter's blocks too large to go eagerly, beyond N = 2, take the
        # pairwise algorithm, planned at any size, where the direct one's plan is not)
        for r, ((planned, general), has_plan) in enumerate(res):
            assert has_plan, (kind, n, r)
            assert planned == general, (kind, n, r, planned, general)
            assert any(v[0] or v[1] for v in planned.values()), (kind, n, r, planned)


@pytest.mark.parametrize("env", [{}, {"COMMRT_CMA": "0"}], ids=["single-copy", "two-copy"])
def test_large_blocks_on_both_copy_paths(env):
    """A gather's root has its senders write their blocks; a scatter's,
    all-to-all's and direct all-gather's receivers read theirs (Channel.irecv's
    copier: 3 ranks share 2 cores here, where a receiver reads at any size),
    on the plan and the general path; without process_vm_readv/writev
    (COMMRT_CMA=0) all stream through the ring as before.  Every output is
    checked against NumPy."""
    with World(3, transport="shm", env={**ENV, **env}, timeout=120) as w:
        for kind in ("gather", "scatter", "all_to_all", "all_gather"):   # 1.2 MB blocks
            for root in (0, 2):
                res = w.run(P.same_results, kind, 300_000, "float32", "SUM", root)
                for r, (planned, general, has_plan) in enumerate(res):
                    assert planned == general and has_plan, (kind, root, r)


@pytest.mark.parametrize("env", [{}, {"COMMRT_CMA": "0"}], ids=["single-copy", "two-copy"])
def test_scatter_root_writes_the_blocks_where_ranks_crowd_the_cores(env):
    """Where a host's ranks outnumber its cores (4 ranks on this 2-core host) a
    scatter's root writes each block below the transport's single-copy
    threshold into its receiver's buffer (copier SENDER: the receiver takes an
    RTS and a FIN and sends a CTS, nothing streams); from the threshold up, and
    where each rank has a core, the receiver reads it (RECEIVER).  The plan and
    the general path alike; without process_vm_readv/writev (COMMRT_CMA=0)
    every block streams through the ring whatever the copier.  Seen from the
    root, per receiver: the block written (its stats' pushes), or not, and
    streamed (an RTS and a DATA frame per 64 KiB chunk) or not.  Every output
    is checked against NumPy, from two roots."""
    from commrt.collectives.cost import _cores
    from commrt.comm import Channel

    crowded = 4 > _cores()
    hdr = 64
    with World(4, transport="shm", env={**ENV, **env}, timeout=120) as w:
        for n in (1 << 16, 300_000):                    # 256 KiB and 1.2 MB blocks
            for root in (0, 3):
                res = w.run(P.scatter_copies, n, root)
                for r, (_, has_plan, copier, cma_min) in enumerate(res):
                    writes = crowded and 4 * n < cma_min
                    assert has_plan and copier == (Channel.SENDER if writes
                                                   else Channel.RECEIVER), (n, r, copier)
                for seen in res[root][0]:               # the plan's call, the general one's
                    for q, (pushes, sent) in seen.items():
                        streamed = sent >= (1 + min(4, 4 * n // (64 << 10))) * hdr
                        if env:
                            assert pushes == 0 and streamed, (n, root, q, seen)
                        else:
                            assert pushes == int(writes) and not streamed, (n, root, q, seen)


@pytest.mark.parametrize("kind", ["all_gather", "all_to_all"])
def test_exchanges_write_their_blocks_where_ranks_crowd_the_cores(kind):
    """The direct all-gather's and the all-to-all's senders write each block below
    the single-copy threshold into its receiver's buffer where a host's ranks
    outnumber its cores (4 ranks on this 2-core host: stats' pushes, one per
    peer), and their receivers read it (copier EXCHANGE) from the threshold up
    and where each rank has a core; the plan and the general path alike, every
    output checked against NumPy."""
    from commrt.collectives.cost import _cores
    from commrt.comm import Channel

    crowded = 4 > _cores()
    with World(4, transport="shm", env=ENV, timeout=120) as w:
        for n in (1 << 16, 300_000):                    # 256 KiB and 1.2 MB blocks
            res = w.run(P.exchange_pushes, kind, n)
            for r, (seen, has_plan, copier) in enumerate(res):
                writes = crowded and 4 * n < (1 << 20)
                assert has_plan and copier == (Channel.SENDER if writes
                                               else Channel.EXCHANGE), (kind, n, r, copier)
                for pushes in seen:                     # the plan's call, the general one's
                    assert all(v == int(writes) for v in pushes.values()), (kind, n, r, seen)


def test_the_compiled_entry_serves_the_variable_size_collectives():
    """A planned all_gatherv, gatherv, scatterv or all_to_allv is one C call, as the
    fixed-size kinds' are (collectives/_entry.pyx): its counts compared with the
    last call's, as a list, a tuple or a new list each call, never through the
    Python plan lookup (plans.run) on a clean run; NumPy int counts take the
    Python path (and its plan); other counts get a plan of their own (after one
    general call, the only one of their 20 that does not run a plan from C)."""
    with World(3, transport="shm", env=ENV, timeout=60) as w:
        for r, seen in enumerate(w.run(P.v_compiled_entry)):
            for kind, per in seen.items():
                assert per["list"] == per["tuple"] == per["new list"] == 0, (r, kind, per)
                # (a gatherv's or scatterv's other ranks pass no counts)
                given = r == 0 or kind in ("all_gatherv", "all_to_allv")
                assert per["numpy"] == (20 if given else 0), (r, kind, per)
                assert per["other counts"] == 0, (r, kind, per)


def _v_block_bytes(kind, n, src, dst):
    """Bytes of the block rank src sends rank dst in plan_ranks._vcall's calls."""
    if kind == "scatterv":
        return 4 * (n + dst)
    if kind == "all_to_allv":
        return 4 * (n + (src + 2 * dst) % 3)
    return 4 * (n + src)


def _sibling_copier(kind, algo, nbytes, crowded, cma_min):
    """The copier the fixed-size sibling of kind/algo gives a receive of nbytes."""
    from commrt.comm import Channel

    written = crowded and nbytes < cma_min
    if kind == "gatherv":
        return Channel.SENDER
    if kind == "scatterv":
        return Channel.SENDER if written else Channel.RECEIVER
    if algo == "ring":
        return Channel.EXCHANGE
    return Channel.SENDER if written else Channel.EXCHANGE


@pytest.mark.parametrize("kind, algo, straddling", [("all_gatherv", "direct", 131071),
                                                    ("all_gatherv", "ring", 131071),
                                                    ("all_to_allv", "pairwise", 131070)])
def test_unequal_exchange_halves_across_the_read_threshold_both_stream(kind, algo, straddling):
    """N = 2: the two blocks of each exchange, 512 KiB - 4 B and 512 KiB, sit on
    either side of the size from which an exchange's half is read (a quarter of
    the single-copy threshold, with a core per rank).  Both halves stream then
    (copier 0, the transport's choice: cost.exchange_half), on the plan and the
    general path, rather than one read while the other streams; blocks of about
    1 MiB, both past it, are both read as before.  Outputs checked against
    NumPy (P._vcall's blocks: n + q elements, all_to_allv's n + (s + 2d) % 3)."""
    from commrt.collectives.cost import _cores
    from commrt.comm import Channel

    crowded = 2 > _cores()
    with World(2, transport="shm", env=ENV, timeout=120) as w:
        for n, straddles in ((straddling, True), (262144, False)):
            res = w.run(P.v_copies, kind, algo, n, 0)
            cma_min = res[0][3]
            sizes = sorted(_v_block_bytes(kind, n, src, 1 - src) for src in (0, 1))
            assert (sizes[0] < cma_min // 4 <= sizes[1]) == straddles, (sizes, cma_min)
            for dst, (_, has_plan, copiers, _) in enumerate(res):
                want = 0 if straddles and not crowded else Channel.EXCHANGE
                assert has_plan and copiers == {1 - dst: want}, (n, dst, copiers)
            for src, (seen, _, _, _) in enumerate(res):
                for per_call in seen:           # the plan's call, the general one's
                    pushes, hdr, msgs = per_call[1 - src]
                    streamed = hdr >= msgs * 5 * 64      # a header per 64 KiB chunk
                    assert pushes == 0 and streamed == (straddles and not crowded), \
                        (n, src, per_call)


V_ALGOS = [("scatterv", "linear"), ("gatherv", "linear"), ("all_gatherv", "direct"),
           ("all_gatherv", "ring"), ("all_to_allv", "pairwise")]


@pytest.mark.parametrize("env", [{}, {"COMMRT_CMA": "0"}], ids=["single-copy", "two-copy"])
def test_variable_size_collectives_copy_as_their_fixed_size_siblings(env):
    """Each block of a variable-size collective moves as the same block of its
    fixed-size sibling would, by its own size: a scatterv's root, a direct
    all_gatherv's and an all_to_allv's senders write it below the single-copy
    threshold where a host's ranks outnumber its cores (4 ranks on this 2-core
    host), else its receiver reads it; a gatherv's senders always write theirs;
    a ring all_gatherv's receivers read (copier EXCHANGE).  Seen in the plan's
    receives and, on the plan and the general path alike, from each sender:
    the messages written into the peer's buffer (stats' pushes), and whether
    they streamed through the ring (a header per 64 KiB chunk) or not.  Without
    process_vm_readv/writev (COMMRT_CMA=0) every block streams.  Every output is
    checked against NumPy."""
    from commrt.collectives.cost import _cores
    from commrt.comm import Channel

    crowded = 4 > _cores()
    with World(4, transport="shm", env={**ENV, **env}, timeout=120) as w:
        for (kind, algo), n in [(ka, n) for ka in V_ALGOS
                                for n in (1 << 16, 300_000)]:   # 256 KiB, 1.2 MB blocks
            res = w.run(P.v_copies, kind, algo, n, 0)
            cma_min = res[0][3]
            for dst, (_, has_plan, copiers, _) in enumerate(res):
                assert has_plan, (kind, algo, n, dst)
                for src, got in copiers.items():
                    want = _sibling_copier(kind, algo, _v_block_bytes(kind, n, src, dst),
                                           crowded, cma_min)
                    assert got == want, (kind, algo, n, src, dst, got, want)
            for src, (seen, _, _, _) in enumerate(res):
                for q, per_call in [(q, [s[q] for s in seen]) for q in range(4) if q != src]:
                    for pushes, hdr, msgs in per_call:   # the plan's call, the general one's
                        if not msgs:
                            continue
                        who = res[q][2][src]
                        nbytes = _v_block_bytes(kind, n, src, q)
                        streamed = hdr >= msgs * 5 * 64
                        reads = crowded or nbytes >= cma_min // 4
                        if env:
                            assert pushes == 0 and streamed, (kind, n, src, q, seen)
                        elif who == Channel.SENDER:
                            assert pushes == msgs and not streamed, (kind, n, src, q, seen)
                        else:
                            assert pushes == 0, (kind, n, src, q, seen)
                            assert streamed == (who == Channel.EXCHANGE and not reads), \
                                (kind, n, src, q, who, seen)


@pytest.mark.parametrize("env", [{}, {"COMMRT_CMA": "0"}], ids=["single-copy", "two-copy"])
def test_binomial_broadcast_reads_where_ranks_crowd_the_cores(env):
    """The binomial broadcast's receivers read their parent's buffer (copier
    RECEIVER) where the host has 3 ranks or more per core (8 ranks on this
    2-core host), else the message streams through the pair's ring; the plan
    and the general path alike.  A read costs the receiver its RTS (and a
    credit frame at most), a stream a DATA header per 64 KiB chunk; without
    process_vm_readv (COMMRT_CMA=0) every message streams whatever the
    copier.  Results are checked against NumPy on every rank."""
    from commrt.collectives.broadcast import binomial
    from commrt.collectives.cost import _cores
    from commrt.comm import Channel

    n = 1 << 16                         # 256 KiB: below COMMRT_CMA_MIN_BYTES, 4 chunks
    reads = 8 >= binomial.READ_RANKS_PER_CORE * _cores()
    with World(8, transport="shm", env={**ENV, **env}, timeout=120) as w:
        for root in (0, 5):
            for r, ((plan_hdr, general_hdr), has_plan, copier) in enumerate(
                    w.run(P.binomial_reads, n, root)):
                assert has_plan and copier == (Channel.RECEIVER if reads else 0), (r, copier)
                if r == root:
                    continue
                if reads and not env:
                    assert plan_hdr <= 2 * 64 and general_hdr <= 2 * 64, (root, r, plan_hdr,
                                                                          general_hdr)
                else:
                    assert plan_hdr >= 4 * 64 and general_hdr >= 4 * 64, (root, r, plan_hdr,
                                                                          general_hdr)


def test_a_plan_that_cannot_be_built_leaves_its_rank_on_the_general_path():
    """A layout that raises on one rank (a bug in it) must not fail that rank's
    call while the others, on their plans, wait for it: that rank warns once
    (once per call shape) and runs the general path, which sends the plans'
    messages, so every rank's results are right and alike."""
    with World(3, transport="shm", env=ENV, timeout=60) as w:
        res = w.run(P.broken_layout, 5000, 1)
    digests = [r[0] for r in res]
    assert digests[0] == digests[1] == digests[2], digests
    for rank, (_, has_plan, caught) in enumerate(res):
        if rank == 1:
            assert not has_plan, caught
            # once per call shape (the plan's key holds the root: roots 0, 1, 2, 0)
            assert len(caught) == 3 and all("ValueError: a layout bug" in c for c in caught), \
                caught
        else:
            assert has_plan and not caught, (rank, caught)


@pytest.mark.parametrize("kind,algo", sorted(plans.LAYOUTS), ids=lambda v: v)
def test_every_layout_is_planned_where_it_applies(kind, algo):
    """Each algorithm that has a layout, forced (COMMRT_<KIND>_ALGO), gives the
    general path's results on its plan, at a size where plans.applies says it
    runs on one (taken) and, for the layouts with a limit, above it (not taken)."""
    env = {**ENV, f"COMMRT_{kind.upper()}_ALGO": algo}
    per_block = kind in P.PER_BLOCK
    with World(4, transport="shm", env=env, timeout=120) as w:
        for n in (7, 3000, 70_000):
            nbytes = 4 * n * (w.size if per_block else 1)
            want = plans.applies(kind, algo, w.size, nbytes)
            for r, ((planned, general, has_plan), algos) in enumerate(
                    w.run(P.layout_results, kind, n, 3)):
                assert planned == general, (kind, algo, n, r)
                assert has_plan == want, (kind, algo, n, r, has_plan)
                assert set(algos) <= {algo}, (kind, algo, n, r, algos)


# (N = 2, 3 and 5 on its plan in the all-reduce plans' matrix below too, N = 5 and shared
# memory here long, COMMRT_LONG_TESTS; its rounds at N = 2-9)
@pytest.mark.parametrize("n,transport", [pytest.param(5, "shm", marks=pytest.mark.long), (4, "tcp")])
def test_dbtree_runs_on_its_plan_over_many_segments(n, transport):
    """dbtree's plan (both trees' messages in rounds, each tree on its lane, every
    send waited for within its round) over 2-4 segments a tree, half sizes
    unequal: the general path's results bit for bit and its traffic; and with
    one or two ranks on the general path (sends not waited for) beside ranks
    on the plan, every rank's result right and alike (the two paths send the
    same messages in the same order per pair and lane)."""
    env = {**ENV, "COMMRT_ALL_REDUCE_ALGO": "dbtree"}
    with World(n, transport=transport, env=env, timeout=120) as w:
        for count in (300_001, 1 << 19):
            for r, ((planned, general, has_plan), algos) in enumerate(
                    w.run(P.layout_results, "all_reduce", count, 0)):
                assert planned == general and has_plan and algos == ["dbtree"], (count, r)
            for r, ((planned, general), has_plan) in enumerate(
                    w.run(P.traffic, "all_reduce", count)):
                assert has_plan and planned == general, (count, r, planned, general)
        for count, general_ranks in ((300_003, [1]), (300_005, [0, n - 1])):  # (no plan yet)
            res = w.run(P.dbtree_mixed, count, general_ranks)
            assert all(digests == res[0][0] for digests, _ in res), general_ranks
            assert [has for _, has in res] == [r not in general_ranks for r in range(n)]
        # a rank late past the probe interval: the others' chains stop mid-rounds and
        # hand over to the general path, which finishes the rounds on their lanes
        res = w.run(P.late_rank, "all_reduce", LATE_S, 1 << 19)
        assert len({d for d, _ in res}) == 1 and all(has for _, has in res), res
        # complex64 has no C loop: no plan, each round's combines through scratch
        for r, (planned, general, has_plan) in enumerate(
                w.run(P.same_results, "all_reduce", 300_007, "complex64", "SUM", 0)):
            assert planned == general and not has_plan, r


@pytest.mark.parametrize("kind", P.KINDS)
def test_calls_that_change_from_call_to_call_get_their_own_plan(world, kind):
    assert world.run(P.alternating, kind) == [True] * world.size


def test_large_reduce_scatter_is_planned(world):
    """Blocks beyond the eager limit (80 KB): planned at every N, by the direct
    algorithm at N = 2 (one peer: no deadlock) and the pairwise one beyond (its
    steps match rank to rank)."""
    for planned, general, has_plan in world.run(P.same_results, "reduce_scatter", 20000,
                                                "float32", "SUM", 0):
        assert planned == general and has_plan


@pytest.mark.parametrize("kind", P.KINDS)
def test_mismatch_on_the_plan_raises_on_every_rank(world, kind):
    res = world.run(P.mismatch, kind, timeout=60)
    for r, (where, msg, has_plan) in enumerate(res):
        assert where == "raised" and "mismatch" in msg, (kind, r, res)
        assert has_plan, (kind, r)


@pytest.mark.parametrize("kind", P.KINDS)
def test_late_rank_hands_over_to_the_general_path(world, kind):
    res = world.run(P.late_rank, kind, LATE_S, 100)
    assert all(r[1] for r in res), res


@pytest.mark.parametrize("kind", P.KINDS)
def test_set_spin_reaches_every_plan_and_results_stay_right(world, kind):
    # set_spin(comm, False): the helper-driven waits of the Horovod coordinator
    for off, made, on, planned, general_off, general_on, has_plan in world.run(P.no_spin, kind):
        assert off and not any(off) and not any(made) and all(on), (off, made, on)
        assert planned == general_off == general_on, kind
        assert has_plan, kind


def test_plan_cache_is_bounded(world):
    from commrt.collectives._small import MAX_PLANS

    assert world.run(P.bounded, MAX_PLANS + 20) == [MAX_PLANS] * world.size


@pytest.mark.parametrize("kind", ["broadcast", "reduce_scatter", "all_gather", "all_reduce"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_peer_fails_the_others(kind, transport, tmp_path):
    with World(3, transport=transport, env=ENV, timeout=60) as w:
        with pytest.raises(WorldError, match="rank 2"):
            w.run(P.dead_peer, kind, str(tmp_path), timeout=30)
    for r in (0, 1):
        err, has_plan = json.loads((tmp_path / f"{r}.json").read_text())
        assert err is not None and "rank 2" in err, (r, err)
        assert has_plan, r


def test_timeout_on_the_plan_is_the_general_paths():
    with World(2, env=dict(ENV, COMMRT_TIMEOUT="2"), timeout=60) as w:
        (kind0, msg0, elapsed), (kind1, msg1, has_plan) = w.run(P.timeout_on_plan, 6, timeout=40)
    # (the error's type proves the path: the call's deadline, not the world's, ended it)
    assert kind0 == "CommTimeoutError" and "broadcast #" in msg0 and "rank 1" in msg0, msg0
    assert kind1 != "no error" and has_plan, (kind1, msg1)


def test_a_call_without_a_plan_is_not_prepared_again():
    with World(3, transport="shm", env={"COMMRT_REDUCE_SCATTER_ALGO": "direct"},
               timeout=60) as w:
        for algo, missed, named in w.run(P.no_plan_remembered):
            assert algo == "direct" and missed == 1 and named, (algo, missed, named)


# The ring's, reduce_bcast's, ps's and dbtree's all-reduce plans (plans.LAYOUTS): chosen by the
# cost model or forced, like recursive doubling's and Rabenseifner's.  65536·3+1
# float32 elements at N = 3 give chunks of 2 segments and of 1 (the ring's plan
# regroups its steps by message position: chunks need not match), 200_000
# float64 ones several segments per chunk.
@pytest.mark.parametrize("algo", ["ring", "reduce_bcast", "ps", "dbtree"])
@pytest.mark.parametrize("n,transport", [(2, "shm"), pytest.param(5, "shm", marks=pytest.mark.long),
                                         (3, "tcp")], ids=lambda v: str(v))
def test_ring_and_reduce_bcast_all_reduce_plans(algo, n, transport):
    # (N = 3 on shared memory too until 2026-12-06: ~12 s of the suite for what
    # N = 3 over TCP and N = 2 and 5 on shared memory already cover)
    env = {**ENV, "COMMRT_ALLREDUCE_ALGO": algo}
    with World(n, transport=transport, env=env, timeout=120) as w:
        for count, dtype, op in ((5, "float32", "SUM"), (65536 * 3 + 1, "float32", "SUM"),
                                 (200_000, "float64", "MAX"), (1000, "int32", "AVG"),
                                 ((plans.RING_READ_BYTES >> 2) + 3, "float32", "SUM")):
            for r, (planned, general, has_plan) in enumerate(
                    w.run(P.same_results, "all_reduce", count, dtype, op, 0)):
                assert planned == general, (algo, count, dtype, r)
                assert has_plan, (algo, count, dtype, r)
        for count in (7, 100_000):
            for r, ((planned, general), has_plan) in enumerate(
                    w.run(P.traffic, "all_reduce", count)):
                assert has_plan and planned == general, (algo, count, r, planned, general)
        # late by more than the probe interval: the others' chains hand over
        for digest, has_plan in w.run(P.late_rank, "all_reduce", LATE_S, 100_000):
            assert has_plan
        assert len({d for d, _ in w.run(P.late_rank, "all_reduce", LATE_S, 3000)}) == 1
        for where, msg, has_plan in w.run(P.mismatch, "all_reduce", timeout=60):
            assert where == "raised" and "mismatch" in msg and has_plan, (algo, where, msg)


@pytest.mark.parametrize("hosts,transport", [pytest.param((2, 2, 2), "shm", marks=pytest.mark.long),
                                             ((3, 2), "tcp")],
                         ids=lambda v: str(v))
def test_hierarchical_all_reduce_plan_across_hosts(hosts, transport):
    """Hosts of the sizes given (hierarchical's host seam), so the host reduce, the
    leaders' ring and the host broadcast all run: on its plan the hierarchical
    all-reduce gives the general path's bits and traffic, with the binomial
    host broadcast and with the pipelined one (1 MiB, within its limit); above
    the pipeline's limit it keeps to the general path; a late rank hands over
    and a mismatch raises on every rank."""
    env = {**ENV, "COMMRT_ALLREDUCE_ALGO": "hierarchical"}
    owner = [h for h, size in enumerate(hosts) for _ in range(size)]
    with World(len(owner), transport=transport, env=env, timeout=120) as w:
        w.run(hierarchical.pretend_hosts, owner)
        for count, dtype, op, want in ((5, "float32", "SUM", True),
                                       (70_000, "float64", "MAX", True),
                                       ((1 << 18) + 3, "float32", "SUM", True),
                                       (1000, "int32", "AVG", True),
                                       ((plans.PIPELINE_MAX_BYTES >> 2) + 1, "float32", "SUM",
                                        False)):
            for r, (planned, general, has_plan) in enumerate(
                    w.run(P.same_results, "all_reduce", count, dtype, op, 0)):
                assert planned == general, (count, dtype, r)
                assert has_plan == want, (count, dtype, r)
        for count in (7, 100_000):
            for r, ((planned, general), has_plan) in enumerate(
                    w.run(P.traffic, "all_reduce", count)):
                assert has_plan and planned == general, (count, r, planned, general)
        for digest, has_plan in w.run(P.late_rank, "all_reduce", LATE_S, 100_000):
            assert has_plan
        for where, msg, has_plan in w.run(P.mismatch, "all_reduce", timeout=60):
            assert where == "raised" and "mismatch" in msg and has_plan, (where, msg)


@pytest.mark.parametrize("n", range(2, 10))
def test_ring_all_reduce_plan_keeps_every_dependency_and_matches_step_for_step(n):
    """The ring's plan regroups its schedule (step t: the t-th send and the t-th
    receive).  Checked on every rank against the schedule's own order: each
    step's send is received by its peer in the same step (so no chain can wait
    on a later step of another), each send goes after every receive into its
    range that the schedule puts before it and before every one it puts
    after, and the messages are the schedule's, in its order."""
    from commrt.collectives.all_reduce import ring

    from commrt.comm import Channel

    for count, isz in _ring_counts(n) + [(plans.RING_READ_BYTES // 4, 4)]:
        scheds = [ring.schedule(n, r, count, 0, itemsize=isz) for r in range(n)]
        steps = [plans._all_reduce_ring(n, r, scheds[r], count, isz, 0, 1)[0] for r in range(n)]
        # from RING_READ_BYTES up every receive says it is half of an exchange
        # (read where ranks share cores), the messages otherwise the same
        read = count * isz >= plans.RING_READ_BYTES
        for r in range(n):
            for step in steps[r]:
                for m in step:
                    if m[0] == plans.RECV:
                        assert (len(m) == 9 and m[8] == Channel.EXCHANGE) == read, (count, m)
        steps = [[[m[:6] for m in step] for step in rs] for rs in steps]
        orders = [[m for s in scheds[r] for m in plans._msgs(s, isz, plans.BUF, plans.BUF, 1)]
                  for r in range(n)]
        _check_paired(n, orders, steps, (count, isz))


@pytest.mark.parametrize("n", range(2, 10))
def test_dbtree_rounds_match_within_the_round_and_keep_every_dependency(n):
    """dbtree's schedule in rounds, for 1-5 segments a tree and every rank: each
    message is posted by its peer in the same round (so neither a plan, which
    waits for a round's sends, nor a mix of plans and general paths can wait
    on a later round of another rank); per pair and lane the sends and
    receives pair up in order with the same ranges; a node takes a segment's
    two children's copies in two rounds, the first child's first (the
    general path's operand order); a rank sends a range up only after every
    combine into it, and forwards a result only after receiving it."""
    from commrt.collectives.all_reduce import dbtree

    seg = 256 << 10
    for count in (1, 2, 3, 1001, seg // 2 + 1, seg, 3 * seg + 5, 5 * seg):
        rounds = [dbtree.rounds(n, r, count) for r in range(n)]
        sent, got = {}, {}
        for r in range(n):
            for at, msgs in rounds[r].items():
                for m in msgs:
                    key = (r, m.peer, m.ctx) if m.op == "send" else (m.peer, r, m.ctx)
                    (sent if m.op == "send" else got).setdefault(key, []).append(
                        (at, m.lo, m.hi))
        assert sent.keys() == got.keys(), count
        for key in sent:
            assert sorted(sent[key]) == sorted(got[key]), (count, key)     # same round too
        for r in range(n):
            combined, received = {}, set()
            for at in sorted(rounds[r]):
                for m in rounds[r][at]:
                    rng = (m.ctx, m.lo, m.hi)
                    if m.op == "send":
                        parent = dbtree.tree(n, r, m.ctx - dbtree.LANE_TAGS[0])[0]
                        kids = dbtree.tree(n, r, m.ctx - dbtree.LANE_TAGS[0])[1]
                        if m.peer == parent:          # up: every child's copy in
                            assert [c for c, _ in combined.get(rng, [])] == kids, (count, r, m)
                            assert all(t < at for _, t in combined.get(rng, [])), (count, r)
                        else:                         # down: the result, received before
                            assert parent is None or rng in received, (count, r, m)
                    elif m.op == "combine":
                        combined.setdefault(rng, []).append((m.peer, at))
                        firsts = combined[rng][:-1]
                        assert all(t < at for _, t in firsts), (count, r, m)
                    else:
                        received.add(rng)


@pytest.mark.parametrize("n", range(2, 10))
def test_ring_reduce_plan_keeps_every_dependency(n):
    """The ring reduce's plan: its in-place ring reduce-scatter regrouped as the
    ring all-reduce's (checked the same way; in scratch, after a copy of the
    input, at the non-roots), then the gather of the reduced chunks, the
    schedule's last step, as it is."""
    from commrt.collectives.reduce import ring

    for root in (0, n - 1):
        for count, isz in _ring_counts(n):
            scheds = [ring.schedule(n, r, count, root, itemsize=isz) for r in range(n)]
            orders, steps = [], []
            for r in range(n):
                got, tmp = plans._reduce_ring(n, r, scheds[r], count, isz, root, 1)
                where = plans.BUF if r == root else plans.TMP
                assert tmp == (None if r == root else count * isz)
                if r != root:
                    assert got[0][0] == plans._copy(r, plans.TMP, 0, plans.IN, 0, count * isz)
                    got = [got[0][1:]] + got[1:]
                assert got[-1] == plans._msgs(scheds[r][-1], isz, plans.BUF, where)
                steps.append(got[:-1])
                orders.append([m for s in scheds[r][:-1]
                               for m in plans._msgs(s, isz, where, where, 1)])
            # (each rank's sends and receives, by peer: BUF and TMP are one buffer's
            # offsets either way)
            _check_paired(n, orders, steps, (root, count, isz))


@pytest.mark.parametrize("n", range(2, 10))
def test_ring_reduce_scatter_plan_keeps_every_dependency(n):
    """The out-of-place ring reduce-scatter's plan: the input copied into scratch
    and our own block into the output, then the schedule's messages regrouped
    as the ring all-reduce's, the first block's sends from the input, later
    sends from scratch, the combines into scratch but the last block's, into
    the output.  Checked as the ring all-reduce's, the three buffers' ranges
    kept apart (shifted), so that only ranges of one buffer overlap."""
    from commrt.collectives.reduce_scatter import ring

    for count, isz in _ring_counts(n):
        m = count // n
        apart = {plans.BUF: 0, plans.IN: 2 * count * isz, plans.TMP: 4 * count * isz}
        orders, steps = [], []
        for r in range(n):
            sched = ring.schedule(n, r, count, 0, itemsize=isz)
            got, tmp = plans._reduce_scatter_ring(n, r, sched, m, isz, 0, 1)
            assert tmp == n * m * isz
            assert got[0][:2] == [plans._copy(r, plans.TMP, 0, plans.IN, 0, n * m * isz),
                                  plans._copy(r, plans.BUF, 0, plans.IN, r * m * isz, m * isz)]
            got = [got[0][2:]] + got[1:]
            steps.append([[(k, p, w, off + apart[w], ln, h) for k, p, w, off, ln, h in step]
                          for step in got if step])
            msgs = [x for s in sched for x in s]
            first = sum(x.op == "send" for x in sched[0])
            sends = [x for x in msgs if x.op == "send"]
            combines = [x for x in msgs if x.op == "combine"]
            assert len(sends) == len(combines) == (n - 1) * first
            order, nsend, ncomb = [], 0, 0
            for x in msgs:      # the schedule's order, each message in its buffer
                if x.op == "send":
                    w = plans.IN if nsend < first else plans.TMP
                    order.append((plans.SEND, x.peer, w, x.lo * isz + apart[w],
                                  (x.hi - x.lo) * isz, 0))
                    nsend += 1
                else:
                    w = plans.BUF if ncomb >= len(combines) - first else plans.TMP
                    order.append((plans.RECV, x.peer, w, x.lo * isz + apart[w],
                                  (x.hi - x.lo) * isz, 1))
                    ncomb += 1
            orders.append(order)
        _check_paired(n, orders, steps, (count, isz))


def _ring_counts(n):
    import random

    rng = random.Random(n)
    return [(count, isz) for count in [1, n - 1, n, 1000, 65536 * n - 1, 65536 * n + 1,
                                       65536 * 3 + 7, 200_000, rng.randrange(1, 600_000)]
            for isz in (4, 8)]


def _check_paired(n, orders, steps, what):
    for r in range(n):
        order = orders[r]
        for step in steps[r]:
            assert sum(m[0] == plans.SEND for m in step) <= 1
            assert sum(m[0] == plans.RECV for m in step) <= 1
        flat = [m for step in steps[r] for m in step]
        assert sorted(flat) == sorted(order)
        for kind in (plans.SEND, plans.RECV):    # each list in the schedule's order
            assert [m for m in flat if m[0] == kind] == [m for m in order if m[0] == kind]
        when = _steps_of(order, steps[r])
        for i, m in enumerate(order):
            if m[0] != plans.SEND:
                continue
            peer_step = [x for x in steps[m[1]][when[i]] if x[0] == plans.RECV]
            assert peer_step and peer_step[0][1] == r and peer_step[0][4] == m[4]
            for j, x in enumerate(order):
                overlap = x[0] == plans.RECV and x[3] < m[3] + m[4] and m[3] < x[3] + x[4]
                if overlap:
                    assert when[j] < when[i] if j < i else when[j] > when[i], (what, r, i, j)


def _steps_of(order, steps):
    """For each message of the schedule's order, the plan step holding it (the
    k-th send/receive of the plan is the k-th of the schedule)."""
    pos = {plans.SEND: [], plans.RECV: []}
    for t, step in enumerate(steps):
        for m in step:
            pos[m[0]].append(t)
    seen = {plans.SEND: 0, plans.RECV: 0}
    out = []
    for m in order:
        out.append(pos[m[0]][seen[m[0]]])
        seen[m[0]] += 1
    return out


@pytest.mark.parametrize("n,transport", [(3, "shm"), (4, "shm"), (3, "tcp")], ids=str)
def test_pipelined_broadcast_is_planned_up_to_its_limit(n, transport):
    """Forced, the pipelined broadcast runs on a plan from several segments up to
    plans.PIPELINE_MAX_BYTES (results and traffic the general path's, every
    root) and on the general path beyond."""
    env = {**ENV, "COMMRT_BROADCAST_ALGO": "pipeline"}
    with World(n, transport=transport, env=env, timeout=120) as w:
        for count in (5, 300_000):              # 300_000 float32: 5 segments
            for root in (0, n - 1):
                for planned, general, has_plan in w.run(P.same_results, "broadcast", count,
                                                        "float32", "SUM", root):
                    assert planned == general and has_plan, (count, root)
        for (planned, general), has_plan in w.run(P.traffic, "broadcast", 300_000, 1):
            assert has_plan and planned == general, (planned, general)
        over = plans.PIPELINE_MAX_BYTES // 4 + 1
        assert not plans.applies("broadcast", "pipeline", n, 4 * over)
        for planned, general, has_plan in w.run(P.same_results, "broadcast", over, "float32",
                                                "SUM", 0):
            assert planned == general and not has_plan


FORCED = sorted(plans.LAYOUTS) + [("all_reduce", "recursive_doubling"),
                                  ("all_reduce", "rabenseifner")]


@pytest.mark.parametrize("n,transport", [(4, "shm"), (3, "shm"), (3, "tcp")], ids=str)
def test_a_call_naming_its_algorithm_runs_on_a_plan(n, transport):
    """algorithm= gets the plan of that algorithm (keyed with its name) from its
    second call on, as the cost model's choice does: run by the compiled entry
    where it serves the kind (the general path's Python not entered: it cost
    named calls 2.5 µs at 64 KiB), no Call made (the general path's), the general path's results bit
    for bit, roots other than 0 and an op too; where the algorithm has no plan
    at that size (Rabenseifner's needs a power of two; the direct
    reduce-scatter's blocks beyond the eager limit), the general path as
    before."""
    with World(n, transport=transport, env={"COMMRT_COLL_PROBE_S": str(PROBE_S)}, timeout=120) as w:
        for kind, algo in FORCED:
            for count in (7, 30_000):
                nbytes = 4 * count * (n if kind in P.PER_BLOCK else 1)
                root = n - 1 if kind in ("broadcast", "reduce", "gather", "scatter") else 0
                op = "MAX" if kind in ("reduce", "reduce_scatter", "all_reduce") else "SUM"
                want = plans.applies(kind, algo, n, nbytes)
                for r, (planned, general, made, entered) in enumerate(
                        w.run(P.forced, kind, algo, count, "float32", op, root)):
                    assert planned == general, (kind, algo, count, r)
                    assert (made == []) == want, (kind, algo, count, r, made, want)
                    if kind not in P.VKINDS:    # (their plans keyed with the counts)
                        assert (entered == 0) == want, (kind, algo, count, r, entered, want)


@pytest.mark.parametrize("kind", P.VKINDS)
def test_variable_size_collectives_are_planned(world, kind):
    """all_gatherv, gatherv, scatterv and all_to_allv (blocks of different sizes,
    one of them empty with n = 0) run on plans keyed with their counts: the
    general path's results (and NumPy's) bit for bit and its per-peer traffic;
    a rank that comes late hands over, as for the fixed-size ones."""
    for n in (0, 7, 3000):
        for root in ((0, world.size - 1) if kind in ("gatherv", "scatterv") else (0,)):
            for dtype in ("float32", "int64"):
                for r, (planned, general, has_plan) in enumerate(
                        world.run(P.same_results, kind, n, dtype, "SUM", root)):
                    assert planned == general and has_plan, (kind, n, root, dtype, r)
    for r, ((planned, general), has_plan) in enumerate(world.run(P.traffic, kind, 5000,
                                                                 world.size - 1)):
        assert has_plan and planned == general, (kind, r, planned, general)
    # (each rank's output is checked against NumPy inside the call)
    res = world.run(P.late_rank, kind, LATE_S, 100)
    assert all(has_plan for _, has_plan in res)
    if kind == "all_gatherv":
        assert len({d for d, _ in res}) == 1, res


@pytest.mark.parametrize("n,transport", [(3, "shm"), (5, "shm"), (3, "tcp")], ids=str)
def test_tree_all_reduce_is_planned_within_one_segment(n, transport):
    """The binary tree's all-reduce runs on a plan where the buffer is one
    segment: a node's second child's copy lands in scratch and the step's hook
    combines it after the first child's reduce-receive, the general path's
    order, so the results are its own bit for bit (rank 0 and 1 have two
    children at N = 5); beyond one segment it keeps to the general path."""
    env = {**ENV, "COMMRT_ALLREDUCE_ALGO": "tree"}
    with World(n, transport=transport, env=env, timeout=120) as w:
        for count, dtype, op in ((1, "float32", "SUM"), (3000, "float32", "SUM"),
                                 (65536, "float32", "SUM"), (5000, "float64", "MAX"),
                                 (1000, "int32", "AVG")):
            for r, (planned, general, has_plan) in enumerate(
                    w.run(P.same_results, "all_reduce", count, dtype, op, 0)):
                assert planned == general and has_plan, (count, dtype, r)
        for r, ((planned, general), has_plan) in enumerate(w.run(P.traffic, "all_reduce", 3000)):
            assert has_plan and planned == general, (r, planned, general)
        assert all(has_plan for _, has_plan in w.run(P.late_rank, "all_reduce", LATE_S, 3000))
        for r, (planned, general, has_plan) in enumerate(
                w.run(P.same_results, "all_reduce", 65537, "float32", "SUM", 0)):
            assert planned == general and not has_plan, r


def test_variable_size_counts_are_checked_before_a_plan_runs():
    """A plan is taken before the argument checks only for counts equal to a
    checked call's (Python or NumPy ints): float counts or too few still raise
    their clear errors on every rank, with the plan there."""
    with World(3, transport="shm", env=ENV, timeout=60) as w:
        for errors, gen_ok, numpy_ints_planned in w.run(P.v_counts_checked_on_the_plan):
            assert errors == ["TypeError", "TypeError", "ValueError"], errors
            assert gen_ok and numpy_ints_planned


def test_plan_and_scratch_buffers_start_at_multiples_of_64(world):
    for plan_offsets, scratch_offsets in world.run(P.buffer_offsets):
        assert plan_offsets and set(plan_offsets) == {0}
        assert world.size < 3 or scratch_offsets      # the ring's (N = 2 combines directly)
        assert set(scratch_offsets) <= {0}
