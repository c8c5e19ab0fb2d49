"""One 4-rank world shared by the data-parallel tests (process start is the slow part)."""
import pytest

from commrt.testing import World


@pytest.fixture(scope="session")
def world4(tmp_path_factory):
    env = {"COMMRT_COST_CACHE": str(tmp_path_factory.mktemp("cost") / "cost.json"),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    with World(4, transport="shm", env=env, timeout=120) as w:
        yield w
