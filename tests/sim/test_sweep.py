"""The sweep's parts: the memoised bounds give the schedule's own messages, the symmetry
shortcut equals the full run wherever it is taken and is refused where ranks differ,
NCCL's tuning model keeps its published arithmetic and trend, and the commands run
end to end (small N)."""
import json
import math
import subprocess
import sys

import pytest

from commrt.sim import nccl, schedules, sweep, validate
from commrt.sim.engine import Topology, run, uniform

A, B, G = 5e-6, 1e-9, 2e-10


def topo(nodes, per_node, **kw):
    base = dict(alpha_shm=A, beta_shm=B / 2, alpha_net=2 * A, beta_net=B, gamma=G,
                segment=1 << 14)
    base.update(kw)
    return Topology(nodes, per_node, **base)


@pytest.mark.parametrize("n", [2, 4, 8, 32, 64])
@pytest.mark.parametrize("count", [1, 7, 100, 1 << 12])
def test_memoised_bounds_give_the_schedules_own_messages(n, count):
    mod = schedules.module("rabenseifner")
    before = mod.bounds
    memo = schedules.steps_of("rabenseifner", n, count)
    got = [memo(r) for r in range(n)]
    assert mod.bounds is before            # the module is left as it was
    sched = mod.schedule
    for r in range(n):
        raw = sched(n, r, count)
        if raw and isinstance(raw[0], tuple) and len(raw[0]) == 6:   # the pairwise form
            raw = [[("send", q, s0, s1), ("combine" if red else "recv", q, r0, r1)]
                   for q, s0, s1, r0, r1, red in raw]
        assert got[r] == [list(step) for step in raw]


CASES = [(1, 8, 1 << 12), (8, 1, 1 << 12), (32, 1, 1 << 12), (1, 16, 1 << 10),
         (8, 1, 5), (16, 1, 1000), (4, 4, 1 << 12), (2, 8, 1 << 12)]


@pytest.mark.parametrize("nodes,per_node,count", CASES)
def test_the_shortcut_is_the_full_run_where_taken(nodes, per_node, count):
    n = nodes * per_node
    t = topo(nodes, per_node)
    steps = schedules.steps_of("rabenseifner", n, count)
    short, taken = run(t, steps)
    full, never = run(t, steps, shortcut=False)
    assert not never
    assert short == full                  # bit for bit: the same arithmetic
    even = count % n == 0
    assert taken == (even and (nodes == 1 or per_node == 1))


def test_the_shortcut_is_refused_where_ranks_can_differ():
    n, count = 8, 1 << 12
    steps = [schedules.steps_of("rabenseifner", n, count)(r) for r in range(n)]
    assert uniform(topo(8, 1), steps)
    assert not uniform(topo(2, 4), steps)                 # ranks queue on a shared NIC
    assert not uniform(topo(8, 1, bisection=1e9), steps)  # one fabric queue for all
    assert not uniform(topo(1, 8, cores=2), steps)        # ranks queue for cores
    # a binomial broadcast from rank 0: ranks' steps differ
    bcast = [[] for _ in range(4)]
    bcast[0] = [[("send", 1, 0, 4)], [("send", 2, 0, 4)]]
    bcast[1] = [[("recv", 0, 0, 4)], [("send", 3, 0, 4)]]
    bcast[2] = [[("recv", 0, 0, 4)]]
    bcast[3] = [[("recv", 1, 0, 4)]]
    assert not uniform(topo(4, 1), bcast)
    # same shapes everywhere, but a receive matched by its peer's send of another step
    skew = [[[("send", (r + 1) % 4, 0, 4)], [("recv", (r - 1) % 4, 0, 4)]] for r in range(4)]
    assert not uniform(topo(4, 1), skew)
    assert run(topo(4, 1), lambda r: skew[r])[0] > 0   # it still runs, in full


def test_nccl_model_keeps_tuning_cc_arithmetic():
    # ring, Simple, 16 ranks on 2 nodes, NVLink inside: base 8.4 + 28 intra hops of
    # 3.4 + 2 network hops of 9.6 (µs)
    assert nccl.latency_us("ring", "Simple", 16, 2) == pytest.approx(8.4 + 28 * 3.4 + 2 * 9.6)
    # tree, LL, 64 ranks on 8 nodes: base 6.8 + 2 (7 intra of .52·1.8 + 3 levels of 5.0)
    assert nccl.latency_us("tree", "LL", 64, 8) == pytest.approx(
        6.8 + 2 * (7 * 0.52 * 1.8 + 3 * 5.0))
    # bandwidth: ring N/(2(N-1)) of the bus, tree min(.9 bus, 80) / 2 on > 2 nodes
    assert nccl.bandwidth_gbps("ring", "Simple", 16, 2, 20.0) == pytest.approx(20 * 16 / 30)
    assert nccl.bandwidth_gbps("tree", "Simple", 64, 8, 200.0) == pytest.approx(40.0)
    # 1 MiB: tree correction at log2(1 MiB / 64) = 14 (Simple: .5); ring plateau x1.9
    k = 1 << 20
    tree = nccl.time_us("tree", "Simple", 64, 8, k, 20.0)
    assert tree == pytest.approx(nccl.latency_us("tree", "Simple", 64, 8)
                                 + k / (1000 * 9.0 * 0.5))
    ring = nccl.time_us("ring", "Simple", 64, 8, k, 20.0)
    assert ring == pytest.approx(1.9 * nccl.latency_us("ring", "Simple", 64, 8)
                                 + k / (1000 * 20 * 64 / 126))


def test_nccl_trend_tree_log_nodes_ring_linear():
    per = 8
    ring = [nccl.latency_us("ring", "LL", per * h, h) for h in (2, 4, 8, 16, 32)]
    tree = [nccl.latency_us("tree", "LL", per * h, h) for h in (2, 4, 8, 16, 32)]
    ring_steps = [b - a for a, b in zip(ring, ring[1:])]
    tree_steps = [b - a for a, b in zip(tree, tree[1:])]
    assert all(math.isclose(d, tree_steps[0]) for d in tree_steps)   # + const per doubling
    assert all(b > 1.9 * a for a, b in zip(ring_steps, ring_steps[1:]))  # grows with N
    sizes = sweep.CROSS_SIZES
    cross = [nccl.crossover(per * h, h, 12.5, sizes) for h in (8, 32, 128, 512)]
    finite = [c if c is not None else 2 * sizes[-1] for c in cross]
    assert finite == sorted(finite) and finite[0] < finite[-1]


def test_commrt_crossover_grows_with_n():
    links = {"alpha_shm": 1e-6, "beta_shm": 1 / 20e9, "alpha_net": 5e-6,
             "beta_net": 1 / 12.5e9, "gamma": 1 / 10e9, "segment": 1 << 20}
    rows = sweep.crossovers([16, 128, 1024], 8, links, 12.5, simulate=False)
    got = [r["commrt_model"] or 2 * sweep.CROSS_SIZES[-1] for r in rows]
    assert got == sorted(got) and got[0] < got[-1]
    assert all(r["commrt_picks"] and r["commrt_picks"][0][0] == sweep.CROSS_SIZES[0]
               for r in rows)


@pytest.mark.timeout(240)
def test_sweep_command_json_and_png(tmp_path):
    out = subprocess.run([sys.executable, "-m", "commrt.sim", "sweep", "--ranks", "2,4,16",
                          "--sizes", "8,64K,4M", "--cross-ranks", "16,64", "--json",
                          str(tmp_path / "s.json"), "--png", str(tmp_path / "s.png")],
                         capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "s.json").read_text())
    with_schedule = [a for a in schedules.names() if schedules.has_schedule(a)]
    assert with_schedule == list(schedules.names())      # every one has a schedule
    # one rank per node: hierarchical (several hosts of several ranks) is left out
    multi = {a for a in schedules.names() if getattr(schedules.module(a), "LINKS", False)}
    assert {r["algo"] for r in res["rows"]} == set(with_schedule) - multi
    assert set(res["not_simulated"]) == multi
    for r in res["rows"]:
        n, k, t = r["ranks"], r["bytes"], r["time_s"]
        assert t > 0 and r["busbw_GBps"] == pytest.approx(2 * (n - 1) / n * k / t / 1e9)
    assert [c["ranks"] for c in res["crossovers"]] == [16, 64]
    for n, best in res["simulated_best"].items():   # the fastest simulated, per size
        for k, algo in best["simulated"]:
            cell = [r for r in res["rows"] if r["ranks"] == int(n) and r["bytes"] == k]
            assert min(cell, key=lambda r: r["time_s"])["algo"] == algo
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "NCCL ring>tree" in out.stdout and "fastest simulated" in out.stdout


@pytest.mark.timeout(300)
def test_validate_runs_end_to_end(tmp_path):
    """Tiny sizes only: the figures need a quiet machine."""
    out = subprocess.run([sys.executable, "-m", "commrt.sim", "validate", "--ranks", "2",
                          "--sizes", "4K", "--rounds", "1", "--json", str(tmp_path / "v.json")],
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr
    saved = json.loads((tmp_path / "v.json").read_text())
    data = saved["cells"]
    with_schedule = {a for a in schedules.names() if schedules.has_schedule(a)}
    # every one by default, but those for several hosts (on one: hierarchical)
    assert {key.split("|")[1] for key in data} == with_schedule - set(validate.MULTI_HOST)
    for cell in data.values():
        assert cell["measured"][0] > 0 and cell["simulated"][0] > 0
    assert "sim/measured" in out.stdout
    # the calibration is saved beside the cells: replaying gives the same figures
    p = saved["params"]["2|0"]
    assert p["call"] > 0 and p["alpha"] > 0 and len(p["beta_at"]) == len(validate.BETA_SIZES)
    again = validate.replay([str(tmp_path / "v.json")])
    for key, cell in data.items():
        n, algo, k = key.split("|")
        assert again[(int(n), algo, int(k))]["simulated"] == cell["simulated"]
