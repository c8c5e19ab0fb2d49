"""The small all-reduce path (collectives/_small.py): same results, traffic,
mismatch reports and failures as the general recursive doubling it shortcuts.

The worlds force recursive doubling (COMMRT_ALLREDUCE_ALGO), so the path is
taken whatever the cost model would pick on a loaded machine."""
import json

import pytest

import small_ranks as S
from commrt.testing import World, WorldError

ENV = {"COMMRT_ALLREDUCE_ALGO": "recursive_doubling", "COMMRT_COLL_PROBE_S": "0.5"}

CASES = [("float32", "SUM"), ("float64", "AVG"), ("float16", "SUM"), ("float32", "MIN"),
         ("float64", "MAX"), ("float32", "PROD"), ("int32", "SUM"), ("int64", "AVG"),
         ("uint8", "BXOR"), ("int16", "BAND"), ("uint64", "BOR"), ("int8", "PROD")]
# Not one ufunc call: these stay on the general path (and must still be right).
GENERAL = [("bool", "SUM"), ("int32", "LAND"), ("complex64", "SUM")]


@pytest.fixture(scope="module", params=[(2, "shm"), (4, "shm"), (2, "tcp")],
                ids=lambda p: f"{p[1]}{p[0]}")
def world(request):
    n, transport = request.param
    with World(n, transport=transport, env=ENV, timeout=120) as w:
        yield w


@pytest.mark.parametrize("dtype,op", CASES + GENERAL)
@pytest.mark.parametrize("n", [0, 1, 6, 1000])
def test_results_exact_and_bitwise_equal(world, dtype, op, n):
    res = world.run(S.repeated, 11, n, dtype, op)
    digests = [r[0] for r in res]
    assert all(d == digests[0] for d in digests), "ranks disagree bitwise"
    planned = all(r[1] for r in res)
    assert planned == ((dtype, op) in CASES), (dtype, op, res)


def test_ranks_on_the_general_path_interoperate(world):
    res = world.run(S.repeated, 5, 7, "float64", "SUM", 4, (0,))
    assert len({tuple(r[0]) for r in res}) == 1


def test_traffic_is_recursive_doublings(world):
    res = world.run(S.traffic, 256)
    steps = (world.size - 1).bit_length()
    for sent, plans in res:
        assert sent == steps * 256 * 4 and plans > 0, res


@pytest.mark.parametrize("case", ["op", "count", "kind"])
def test_mismatch_raises_on_every_rank(world, case):
    res = world.run(S.mismatch, case, timeout=60)
    for r, (where, msg, elapsed) in enumerate(res):
        assert where == "raised", (r, case, res)
        assert "mismatch" in msg and elapsed < 20, (r, msg, elapsed)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_peer_fails_the_others_fast(transport, tmp_path):
    with World(4, transport=transport, env=ENV, timeout=60) as w:
        with pytest.raises(WorldError, match="rank 3"):
            w.run(S.dead_peer, str(tmp_path), timeout=30)
    for r in (0, 1, 2):
        err, elapsed, plans = json.loads((tmp_path / f"{r}.json").read_text())
        assert err is not None and "rank 3" in err, (r, err)
        assert elapsed < 2.5 and plans > 0, (r, elapsed, plans)


def test_barrier_waits_for_the_last_rank(world):
    res = world.run(S.barrier_holds)
    for k in range(3):
        last_in = max(r[0][k][0] for r in res)
        assert all(r[0][k][1] >= last_in for r in res), (k, res)
    assert all(r[1] for r in res)


def test_barrier_against_all_reduce_is_a_mismatch(world):
    res = world.run(S.barrier_against_all_reduce, timeout=60)
    for r, (where, msg, elapsed) in enumerate(res):
        assert where == "raised" and "mismatch" in msg and elapsed < 20, (r, res)


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
