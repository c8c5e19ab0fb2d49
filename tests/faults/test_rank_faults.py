"""Kill and stop one rank at a random point of a random stream of collectives,
under commrt-launch, N = 2..8, shared memory and TCP (a slow rank: test_slow_rank.py).

Each test asserts what every rank saw (the exception's class, the rank it
names, how soon) and that the launcher's exit code and summary name the
culprit; then that nothing is left behind (processes, /dev/shm, TMPDIR) and
that every survivor closed its communicator without leaking descriptors or
threads.  The random draws come from COMMRT_FAULT_SEED (see conftest.py).
"""
import signal

import pytest

from harness import TRANSPORTS, assert_culprit_named, assert_no_leak_in_survivors, draw, run_job

KILL_WITHIN_S = 5.0     # EOF on the dead rank's socket: milliseconds, plus a loaded host


@pytest.mark.xfail(strict=False, reason="open defect (issue 15): a survivor sometimes blames a rank that closed after seeing the death (cascade blame), seen shm and TCP in about 1 run in 10")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("trial", range(2))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_is_named_by_every_rank_and_the_launcher(transport, trial, rng, seed, tmp_path,
                                                         private_tmp):
    n, culprit, where, at = draw(rng, "kill")
    job = run_job(tmp_path, n, transport, seed=seed, culprit=culprit, fault="kill",
                  where=where, at=at, timeout=60, env={"COMMRT_TIMEOUT": "60"})
    print(f"SIGKILL {transport} N={n} rank {culprit} ({where} {at}): detected after "
          f"{job.detection(culprit)} s")
    assert_culprit_named(job, culprit, classes=("PeerLostError",), within=KILL_WITHIN_S)
    assert job.returncode == 128 + signal.SIGKILL, job.describe()
    assert "was killed by SIGKILL" in job.summary[0], job.describe()
    assert_no_leak_in_survivors(job, culprit)
