"""The simulator runs the runtime's own schedules: on uncontended links it
reproduces the α-β-γ formula exactly, a node's shared NIC slows the steps
that cross it, and bad schedules and unschedulable algorithms are named."""
import inspect
import json
import math
import subprocess
import sys

import pytest

from commrt.sim import ScheduleError, Topology, engine, simulate, schedules

A, B, G = 5e-6, 1e-9, 2e-10


def topo(nodes, per_node, **kw):
    base = dict(alpha_shm=A, beta_shm=B, alpha_net=A, beta_net=B, gamma=G, segment=1 << 30)
    base.update(kw)
    return Topology(nodes, per_node, **base)


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_rabenseifner_on_free_links_is_its_formula(n):
    count = 1 << 16
    k = 4 * count
    t = simulate(topo(n, 1), schedules.steps_of("rabenseifner", n, count))
    steps = int(math.log2(n))
    want = 2 * steps * A + 2 * (n - 1) / n * k * B + (n - 1) / n * k * G
    assert t == pytest.approx(want, rel=1e-9)


def test_a_shared_nic_serialises_the_steps_that_cross_it():
    count = 1 << 18
    k = 4 * count
    spread = simulate(topo(8, 1), schedules.steps_of("rabenseifner", 8, count))
    shared = simulate(topo(2, 4), schedules.steps_of("rabenseifner", 8, count))
    # two steps move K/2 between the nodes; four ranks share each NIC there
    assert spread + 1.5 * k * B <= shared <= spread + 3 * k * B * (1 + 1e-9)


def test_ranks_sharing_cores_take_turns_on_them():
    count = 1 << 18
    k = 4 * count
    free = simulate(topo(1, 4), schedules.steps_of("rabenseifner", 4, count))
    plenty = simulate(topo(1, 4, cores=4), schedules.steps_of("rabenseifner", 4, count))
    two = simulate(topo(1, 4, cores=2), schedules.steps_of("rabenseifner", 4, count))
    # a core per rank: the copy and the combine of a receive run one after the other
    # (no longer overlapped segment by segment), never slower than that
    assert free <= plenty <= free + 1.5 * k * G * (1 + 1e-9)
    # two cores for four ranks: each step's receive work runs two at a time
    assert two > plenty * 1.5


def test_a_core_booked_for_later_is_free_before():
    """Work is booked on the cores as messages are matched, often for later than
    work matched after it (a network segment's copies when its data lands):
    the later work takes the gap before, on the core free soonest, never an
    interval already booked."""
    cores = engine._Cores(2)
    cores.book(0, 10.0, 11.0)
    assert cores.earliest(0.0, 2.0) == (0.0, 0)         # before the booking, not after
    assert cores.earliest(9.5, 1.0) == (9.5, 1)         # the other core is free then
    cores.book(1, 9.0, 12.0)
    assert cores.earliest(9.5, 1.0) == (11.0, 0)        # both busy: the first to free up
    assert cores.earliest(8.5, 2.0) == (11.0, 0)        # gaps too short are skipped
    assert cores.earliest(8.0, 2.0) == (8.0, 0)         # one just long enough is taken
    cores.forget(11.5)
    assert cores.busy == [[], [(9.0, 12.0)]]


def test_a_combine_the_sender_copies_overlaps_its_copy_with_the_combining():
    """The binomial reduce's combines are the senders' copies (registry.sender_copies:
    Channel.SENDER, streamed through the pair's ring while the receiver combines),
    so on shared memory such a receive costs α + K·β + (one segment)·γ, not
    α + K·β + K·γ, and holds the receiver's core for the combining only; the
    schedule says so and the simulator follows it (reduce_bcast at N = 2 and
    4 was over-predicted 1.2-2.3x, docs/scale.md)."""
    from commrt.collectives import registry

    count, seg = 1 << 18, 1 << 16
    k = 4 * count
    reduce = registry.module("reduce", "binomial").schedule
    steps = [reduce(2, r, count) for r in range(2)]
    assert steps[0][0][0].copier == "sender" and steps[1][0][0].copier is None
    t = simulate(topo(1, 2, segment=seg), lambda r: steps[r])
    assert t == pytest.approx(A + k * B + seg * G, rel=1e-9)
    plain = [[[registry.Msg(*m) for m in step] for step in s] for s in steps]
    assert simulate(topo(1, 2, segment=seg), lambda r: plain[r]) == pytest.approx(
        A + k * B + k * G, rel=1e-9)
    # kept through a group's relabelling (hierarchical's) and a lane (dbtree's)
    moved = registry.relabel(registry.on_context(3, steps[0]), [5, 7])
    assert moved[0][0].copier == "sender" and moved[0][0].ctx == 3 and moved[0][0].peer == 7


def test_the_schedule_is_the_runtimes():
    sched = schedules.module("rabenseifner").schedule
    steps = schedules.steps_of("rabenseifner", 4, 100)(1)
    if "p2" in inspect.signature(sched).parameters:   # the pairwise form
        want = [[("send", q, s0, s1), ("combine" if red else "recv", q, r0, r1)]
                for q, s0, s1, r0, r1, red in sched(4, 1, 100)]
    else:
        want = [list(step) for step in sched(4, 1, 100)]
    assert steps == want and len(steps) == 4


def test_unmatched_and_unschedulable_are_errors():
    def lonely(r):
        return [[("recv", 1 - r, 0, 4)]] if r == 0 else [[]]
    with pytest.raises(ScheduleError, match="never finished"):
        simulate(topo(2, 1), lonely)
    sched = schedules.module("rabenseifner").schedule
    if "p2" in inspect.signature(sched).parameters:   # the pairwise form: its core only
        with pytest.raises(ScheduleError, match="power-of-two"):
            schedules.steps_of("rabenseifner", 6, 10)
    else:   # the registry form covers the fold: 6 ranks run
        assert simulate(topo(6, 1), schedules.steps_of("rabenseifner", 6, 10)) > 0
    assert all(schedules.has_schedule(a) for a in schedules.names())


@pytest.mark.parametrize("algo", schedules.names())
def test_every_all_reduce_runs_through_its_schedule(algo):
    """Every algorithm, one node and several, counts that split evenly and not, many
    segments (COMMRT_RING_SEGMENT_BYTES's 256 KiB: 64 Ki float32): the shortcut,
    where taken, is the full run."""
    for n, per_node in ((2, 1), (3, 1), (4, 2), (6, 3), (8, 1), (8, 4)):
        for count in (1, 6000, 200_003, 1 << 18):
            steps = schedules.steps_of(algo, n, count, ranks_per_node=per_node)
            t = topo(n // per_node, per_node)
            short, taken = engine.run(t, steps)
            full, _ = engine.run(t, steps, shortcut=False)
            assert full > 0 and short == full, (algo, n, per_node, count)


def test_the_ring_rotates_so_rank_0_alone_is_exact():
    """The ring's rotation claim (ROTATES) for every rank, and the shortcut it allows:
    taken where N divides the count and the links are free, equal to the full run
    bit for bit; refused on shared NICs and uneven blocks."""
    for n in (2, 3, 5, 8, 12):
        count = 300 * n
        steps = schedules.steps_of("ring", n, count)
        assert steps.rotation
        first = steps(0)
        for r in range(n):
            mine = steps(r)
            assert [[(m.op, m.peer, m.hi - m.lo) for m in s] for s in mine] == \
                [[(m.op, (m.peer + r) % n, m.hi - m.lo) for m in s] for s in first], (n, r)
        short, taken = engine.run(topo(n, 1), steps)
        full, _ = engine.run(topo(n, 1), steps, shortcut=False)
        assert taken and short == full
        assert not engine.run(topo(1, n, cores=1), steps)[1]
    assert not schedules.steps_of("ring", 8, 8 * 300 + 1).rotation
    n = 16384   # 5e8 messages in full: rank 0 and the sample only
    assert engine.run(topo(n, 1), schedules.steps_of("ring", n, 1 << 18))[1]


def test_messages_match_within_their_context_only():
    """dbtree's trees run on lanes of their own (hierarchical's steps on contexts of
    their own): a message of one never matches a receive of the other, even
    between the same pair in crossed order."""
    from commrt.collectives.registry import Msg, on_context

    a = on_context("a", [[Msg("send", 1, 0, 4)]])[0] + on_context("b", [[Msg("send", 1, 0, 8)]])[0]
    b = on_context("b", [[Msg("recv", 0, 0, 8)]])[0] + on_context("a", [[Msg("recv", 0, 0, 4)]])[0]
    assert simulate(topo(2, 1), lambda r: [a] if r == 0 else [b]) > 0
    plain = [[tuple(m) for m in a]], [[tuple(m) for m in b]]
    with pytest.raises(ScheduleError, match="bytes sent"):
        simulate(topo(2, 1), lambda r: plain[r])


@pytest.mark.timeout(120)
def test_command_line_json_and_calibration():
    out = subprocess.run([sys.executable, "-m", "commrt.sim", "allreduce", "--algo",
                          "rabenseifner", "--ranks", "16", "--ranks-per-node", "4", "--size",
                          "1M", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["algo"] == "rabenseifner" and res["ranks"] == 16 and res["time_s"] > 0
    assert res["auto_picks"] in schedules.names()
    out = subprocess.run([sys.executable, "-m", "commrt.sim", "allreduce", "--algo",
                          "rabenseifner", "--ranks", "4", "--ranks-per-node", "2", "--size",
                          "64K", "--calibrated", "--json"], capture_output=True, text=True,
                         timeout=110)
    assert out.returncode == 0, out.stderr
    params = json.loads(out.stdout)["params"]
    assert params["beta_net"] > 0 and params["beta_shm"] > 0 and params["gamma"] > 0
