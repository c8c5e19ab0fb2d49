"""An unmodified DDP script on "commrt" under torchrun and under commrt-launch
reaches the parameters the same script reaches on gloo from the same seeds, on
every rank (commrt-launch also exports MASTER_ADDR/MASTER_PORT, so env:// works
there for gloo too).  Every N of 2, 3, 4 runs once, under one launcher or the
other, N = 3 only with COMMRT_LONG_TESTS=1 (CASES: the full product took 47 s of
the default suite, and what a launcher changes, the environment the script
starts in, does not depend on N; tests/scale runs torchrun across namespace
hosts too).  gloo runs once per
N, under the same launcher: its result does not depend on the launcher."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_script.py")
# N = 3 is long (COMMRT_LONG_TESTS): the default suite runs N = 2 and 4, one under each launcher
CASES = [("torchrun", 2), pytest.param("commrt-launch", 3, marks=pytest.mark.long),
         ("commrt-launch", 4)]


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMMRT_RANK", "COMMRT_WORLD", "COMMRT_STORE", "COMMRT_SECRET",
                                "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def launch(launcher, n, backend, out):
    """Every rank's parameters after the script's steps: [rank][param] arrays."""
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", SCRIPT, backend, out]
    else:
        cmd = [shutil.which("commrt-launch") or "commrt-launch", "-n", str(n), sys.executable,
               SCRIPT, backend, out]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root, ext = out.rsplit(".", 1)
    ranks = []
    for rank in range(n):
        got = np.load(f"{root}.{rank}.{ext}")
        assert str(got["backend"]) == backend and int(got["size"]) == n
        ranks.append([got[f"arr_{i}"] for i in range(4)])
    return ranks


@pytest.fixture(scope="module")
def gloo_params(tmp_path_factory):
    """gloo's parameters at N, computed once per N (under the first launcher asking)."""
    cache = {}

    def get(launcher, n):
        if n not in cache:
            out = str(tmp_path_factory.mktemp(f"gloo{n}") / "gloo.npz")
            cache[n] = launch(launcher, n, "gloo", out)[0]
        return cache[n]
    return get


@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher,n", CASES)
def test_ddp_script_matches_gloo(launcher, n, tmp_path, gloo_params):
    ours = launch(launcher, n, "commrt", str(tmp_path / "commrt.npz"))
    gloo = gloo_params(launcher, n)
    for rank, params in enumerate(ours):
        for p, q in zip(params, gloo):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{launcher}, N={n}, rank {rank} against gloo")
