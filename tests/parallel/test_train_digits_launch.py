"""The README's first command: commrt-launch -n 4 examples/train_digits.py trains
data parallel to >= 97% and ends with its one-line summary."""
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["dp", "async"])
def test_four_ranks_reach_97_percent(mode):
    proc = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "4", str(EXAMPLE),
                           "--no-progress", "--mode", mode],
                          capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "test accuracy" in ln]
    assert len(lines) == 1 and lines[0].startswith("[0] "), proc.stdout   # rank 0 only
    assert "images/s" in lines[0] and f"4 ranks, {mode}" in lines[0]
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", lines[0]).group(1))
    assert accuracy >= 97.0, lines[0]
