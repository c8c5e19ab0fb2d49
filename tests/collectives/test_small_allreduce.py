"""The prepared all-reduce plans (collectives/_small.py): same results,
traffic, mismatch reports and failures as the general recursive doubling and
Rabenseifner they shortcut.

The worlds force the algorithm (COMMRT_ALLREDUCE_ALGO), so the path is
taken whatever the cost model would pick on a loaded machine."""
import json
import time

import pytest

import small_ranks as S
from commrt.testing import World, WorldError

ALGOS = ["recursive_doubling", "rabenseifner"]


def env(algo):
    return {"COMMRT_ALLREDUCE_ALGO": algo, "COMMRT_COLL_PROBE_S": "0.5"}


ENV = env("recursive_doubling")

CASES = [("float32", "SUM"), ("float64", "AVG"), ("float16", "SUM"), ("float32", "MIN"),
         ("float64", "MAX"), ("float32", "PROD"), ("int32", "SUM"), ("int64", "AVG"),
         ("uint8", "BXOR"), ("int16", "BAND"), ("uint64", "BOR"), ("int8", "PROD")]
# Not one ufunc call: these stay on the general path (and must still be right).
GENERAL = [("bool", "SUM"), ("int32", "LAND"), ("complex64", "SUM")]


@pytest.fixture(scope="module", params=[(2, "shm", a) for a in ALGOS] + [(4, "shm", a) for a in ALGOS]
                + [(2, "tcp", a) for a in ALGOS], ids=lambda p: f"{p[1]}{p[0]}-{p[2][:3]}")
def world(request):
    n, transport, algo = request.param
    with World(n, transport=transport, env=env(algo), timeout=120) as w:
        w.algo = algo
        yield w


def planned_cases(algo):
    # Rabenseifner's plan needs the reduction's C loop (combined as it lands):
    # float16 has one where the build has _Float16 (kernels/combine.h), else it
    # keeps the general path there
    from commrt.kernels._combine import HAVE_FLOAT16

    return [c for c in CASES if algo == "recursive_doubling" or c[0] != "float16"
            or HAVE_FLOAT16]


@pytest.mark.parametrize("dtype,op", CASES + GENERAL)
@pytest.mark.parametrize("n", [0, 1, 6, 1000])
def test_results_exact_and_bitwise_equal(world, dtype, op, n):
    res = world.run(S.repeated, 11, n, dtype, op)
    digests = [r[0] for r in res]
    assert all(d == digests[0] for d in digests), "ranks disagree bitwise"
    planned = all(r[1] for r in res)
    assert planned == ((dtype, op) in planned_cases(world.algo)), (dtype, op, res)


@pytest.mark.parametrize("dtype,op,n", [("float32", "SUM", 300_001), ("float64", "MAX", 70_000),
                                        ("int32", "AVG", 1_000_003)])
def test_large_buffers_planned(world, dtype, op, n):
    """Sizes whose halves stream through the ring or are read by CMA."""
    res = world.run(S.repeated, 3, n, dtype, op, 2)
    assert len({tuple(r[0]) for r in res}) == 1 and all(r[1] for r in res), res


def test_plan_memo_never_serves_another_call(world):
    for out in world.run(S.memo_switches):
        assert all(out), out


def test_ranks_on_the_general_path_interoperate(world):
    res = world.run(S.repeated, 5, 7, "float64", "SUM", 4, (0,))
    assert len({tuple(r[0]) for r in res}) == 1


def test_late_rank_hands_the_call_to_the_general_path(world):
    """A rank that comes after the probe interval: the others' plans stop at the
    unanswered step and finish it (and the rest) on the general path."""
    res = world.run(S.late_rank, 0.8, 5000)
    assert len({r[0] for r in res}) == 1 and all(r[1] for r in res), res


def test_only_small_plans_keep_their_last_buffer(world):
    """Rabenseifner's plan (large buffers) lets go of the caller's buffer after
    each call; recursive doubling's (tiny ones) keeps it bound, saving the
    rebinding on every call."""
    released = world.run(S.buffer_released, 5000)
    assert released == [world.algo == "rabenseifner"] * world.size, released


def test_traffic_is_the_algorithms(world):
    res = world.run(S.traffic, 256)
    steps = (world.size - 1).bit_length()
    want = steps * 256 * 4 if world.algo == "recursive_doubling" else \
        2 * (world.size - 1) * 256 * 4 // world.size
    for sent, plans in res:
        assert sent == want and plans > 0, res


@pytest.mark.parametrize("case", ["op", "count", "kind"])
def test_mismatch_raises_on_every_rank(world, case):
    res = world.run(S.mismatch, case, timeout=60)
    for r, (where, msg, elapsed) in enumerate(res):
        assert where == "raised", (r, case, res)
        assert "mismatch" in msg, (r, msg, elapsed)   # raised, not timed out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_peer_fails_the_others_fast(transport, tmp_path):
    with World(4, transport=transport, env=ENV, timeout=60) as w:
        with pytest.raises(WorldError, match="rank 3"):
            w.run(S.dead_peer, str(tmp_path), timeout=30)
        # the world reports rank 3's death at once; the survivors write their
        # reports as they see it (closing the world would stop them)
        until = time.monotonic() + 30
        while not all((tmp_path / f"{r}.json").exists() for r in (0, 1, 2)) \
                and time.monotonic() < until:
            time.sleep(0.05)
    for r in (0, 1, 2):
        err, elapsed, plans = json.loads((tmp_path / f"{r}.json").read_text())
        # PeerLostError within the world's 30 s (the call's own deadline is
        # COMMRT_TIMEOUT, 300 s): the fault path, not a timeout, ended it
        assert err is not None and "rank 3" in err, (r, err)
        assert plans > 0, (r, plans)


def test_barrier_waits_for_the_last_rank(world):
    res = world.run(S.barrier_holds)
    for k in range(3):
        last_in = max(r[0][k][0] for r in res)
        assert all(r[0][k][1] >= last_in for r in res), (k, res)
    assert all(r[1] for r in res)


def test_barrier_against_all_reduce_is_a_mismatch(world):
    res = world.run(S.barrier_against_all_reduce, timeout=60)
    for r, (where, msg, elapsed) in enumerate(res):
        assert where == "raised" and "mismatch" in msg, (r, res)


def test_bad_arguments_get_clear_errors_and_send_nothing(world):
    res = world.run(S.bad_arguments)
    total = float(sum(range(world.size)))
    for errors, y in res:
        assert errors[0].startswith("ValueError") and "unknown reduction" in errors[0], errors
        assert errors[1].startswith("ValueError") and "unknown reduction" in errors[1], errors
        assert "contiguous" in errors[2], errors
        assert "read-only" in errors[3], errors
        assert y == [total] * 3


def test_async_collectives_shorten_the_switch_interval():
    for env, want in (({}, 500e-6), ({"COMMRT_SWITCH_INTERVAL_US": "0"}, 0.005),
                      ({"COMMRT_SWITCH_INTERVAL_US": "2000"}, 2e-3)):
        with World(2, env=env, timeout=60) as w:
            for before, after in w.run(S.switch_interval):
                assert before == 0.005 and abs(after - want) < 1e-9, (env, before, after)


@pytest.mark.parametrize("dtype,op,n", [("float32", "SUM", 1000), ("float64", "AVG", 6),
                                        ("int32", "MAX", 25_578)])
def test_async_calls_run_their_plan_on_the_worker(world, dtype, op, n):
    res = world.run(S.async_planned, 5, n, dtype, op)
    digests = [r[0] for r in res]
    assert all(d == digests[0] for d in digests), "ranks disagree bitwise"
    for _, ran in res:
        assert ran >= 8, ran          # the 8 async calls (a blocking one may fall behind them)


def test_an_async_planned_mismatch_raises_on_every_rank(world):
    for where, msg in world.run(S.async_mismatch, timeout=60):
        assert where == "raised" and "mismatch" in msg, (where, msg)
