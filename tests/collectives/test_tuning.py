"""The measured choice of large calls (collectives/tuning.py): real worlds, the
algorithms slowed on purpose where a test needs a known winner."""
import json
import time

import numpy as np
import pytest

from commrt.collectives import cost, registry, tuning
from commrt.collectives.state import state_of
from commrt.errors import CollectiveMismatchError
from commrt.testing import World

# Measured winners: alone, with no other test beside them (tests/conftest.py).
pytestmark = [pytest.mark.timeout(180), pytest.mark.alone]

MIN = 64 << 10                  # COMMRT_TUNE_MIN_BYTES in these worlds: cheap trials
ENV = {"COMMRT_TUNE_MIN_BYTES": str(MIN), "COMMRT_COLL_PROBE_S": "0.3"}
NBYTES = 256 << 10
SLOW_S = 0.02                   # what a slowed algorithm sleeps per run


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    env = dict(ENV, COMMRT_COST_CACHE=str(tmp_path_factory.mktemp("cost") / "cost.json"))
    with World(2, transport="shm", env=env, timeout=120) as w:
        yield w


def test_decide_keeps_the_models_pick_unless_another_is_clearly_faster():
    assert tuning.decide({"a": 1.04, "b": 1.0}, "a") == "a"
    assert tuning.decide({"a": 1.06, "b": 1.0}, "a") == "b"
    assert tuning.decide({"a": 1.0, "b": 2.0, "c": 0.5}, "b") == "c"


def test_candidates_are_the_plausible_ones_within_the_budget():
    pred = {"a": 1e-3, "b": 2e-3, "c": 2.4e-3, "d": 3e-3}
    assert tuning.candidates(pred, "a") == ["a", "b", "c"]        # d: beyond SPREAD
    big = {"a": 0.1, "b": 0.12, "c": 0.2}                        # 2 x 0.42 s > BUDGET_S
    assert tuning.candidates(big, "b") == ["a", "b"]             # the slowest dropped
    assert tuning.candidates({"a": 1.0, "b": 1.0}, "a") == ["a", "b"]  # never fewer than 2


def _slowed(comm, collective, nbytes=NBYTES, winner_s=0.0, slow_s=SLOW_S):
    """Every trial run of a candidate of a call of nbytes but one the model did
    not pick (the winner) sleeps slow_s first, and every run winner_s more:
    (the model's pick, the winner, how many candidates, the list each trial run
    is appended to)."""
    pred = cost.predict(collective, comm, nbytes)
    model = cost.cheapest(pred)
    cands = tuning.candidates(pred, model)
    winner = next(a for a in reversed(cands) if a != model)
    runs = []
    real = tuning._TRIALS[collective]

    def trial(comm, nbytes):
        made = real(comm, nbytes)

        def run(comm, algo):
            runs.append(algo)
            time.sleep(winner_s + (slow_s if algo != winner else 0.0))
            made(comm, algo)
        return run
    tuning._TRIALS[collective] = trial
    trial.real = real
    return model, winner, len(cands), runs


def _restore(collective):
    tuning._TRIALS[collective] = getattr(tuning._TRIALS[collective], "real",
                                         tuning._TRIALS[collective])


def _measured_all_reduce(comm, nbytes):
    model, winner, ncands, runs = _slowed(comm, "all_reduce")
    try:
        seq = state_of(comm).seq
        buf = np.full(nbytes // 4, comm.rank + 1, np.float32)
        comm.all_reduce(buf)
        assert (buf == 3).all()
        took_seq = state_of(comm).seq - seq
        trial_runs = len(runs)
        again = np.ones((nbytes + (16 << 10)) // 4, np.float32)   # the same size class
        comm.all_reduce(again)
        assert (again == 2).all()
        return (model, winner, cost.choices("all_reduce", comm),
                tuning.tuned("all_reduce", comm), took_seq, ncands, trial_runs, len(runs))
    finally:
        _restore("all_reduce")


def test_the_measured_fastest_wins_over_the_models_pick_on_every_rank(world):
    """All candidates but one the model ranks lower are slowed: every rank picks
    that one, the user's call takes one sequence number, and a second size of
    the same class runs it without measuring again."""
    out = world.run(_measured_all_reduce, NBYTES)
    (model, winner, choices, tuned, took_seq, ncands, trials, after), other = out
    assert winner != model and ncands >= 2
    assert choices[NBYTES] == winner and tuned == {tuning.size_class(NBYTES): winner}
    assert other[2] == choices and other[3] == tuned          # the same on both ranks
    assert took_seq == 1                   # the tune call took no number of its own
    # warm-up and first round run every candidate, the winner the rounds after;
    # the second size measured nothing
    assert 2 * ncands + tuning.TIMED_ROUNDS - 2 <= trials and after == trials


def _below_the_threshold(comm):
    _, _, _, runs = _slowed(comm, "all_reduce")
    try:
        before = tuning.tuned("all_reduce", comm)
        comm.all_reduce(np.ones((MIN - 4) // 4, np.float32))
        return len(runs), tuning.tuned("all_reduce", comm) == before
    finally:
        _restore("all_reduce")


def test_a_call_below_the_threshold_is_the_models(world):
    assert world.run(_below_the_threshold) == [(0, True), (0, True)]


def _each_collective(comm):
    """Every tunable collective at NBYTES (its reference size) with known values:
    {collective: (what it measured, whether it had more than one candidate)}."""
    n, r = comm.size, comm.rank
    block = NBYTES // 4 // n
    got = {}
    buf = np.full(NBYTES // 4, r + 1, np.float32)
    comm.broadcast(buf, root=1)
    assert (buf == 2).all()
    buf = np.full(NBYTES // 4, r + 1, np.float32)
    comm.reduce(buf, root=0)
    assert r != 0 or (buf == 3).all()
    out = np.zeros(block * n, np.float32)
    comm.all_gather(out, np.full(block, r + 1, np.float32))
    assert (out.reshape(n, block) == np.arange(1, n + 1, dtype=np.float32)[:, None]).all()
    small = np.zeros(block, np.float32)
    comm.reduce_scatter(small, np.full(block * n, r + 1, np.float32))
    assert (small == 3).all()
    for kind in tuning._TRIALS:
        pred = cost.predict(kind, comm, NBYTES)
        got[kind] = (tuning.tuned(kind, comm),
                     len(tuning.candidates(pred, cost.cheapest(pred))) > 1)
    return got


def test_every_tunable_collective_measures_and_stays_correct(world):
    a, b = world.run(_each_collective)
    assert a == b
    for kind, (tuned, choice) in a.items():
        if choice:                              # more than one plausible candidate
            assert set(tuned) == {tuning.size_class(NBYTES)}, kind
            assert tuned[tuning.size_class(NBYTES)] in registry.names(kind)


def _off(comm):
    _, _, _, runs = _slowed(comm, "all_reduce")
    try:
        comm.all_reduce(np.ones((4 * NBYTES) // 4, np.float32))
        pred = cost.predict("all_reduce", comm, 4 * NBYTES)
        return len(runs), cost.choices("all_reduce", comm)[4 * NBYTES] == cost.cheapest(pred)
    finally:
        _restore("all_reduce")


def test_tuning_off_leaves_the_choice_to_the_model(tmp_path):
    env = dict(ENV, COMMRT_TUNE="0", COMMRT_COST_CACHE=str(tmp_path / "cost.json"))
    with World(2, transport="shm", env=env, timeout=120) as w:
        assert w.run(_off) == [(0, True), (0, True)]


def _mismatched(comm):
    """Rank 0 calls a size that is measured, rank 1 one that is not: both fail
    with a mismatch naming the user's all_reduce, nobody hangs."""
    nbytes = 2 * NBYTES if comm.rank == 0 else MIN // 2
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(nbytes // 4, np.float32), timeout=20)
    except CollectiveMismatchError as exc:
        return str(exc), time.monotonic() - t0, " ".join(getattr(exc, "__notes__", []))
    return None, time.monotonic() - t0, ""


def test_a_mismatch_between_a_measured_and_a_plain_call_is_named(tmp_path):
    env = dict(ENV, COMMRT_COST_CACHE=str(tmp_path / "cost.json"))
    with World(2, transport="shm", env=env, timeout=120) as w:
        res = w.run(_mismatched)
        assert "while timing the algorithms of all_reduce #0" in res[0][2], res[0]
        for msg, took, _ in res:
            # the user's call named (this rank's own tune is "all_reduce #0 (its
            # tune: ...)", the other's "#0 tune(...)"), never the calibration
            assert msg is not None and ("#0 all_reduce(" in msg or "all_reduce #0" in msg), msg
            assert "mismatch" in msg and "calibrate" not in msg, msg
            assert took < 20


def test_a_winner_settles_once_two_measurements_agree():
    assert tuning.settles(["a"]) == ("a", False)
    assert tuning.settles(["a", "b"]) == ("b", False)
    assert tuning.settles(["b", "a", "a"]) == ("a", True)
    assert tuning.settles(["a", "b", "a", "c"]) == ("a", True)      # the most frequent
    assert tuning.settles(["a", "b", "a", "b"]) == ("b", True)      # ties: the latest
    assert tuning.settles(["a", "b", "c", "d"]) == ("d", False)     # all differ: measure on


def _winner_and_trials(comm, winner_s=0.0):
    model, winner, _, runs = _slowed(comm, "all_reduce", winner_s=winner_s)
    try:
        comm.all_reduce(np.ones(NBYTES // 4, np.float32))
        return cost.choices("all_reduce", comm)[NBYTES], winner, runs
    finally:
        _restore("all_reduce")


def test_later_jobs_check_a_settled_winner_before_taking_it(tmp_path):
    """Two jobs measure the same winner and it settles.  The third runs only it
    (untimed, then CHECK_RUNS timed runs) and takes it.  A fourth, whose record says it
    ran 10x faster than it does now (the host changed state), measures every
    candidate again.  Every run sleeps 30 ms, so the winner's speed is steady against
    RECHECK (a few ms of a noisy host's scheduling are a small part of it)."""
    path = tmp_path / "cost.json"
    env = dict(ENV, COMMRT_COST_CACHE=str(path))
    for job in range(4):
        if job == 3:
            data = json.loads(path.read_text())
            for entry in (v for k, v in data.items() if k.startswith("tuned:")):
                for slot in (v for v in entry.values() if isinstance(v, dict)):
                    slot["took"] = [s / 10 for s in slot["took"]]
            path.write_text(json.dumps(data))
        with World(2, transport="shm", env=env, timeout=120) as w:
            (chose, winner, runs), other = w.run(_winner_and_trials, 0.03)
        assert chose == winner and other[0] == chose, job
        if job == 2:
            assert runs == [winner] * (1 + tuning.CHECK_RUNS * tuning.BACK_TO_BACK), runs
        else:
            assert len(set(runs)) > 1, (job, runs)
    slot = next(v for k, v in json.loads(path.read_text()).items()
                if k.startswith("tuned:"))[f"all_reduce:{tuning.size_class(NBYTES)}"]
    assert slot["settled"] and slot["seen"] == [winner] * 3 and len(slot["took"]) == 3


def _behind_an_async_call(comm):
    """A measured call issued while an async one is still queued: the trials wait
    their turn behind it (call order), and both results are right."""
    small = np.full(1 << 10, comm.rank + 1, np.float32)
    req = comm.all_reduce(small, async_op=True)
    big = np.full((2 * NBYTES) // 4, comm.rank + 1, np.float32)
    comm.all_reduce(big)
    req.wait(30)
    return bool((small == 3).all() and (big == 3).all()), state_of(comm).seq


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_measured_call_behind_an_async_one_and_on_tcp(tmp_path, transport):
    env = dict(ENV, COMMRT_COST_CACHE=str(tmp_path / "cost.json"))
    with World(2, transport=transport, env=env, timeout=120) as w:
        assert w.run(_behind_an_async_call) == [(True, 2), (True, 2)]
        (chose, winner, _), other = w.run(_winner_and_trials)
        assert chose == winner and other[0] == winner


def _one_round(comm):
    """With no time to spend, the first timed round decides (the slowed
    candidates lose it by SLOW_S)."""
    model, winner, ncands, runs = _slowed(comm, "all_reduce", 8 * NBYTES)
    spent, tuning.SPENT_S = tuning.SPENT_S, 0.0
    try:
        comm.all_reduce(np.ones((8 * NBYTES) // 4, np.float32))
        return cost.choices("all_reduce", comm)[8 * NBYTES] == winner, ncands, len(runs)
    finally:
        tuning.SPENT_S = spent
        _restore("all_reduce")


def test_slow_trials_stop_after_one_timed_round(world):
    for ok, ncands, trials in world.run(_one_round):
        assert ok and trials == (1 + tuning.BACK_TO_BACK) * ncands


def _with_a_deadline(comm, timeouts, nbytes):
    """A first call of a class whose timeout (on one rank or all) leaves under
    ROOM_S runs the model's pick and measures nothing; that size keeps it, and
    the next call of another size of the class, with no timeout, measures.  The
    losers sleep 0.1 s: one timed round may decide (SPENT_S), and a stall of the
    winner's run as long as SLOW_S, seen once in a suite on a loaded 2-core
    machine, made the model's slowed pick stand."""
    model, winner, _, runs = _slowed(comm, "all_reduce", nbytes, slow_s=0.1)
    try:
        buf = np.full(nbytes // 4, comm.rank + 1, np.float32)
        comm.all_reduce(buf, timeout=timeouts[comm.rank])
        cls = tuning.size_class(nbytes)
        first = (bool((buf == 3).all()), len(runs), tuning.tuned("all_reduce", comm).get(cls))
        comm.all_reduce(np.ones(nbytes // 4, np.float32))              # the same size
        again = len(runs)
        comm.all_reduce(np.ones((nbytes + (16 << 10)) // 4, np.float32))
        return (first, again, cost.choices("all_reduce", comm)[nbytes] == model, winner,
                tuning.tuned("all_reduce", comm).get(cls), len(runs))
    finally:
        _restore("all_reduce")


# sizes of classes no other test of the module's world measures
@pytest.mark.parametrize("timeouts, nbytes", [((5.0, 5.0), 2 * NBYTES),
                                              ((None, 5.0), 4 * NBYTES)],
                         ids=["every rank", "one rank"])
def test_a_call_whose_deadline_leaves_no_room_is_not_measured(world, timeouts, nbytes):
    assert max(t or 0 for t in timeouts) < tuning.ROOM_S
    for first, again, models, winner, tuned, trials in world.run(_with_a_deadline, timeouts,
                                                                   nbytes):
        assert first == (True, 0, None) and again == 0 and models, (first, again, models)
        assert tuned == winner and trials > 0
