"""Helpers of the multi-host tests."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = [sys.executable, "-m", "commrt.launcher"]


def require(missing, what):
    """Skip (naming what is missing) where something this test needs is absent;
    under CI (CI set, as .ci/run sets it, which installs everything) fail."""
    if not missing:
        return
    msg = f"{what} needs: {', '.join(missing)}"
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI installs these: .ci/run)")
    pytest.skip(msg)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMMRT_", "OMPI_", "PMIX_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(cmd, timeout, env=None, **kw):
    """cmd to its end under a deadline: a CompletedProcess with text output."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), **kw)


def ok_lines(out):
    """The ranks' "ok RANK ..." lines, from "ok" on (without a launcher's "[R] " or
    mpirun's colour codes before it), in rank order."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout)
    lines = [m.group(1) for m in re.finditer(r"(?m)(?:^|\] )(ok \d+\b.*)", text)]
    return sorted(lines, key=lambda line: int(line.split()[1]))
