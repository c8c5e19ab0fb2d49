"""torch's suite runs its CPU all-to-all tests (all_to_all, all_to_all_single with
equal and unequal splits, on the world, the full group and a part of it) for MPI
only; commrt runs them under MPI's gates (COMMRT_TORCH_SUITE_GATES=mpi), in a
pytest of its own because the suite reads its gates once, at import."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

SUITE = os.path.join(os.path.dirname(__file__), "test_torch_suite.py")


@pytest.mark.timeout(420)
def test_cpu_all_to_all_tests_under_mpi_gates():
    # the suite's own variables, which an earlier import of it in this pytest set,
    # are left out: the child derives them from the knobs below
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "BACKEND", "TEMP_DIR")}
    env.update(COMMRT_TORCH_FULL="1", COMMRT_TORCH_SUITE_GATES="mpi",
               COMMRT_TORCH_SUITE_BACKEND="commrt", COMMRT_TORCH_SUITE_WORLD="3")
    cmd = [sys.executable, "-m", "pytest", SUITE, "-q", "-rA", "-p", "no:cacheprovider",
           "-n", "0", "--timeout", "300", "-k", "all_to_all and not cuda"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(SUITE))))
    out = proc.stdout + proc.stderr
    passed = [ln for ln in out.splitlines() if ln.startswith("PASSED ")]
    assert proc.returncode == 0 and len(passed) == 12, out[-4000:]
