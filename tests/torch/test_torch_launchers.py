"""An unmodified DDP script on "commrt" under torchrun and under commrt-launch reaches
the parameters the same script reaches on gloo (commrt-launch also exports
MASTER_ADDR/MASTER_PORT, so env:// works there for gloo too)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_script.py")


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMMRT_RANK", "COMMRT_WORLD", "COMMRT_STORE", "COMMRT_SECRET",
                                "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def launch(launcher, n, backend, out):
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", SCRIPT, backend, out]
    else:
        cmd = [shutil.which("commrt-launch") or "commrt-launch", "-n", str(n), sys.executable,
               SCRIPT, backend, out]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = np.load(out)
    assert str(got["backend"]) == backend and int(got["size"]) == n
    return [got[f"arr_{i}"] for i in range(4)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher,n", [("torchrun", 2), ("commrt-launch", 3),
                                        ("torchrun", 4)])
def test_ddp_script_matches_gloo(launcher, n, tmp_path):
    ours = launch(launcher, n, "commrt", str(tmp_path / "commrt.npz"))
    gloo = launch(launcher, n, "gloo", str(tmp_path / "gloo.npz"))
    for p, q in zip(ours, gloo):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
