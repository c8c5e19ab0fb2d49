"""python -m commrt.bench torch end to end at a tiny size: commrt and gloo each run
a collective, the dispatch comparison and a DDP step, and the report ends with
the issue's targets (the figures themselves come from a quiet machine)."""
import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(400)
def test_bench_torch_runs_both_backends_and_prints_the_targets(tmp_path):
    out = subprocess.run([sys.executable, "-m", "commrt.bench", "torch", "--nranks", "2",
                          "--sizes", "8,1M", "--kinds", "all_reduce", "--models", "cnn",
                          "--rounds", "1", "--target-s", "0.01", "--ddp-target-s", "0.05",
                          "--timeout", "300", "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=360)
    assert out.returncode == 0, out.stdout + out.stderr
    # neither backend's job failed (a gloo rank ends with os._exit: _launch.end_gloo_rank)
    assert not re.search(r"^\s+(commrt|gloo) failed", out.stderr, re.M), out.stderr
    lines = out.stdout.splitlines()
    row = next(ln for ln in lines if ln.startswith("1 MiB"))
    assert "n/a" not in row, row                      # both backends, both bandwidths
    assert re.search(r"through torch [\d.]+ .*native commrt [\d.]+ .*do-nothing Python "
                     r"process group [\d.]+.*called straight from Python [\d.]+", out.stdout), \
        out.stdout
    cnn = next(ln for ln in lines if ln.startswith("cnn"))
    assert cnn.split()[1] == "25578" and "n/a" not in cnn, cnn
    targets = [ln for ln in lines if ln.startswith("  N=2 ")]
    assert len(targets) == 3, out.stdout             # 1 MiB busbw, 8 B dispatch, DDP cnn
    assert all(ln.endswith(": met") or ln.endswith(": NOT met") for ln in targets), targets
    data = json.loads((tmp_path / "b.json").read_text())
    assert {"commrt/all_reduce", "gloo/all_reduce", "commrt/native_all_reduce",
            "commrt/noop_dispatch", "commrt/dispatch_all_reduce", "commrt/backend_all_reduce",
            "commrt/ddp_cnn", "gloo/ddp_cnn"} <= set(data["2"]), data
