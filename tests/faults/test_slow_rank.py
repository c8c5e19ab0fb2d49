"""A slow rank is not a dead one: a rank that sleeps inside a collective, longer than
the liveness bound, under commrt-launch, shared memory and TCP."""
import pytest

from harness import LIVENESS, LIVENESS_S, assert_no_leak_in_survivors, run_job

TRANSPORTS = ("shm", "tcp")
SLEEP_S = 2 * LIVENESS_S + 1.0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rank_sleeping_inside_a_collective_is_not_blamed(transport, rng, seed, tmp_path,
                                                          private_tmp, figure):
    """A rank that sleeps SLEEP_S (over twice the liveness bound, harness.LIVENESS_S)
    between two messages
    of a collective is slow, not dead: every rank finishes the stream with
    correct results and the job succeeds."""
    n = rng.randint(2, 6)
    culprit, at = rng.randrange(n), rng.randint(1, 60)
    job = run_job(tmp_path, n, transport, seed=seed, culprit=culprit, fault="slow", where="call",
                  at=at, sleep=SLEEP_S, ops=150, timeout=100,
                  env={"COMMRT_TIMEOUT": "60", **LIVENESS})
    info = job.describe()
    assert job.fault is not None, f"the slow rank never reached call {at}\n{info}"
    assert job.returncode == 0, info
    assert all(rec and rec["status"] == "ok" for rec in job.records.values()), info
    assert job.summary == [], info
    figure("slow", transport=transport, n=n, slept=SLEEP_S,
           blamed=[r for r, rec in job.records.items() if rec["status"] != "ok"])
    assert_no_leak_in_survivors(job, -1)
