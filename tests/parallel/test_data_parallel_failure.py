"""A rank that dies mid-epoch stops a data-parallel job cleanly through the
launcher: the others do not hang, the job exits with the dead rank's code
and the launcher's summary names it."""
import pathlib
import subprocess
import sys
import time

SCRIPT = pathlib.Path(__file__).with_name("dying_rank.py")


def test_a_rank_dying_mid_epoch_stops_the_job():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "4", str(SCRIPT), "2", "5"],
                          capture_output=True, text=True, timeout=100)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    assert "[2] rank 2 dies at epoch 1 step 5" in out
    assert "[0] epoch 0 loss" in out                     # it was training before
    assert "finished" not in out                         # nobody ran on past the loss
    assert "rank 2" in proc.stderr and "exited with code 7" in proc.stderr, proc.stderr
    assert elapsed < 90
