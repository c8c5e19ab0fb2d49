"""Pipeline parallel: GPipe and 1F1B equal the unsplit model bit for bit;
PipeDream replays exactly; stash counts; bubble against (K-1)/(M+K-1);
hybrid (2 stages x 2 replicas) equals one process."""
import pytest

from commrt.parallel import pipeline as pl
from commrt.testing import World

import mp_ranks

ENV = {"OPENBLAS_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def world2():
    with World(2, transport="shm", env=ENV, timeout=120) as w:
        yield w


@pytest.fixture(scope="module")
def world4():
    with World(4, transport="shm", env=ENV, timeout=120) as w:
        yield w


# ---- schedules without processes -------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("K,M", [(2, 1), (2, 4), (3, 5), (4, 4), (4, 8), (8, 3)])
def test_simulated_bubble_is_the_formula(schedule, K, M):
    for t_f, t_b in ((1.0, 1.0), (1.0, 2.0)):
        sim = pl.simulate(schedule, K, M, t_f, t_b)
        assert sim["makespan"] == pytest.approx((M + K - 1) * (t_f + t_b))
        assert sim["bubble"] == pytest.approx(pl.bubble_formula(K, M))


@pytest.mark.parametrize("K,M", [(2, 4), (4, 8), (4, 2), (3, 7)])
def test_simulated_stash_gpipe_M_1f1b_at_most_K(K, M):
    assert pl.simulate("gpipe", K, M)["peak_stash"] == [M] * K
    assert pl.simulate("1f1b", K, M)["peak_stash"] == [min(K - s, M) for s in range(K)]


def test_schedules_list_every_op_once():
    for name in ("gpipe", "1f1b", "pipedream"):
        for K, M in ((1, 1), (2, 3), (4, 8)):
            for s in range(K):
                ops = pl.get_schedule(name).ops(s, K, M)
                assert sorted(i for k, i in ops if k == "F") == list(range(M))
                assert [i for k, i in ops if k == "B"] == list(range(M))   # in order
                updates = [i for k, i in ops if k == "U"]
                assert updates == (list(range(M)) if name == "pipedream" else [M - 1])
    with pytest.raises(ValueError, match="unknown schedule"):
        pl.get_schedule("zigzag")


def test_a_deadlocking_schedule_is_detected():
    class Backwards(pl.Schedule):
        name = "backwards"

        def ops(self, stage, num_stages, m):
            return [("B", i) for i in range(m)] + [("F", i) for i in range(m)]
    with pytest.raises(RuntimeError, match="deadlocks"):
        pl.simulate(Backwards(), 2, 2)


# ---- real pipelines ----------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stage_resnet_gradients_bit_for_bit(world2, schedule):
    res = world2.run(mp_ranks.pipeline_vs_reference, schedule, 4, timeout=100)
    for r in res:
        assert all(r["same"]) and r["same"], r["same"]
        assert all(r["params_same"])
    assert res[0]["loss"] is None and res[1]["loss"] == res[1]["ref_loss"]
    expect = [4, 4] if schedule == "gpipe" else [2, 1]
    assert [r["peak_stash"] for r in res] == expect


@pytest.mark.parametrize("schedule,M", [("gpipe", 6), ("1f1b", 6), ("1f1b", 3)])
def test_four_stage_gradients_bit_for_bit_and_stash(world4, schedule, M):
    res = world4.run(mp_ranks.pipeline_vs_reference, schedule, M, "mlp", 12, timeout=100)
    for r in res:
        assert r["same"] and all(r["same"])
        assert all(r["params_same"])
    assert res[3]["loss"] == res[3]["ref_loss"]
    peaks = [r["peak_stash"] for r in res]
    assert peaks == ([M] * 4 if schedule == "gpipe" else [min(4 - s, M) for s in range(4)])
    stats = res[0]["stats"]
    assert stats["peak_stash"] == peaks
    assert stats["bubble_formula"] == pytest.approx(3 / (M + 3))
    assert 0.0 <= stats["bubble"] < 1.0 and stats["makespan_s"] > 0
    assert 0.0 <= stats["bubble_simulated"] < 1.0


def test_pipedream_weight_stashing_replays_exactly(world4):
    res = world4.run(mp_ranks.pipedream_vs_reference, 8, timeout=100)
    for r in res:
        assert r["same"] and all(r["same"])
    # stage s keeps K-s activations and, in the steady state (M >= 2K-1 here),
    # as many weight versions
    assert [r["peak_stash"] for r in res] == [4, 3, 2, 1]
    assert [r["versions"] for r in res] == [4, 3, 2, 1]


def test_hybrid_two_stages_two_replicas_equals_one_process(world4):
    res = world4.run(mp_ranks.hybrid_vs_single, 2, 3, timeout=100)
    assert sorted((r["replica"], r["stage"]) for r in res) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in res:
        assert r["max_diff"] < 1e-12, r["max_diff"]
    assert len({tuple(r["losses"]) for r in res}) == 1


def test_train_pipeline_learns_and_reports_bubbles(world2):
    res = world2.run(mp_ranks.train_small, "1f1b", timeout=110)
    r0, r1 = res
    assert r0["losses"] == r1["losses"] and r0["accuracy"] == r1["accuracy"]
    assert r0["steps"] == 3 * 8
    assert r0["losses"][-1] < r0["losses"][0]
    assert r0["accuracy"] > 0.6
    assert len(r0["bubble"]) == 24 and all(0 <= b < 1 for b in r0["bubble"])


def test_train_hybrid_entry_point(world4):
    res = world4.run(mp_ranks.train_small, "gpipe", 2, timeout=110)
    assert len({r["accuracy"] for r in res}) == 1
    assert res[0]["losses"][-1] < res[0]["losses"][0]


def test_bench_modes_runs_and_reports_every_mode(capsys):
    from commrt.bench import modes

    assert modes.main(["--steps", "2", "--batch", "16", "--micro-batches", "2"]) == 0
    out = capsys.readouterr().out
    for mode in modes.MODES:
        assert f"| {mode} |" in out
    assert "[2, 2]" in out and "[2, 1]" in out          # GPipe and 1F1B stash peaks, K=2 M=2
