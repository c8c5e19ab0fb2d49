"""The data-parallel benchmark's plumbing: the rate-limited link between two
network namespaces runs a real two-rank job and cleans up after itself, and
the report copes with a missing PyTorch figure.  No timing is asserted."""
import os
import shutil
import subprocess
import sys

import pytest

from commrt.bench import dp

pytestmark = pytest.mark.netns  # tests/conftest.py: such tests run one at a time


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


@pytest.mark.timeout(180)
def test_link_benchmark_runs_across_two_namespaces_and_removes_them():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("the link needs root and iproute2")
    before = _namespaces()
    out = subprocess.run(
        [sys.executable, "-m", "commrt.bench", "dp", "--link", "200mbit", "--rounds", "1",
         "--steps", "2", "--models", "lenet", "--bucket-kb", "64",
         "--link-variant", "COMMRT_SPIN_MAX_US=50"],
        capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tbf rate 200mbit" in out.stdout
    assert "overlap/no" in out.stdout and "ranks with COMMRT_SPIN_MAX_US=50" in out.stdout
    assert _namespaces() == before          # nothing left behind


def test_link_names_its_pieces_after_the_process():
    link = dp.Link("100mbit", mtu=1500)
    assert link.burst == f"{32 * 1024}b" and all(str(os.getpid() % 100000) in n for n in link.ns)
    assert "rate 100mbit" in link.describe() and "MTU 1500" in link.describe()


def test_report_skips_rounds_without_a_pytorch_figure():
    ms = 1e-3
    results = {("lenet", 2, "overlap"): [6 * ms, 7 * ms],
               ("lenet", 2, "no overlap"): [6 * ms, 7 * ms],
               ("lenet", 2, "torch DDP"): [None, 10 * ms],
               ("lenet", 1, "overlap"): [5 * ms, 5 * ms],
               ("lenet", 1, "torch DDP"): [None, None]}
    text = dp.report(results, {"lenet": 0.2}, sizes=(2,))
    assert "0.700" in text                  # commrt/DDP from the one round that has both
    assert "weak scaling efficiency at N=2 (t1/t2, same per-rank batch): 0.774" in text
    assert "the same for PyTorch DDP: n/a" in text
