"""Whole jobs that use commrt.init(): under commrt-launch and under the real
OpenMPI mpirun (commrt bootstraps from mpirun's environment)."""
import os
import shutil
import subprocess
import sys

import pytest

from launch_helpers import assert_no_orphans, clean_env, launch

RING = """
import os
import numpy as np
import commrt
comm = commrt.init()
r, n = comm.rank, comm.size
out, got = np.full(257, r, dtype=np.float64), np.empty(257, dtype=np.float64)
if r % 2 == 0:
    comm.send(out, (r + 1) % n)
    comm.recv(got, (r - 1) % n)
else:
    comm.recv(got, (r - 1) % n)
    comm.send(out, (r + 1) % n)
assert (got == (r - 1) % n).all(), got[:4]
os.write(1, f"ring ok {r} {n}\\n".encode())  # one write: mpirun forwards output unbuffered
comm.close()
"""


def test_ring_of_eight(script, shm_snapshot):
    prog = script("record_pid()\n" + RING)
    out = launch(["-n", "8", prog], env=clean_env(COMMRT_TIMEOUT="30"), timeout=90)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == sorted(f"[{r}] ring ok {r} 8" for r in range(8))
    assert_no_orphans(script.pid_dir)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_real_mpirun_job(tmp_path, shm_snapshot):
    prog = tmp_path / "ring.py"
    prog.write_text(RING)
    rdv = tmp_path / "rdv"
    env = clean_env(COMMRT_TIMEOUT="30", COMMRT_RENDEZVOUS_DIR=str(rdv))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", sys.executable,
           str(prog)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(4):  # substrings: mpirun may merge lines of different ranks
        assert out.stdout.count(f"ring ok {r} 4\n") == 1, out.stdout
    assert os.listdir(rdv) == []  # the published secret is gone
