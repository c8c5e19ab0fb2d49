"""One 3-rank world shared by the Horovod API tests: an odd size, on two pretend hosts
(ranks 0 and 1 on hostA over shared memory, rank 2 on hostB over TCP), so local,
cross and homogeneity answers and both transports are exercised."""
import pytest

from commrt.testing import World


@pytest.fixture(scope="session")
def world3(tmp_path_factory):
    env = {"COMMRT_COST_CACHE": str(tmp_path_factory.mktemp("cost") / "cost.json"),
           "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    hosts = {0: {"COMMRT_HOST_ID": "hostA"}, 1: {"COMMRT_HOST_ID": "hostA"},
             2: {"COMMRT_HOST_ID": "hostB"}}
    with World(3, transport="auto", env=env, rank_env=hosts, timeout=120) as w:
        yield w
