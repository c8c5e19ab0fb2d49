"""Failure propagation: a failed or killed rank, signals to the launcher,
--timeout, a rank that never connects.  Nothing may outlive a job."""
import os
import signal
import subprocess
import time

from launch_helpers import LAUNCH, alive, assert_no_orphans, clean_env, launch, wait_for

SLEEPERS = """
    record_pid()
    if RANK == {bad}:
        while len(os.listdir(PIDS)) < SIZE:  # fail only once everyone is up
            time.sleep(0.01)
        {action}
    time.sleep(60)
    """


def test_rank_that_raises_stops_the_job(script, shm_snapshot, tmp_path):
    failed_at = tmp_path / "failed_at"
    prog = script(SLEEPERS.format(bad=2, action=f'open({str(failed_at)!r}, "w").write(str(time.time())); '
                                                 'print("dying", file=sys.stderr); '
                                                 'raise RuntimeError("boom on rank 2")'))
    out = launch(["-n", "4", prog])
    assert time.time() - float(failed_at.read_text()) < 5  # the others stopped within 5 s
    assert out.returncode == 1
    assert "rank 2 (pid" in out.stderr and "exited with code 1; stopped 3 other rank(s)" in out.stderr
    assert "last lines of rank 2's stderr:" in out.stderr
    assert "commrt-launch:     RuntimeError: boom on rank 2" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_exit_code_is_propagated(script):
    prog = script(SLEEPERS.format(bad=1, action="sys.exit(7)"))
    out = launch(["-n", "3", prog])
    assert out.returncode == 7 and "rank 1" in out.stderr and "exited with code 7" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_rank_killed_by_sigkill(script):
    prog = script(SLEEPERS.format(bad=0, action="os.kill(os.getpid(), 9)"))
    start = time.monotonic()
    out = launch(["-n", "3", prog])
    assert time.monotonic() - start < 10
    assert out.returncode == 128 + 9
    assert "rank 0 (pid" in out.stderr and "was killed by SIGKILL (signal 9)" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_rank_ignoring_sigterm_is_killed_after_the_grace(script):
    prog = script("""
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record_pid()
        if RANK == 1:
            while len(os.listdir(PIDS)) < SIZE:
                time.sleep(0.01)
            sys.exit(3)
        time.sleep(60)
        """)
    start = time.monotonic()
    out = launch(["-n", "3", "--grace", "0.5", prog])
    assert out.returncode == 3
    assert time.monotonic() - start < 8
    assert_no_orphans(script.pid_dir)


def test_a_stopped_rank_gets_sigterm_at_once_not_sigkill_after_the_grace(script):
    """A rank stopped by SIGSTOP holds SIGTERM pending: the launcher follows it with
    SIGCONT (as a shell's kill does), so the rank's own SIGTERM handler runs when
    the job stops, long before --grace ends in SIGKILL."""
    prog = script("""
        import signal
        def on_term(*_):
            open(os.path.join(PIDS, f"term{RANK}"), "w").close()
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
        record_pid()
        while len([n for n in os.listdir(PIDS) if n.isdigit()]) < SIZE:
            time.sleep(0.01)
        if RANK == 2:
            os.kill(os.getpid(), signal.SIGSTOP)
        if RANK == 1:
            time.sleep(0.5)             # rank 2 is stopped by now
            sys.exit(3)
        time.sleep(60)
        """)
    start = time.monotonic()
    out = launch(["-n", "3", "--grace", "60", prog])
    assert out.returncode == 3, out.stderr
    assert (script.pid_dir / "term2").exists(), "the stopped rank never ran its SIGTERM handler"
    assert time.monotonic() - start < 30    # not the 60 s grace
    assert_no_orphans(script.pid_dir)


def test_children_of_ranks_are_cleaned_up(script):
    prog = script("""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with open(os.path.join(PIDS, f"child{RANK}"), "w") as f:
            f.write(str(child.pid))
        """)
    out = launch(["-n", "2", prog])
    assert out.returncode == 0, out.stderr
    children = [int((script.pid_dir / f"child{r}").read_text()) for r in (0, 1)]
    wait_for(lambda: not any(alive(p) for p in children), 3, "the ranks' children to die")


def signal_launcher(script, signum):
    prog = script("""
        record_pid()
        time.sleep(60)
        """)
    proc = subprocess.Popen(LAUNCH + ["-n", "3", prog], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    try:
        wait_for(lambda: len(os.listdir(script.pid_dir)) == 3, 15, "three ranks")
        start = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=15)
        return proc.returncode, err, time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_reaches_every_rank(script):
    code, err, elapsed = signal_launcher(script, signal.SIGINT)
    assert code == 130 and elapsed < 5
    assert "received SIGINT" in err
    assert_no_orphans(script.pid_dir)


def test_sigterm_reaches_every_rank(script):
    code, err, elapsed = signal_launcher(script, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM and elapsed < 5
    assert_no_orphans(script.pid_dir)


def test_sigkill_to_the_launcher_leaves_no_orphans(script):
    prog = script("""
        record_pid()
        time.sleep(60)
        """)
    proc = subprocess.Popen(LAUNCH + ["-n", "3", prog], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env())
    try:
        wait_for(lambda: len(os.listdir(script.pid_dir)) == 3, 15, "three ranks")
        wait_for(lambda: all(p.read_text() for p in script.pid_dir.iterdir()), 5, "pids")
    finally:
        proc.kill()
        proc.wait()
    assert_no_orphans(script.pid_dir, within=3)


def test_timeout_stops_the_whole_job(script):
    prog = script("""
        record_pid()
        time.sleep(60)
        """)
    start = time.monotonic()
    out = launch(["-n", "3", "--timeout", "1", prog])
    assert 0.9 < time.monotonic() - start < 8
    assert out.returncode == 124
    assert "the job ran past --timeout 1 s; stopped 3 rank(s)" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_successful_ranks_exiting_early_are_fine(script):
    prog = script("""
        time.sleep(0.3 * RANK)
        print("done", RANK)
        """)
    out = launch(["-n", "3", prog])
    assert out.returncode == 0 and out.stderr == ""
    assert len(out.stdout.splitlines()) == 3


def test_a_rank_that_never_connects_is_named(script, shm_snapshot):
    prog = script("""
        record_pid()
        if RANK == 2:
            time.sleep(60)  # never calls init
        import commrt
        comm = commrt.init()
        """)
    out = launch(["-n", "3", prog], env=clean_env(COMMRT_TIMEOUT="2"))
    assert out.returncode not in (0, None)
    assert "rank(s) that never connected to the store: 2" in out.stderr
    assert_no_orphans(script.pid_dir)


def test_failure_after_init_leaves_nothing_behind(script, shm_snapshot):
    prog = script("""
        import numpy as np
        import commrt
        comm = commrt.init()
        record_pid()
        buf = np.zeros(1 << 16)
        if RANK == 1:
            raise SystemExit(5)
        comm.recv(buf, 1)  # waits on the rank that dies
        """)
    start = time.monotonic()
    out = launch(["-n", "3", prog], env=clean_env(COMMRT_TIMEOUT="20"))
    assert time.monotonic() - start < 15
    assert out.returncode == 5, out.stderr
    assert "rank 1 (pid" in out.stderr
    assert_no_orphans(script.pid_dir)
