"""Helpers of the launcher tests: run commrt-launch under a deadline, write
rank programs, and prove that no rank process outlived its job."""
import os
import subprocess
import sys
import time


LAUNCH = [sys.executable, "-m", "commrt.launcher"]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("COMMRT_", "OMPI_", "PMIX_", "SLURM_"))}
    env.update(extra)
    return env


def launch(args, timeout=60, env=None, cwd=None):
    """Run commrt-launch to its end; a CompletedProcess with text output."""
    return subprocess.run(LAUNCH + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), cwd=cwd)





def recorded_pids(pid_dir):
    return {int(p.name): int(p.read_text()) for p in pid_dir.iterdir() if p.read_text()}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def assert_no_orphans(pid_dir, within=2.0):
    pids = recorded_pids(pid_dir)
    end = time.monotonic() + within
    while time.monotonic() < end and any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    assert not [r for r, p in pids.items() if alive(p)], "rank processes outlived the job"


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
