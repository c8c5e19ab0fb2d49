"""SIGSTOP of one rank at a random point of a random stream of collectives, under
commrt-launch, N = 2..8, shared memory and TCP: a stopped rank holds its sockets
open, only liveness tells it apart from a slow one (test_slow_rank.py)."""
import pytest
from harness import (LIVENESS, NAMED_WITHIN_S, TRANSPORTS, assert_culprit_named,
                     assert_no_leak_in_survivors, draw, run_job)



@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigstop_is_named_within_the_liveness_bound(transport, rng, seed, tmp_path, private_tmp,
                                                    figure):
    """A stopped rank holds its sockets open: only liveness tells it apart from a
    slow one.  COMMRT_TIMEOUT is far above the bound, so a timeout is a failure."""
    n, culprit, where, at = draw(rng, "stop")
    job = run_job(tmp_path, n, transport, seed=seed, culprit=culprit, fault="stop",
                  where=where, at=at, timeout=90, env={"COMMRT_TIMEOUT": "60", **LIVENESS},
                  grace=15)   # the stopped rank ignores SIGTERM: the job ends grace s after
    print(f"SIGSTOP {transport} N={n} rank {culprit} ({where} {at}): detected after "
          f"{job.detection(culprit)} s")
    figure("sigstop", transport=transport, n=n, detected=job.detection(culprit))
    assert_culprit_named(job, culprit, classes=("TransportError", "AbortedError"),
                         within=NAMED_WITHIN_S)
    for r, rec in job.survivors(culprit).items():
        assert "CommTimeoutError" not in rec["mro"], f"rank {r} timed out\n{job.describe()}"
    assert_no_leak_in_survivors(job, culprit)
