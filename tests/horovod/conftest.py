"""One 3-rank world shared by the Horovod API tests (an odd size on purpose)."""
import pytest

from commrt.testing import World


@pytest.fixture(scope="session")
def world3(tmp_path_factory):
    env = {"COMMRT_COST_CACHE": str(tmp_path_factory.mktemp("cost") / "cost.json"),
           "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    with World(3, transport="shm", env=env, timeout=120) as w:
        yield w
