"""The README's first command: commrt-launch -n 4 examples/train_digits.py trains
data parallel to >= 97% and ends with its one-line summary."""
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


def _train(mode):
    """One run of the example on 4 ranks -> (accuracy %, its summary line)."""
    proc = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "4", str(EXAMPLE),
                           "--no-progress", "--mode", mode],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "test accuracy" in ln]
    assert len(lines) == 1 and lines[0].startswith("[0] "), proc.stdout   # rank 0 only
    assert "images/s" in lines[0] and f"4 ranks, {mode}" in lines[0]
    return float(re.search(r"test accuracy ([\d.]+)%", lines[0]).group(1)), lines[0]


@pytest.mark.timeout(330)
# async under the launcher is long (COMMRT_LONG_TESTS): async SGD trains in test_param_server.py
@pytest.mark.parametrize("mode", ["dp", pytest.param("async", marks=pytest.mark.long)])
def test_four_ranks_reach_97_percent(mode):
    accuracy, line = _train(mode)
    if mode == "async" and accuracy < 97.0:
        # Async SGD's result depends on the order the scheduler lets pushes
        # arrive in: the same seed ends at 96.7-98.9% (docs/parallel.md; the
        # test set is 359 images, one is 0.28%).  A second, independent run
        # must then reach the target itself: a real run at >= 97% either way.
        accuracy, line = _train(mode)
    assert accuracy >= 97.0, line
