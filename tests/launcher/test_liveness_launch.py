"""The launcher names a rank that stopped running (SIGSTOP) as the job's cause,
never a rank that merely timed out or lost it."""
import signal
import time

import pytest

from launch_helpers import assert_no_orphans, clean_env, launch

STOPS_ITSELF = """
    import signal
    import commrt
    from commrt.errors import CommError
    record_pid()
    comm = commrt.init()
    comm.barrier()
    if RANK == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    {survivor}
    """

RAISES = "comm.recv(bytearray(8), 2, 5, timeout=120)   # never comes: rank 2 is stopped"
CATCHES = """try:
        comm.recv(bytearray(8), 2, 5, timeout=120)
    except CommError as exc:
        print("caught", type(exc).__name__, file=sys.stderr, flush=True)
    time.sleep(60)"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_stopped_rank_is_the_cause_not_the_ranks_that_lost_it(script, transport):
    prog = script(STOPS_ITSELF.format(survivor=RAISES))
    start = time.monotonic()
    out = launch(["-n", "3", prog], timeout=100, env=clean_env(COMMRT_TRANSPORT=transport))
    took = time.monotonic() - start
    assert out.returncode == 128 + signal.SIGSTOP, out.stderr
    assert "rank 2 (pid" in out.stderr and "was stopped" in out.stderr, out.stderr
    summary = [line for line in out.stderr.splitlines() if "commrt-launch: rank " in line]
    assert summary and summary[0].startswith("commrt-launch: rank 2 "), summary
    assert took < 60, took
    assert_no_orphans(script.pid_dir)


@pytest.mark.timeout(120)
def test_launcher_watches_a_stopped_rank_itself(script):
    """The survivors catch their errors and carry on: the launcher still names
    the stopped rank, from its process state, after the liveness timeout."""
    prog = script(STOPS_ITSELF.format(survivor=CATCHES))
    out = launch(["-n", "3", prog], timeout=100, env=clean_env(COMMRT_LIVENESS_TIMEOUT_S="3"))
    assert out.returncode == 128 + signal.SIGSTOP, out.stderr
    assert "rank 2 (pid" in out.stderr and "was stopped (SIGSTOP or a frozen process) for" \
        in out.stderr, out.stderr
    assert "caught PeerUnresponsiveError" in out.stderr
    assert_no_orphans(script.pid_dir)
