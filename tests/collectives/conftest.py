"""Worlds shared by the collectives tests: one per (size, transport), alive for the
whole session so hypothesis examples cost a collective, not a process start."""
import pytest

from commrt.testing import World

SHM_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
TCP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
WORLDS = [(n, "shm") for n in SHM_SIZES] + [(n, "tcp") for n in TCP_SIZES]

# Probes after 0.5 s (mismatch tests are quicker); a private cost cache.
ENV = {"COMMRT_COLL_PROBE_S": "0.5"}


@pytest.fixture(scope="session")
def cost_env(tmp_path_factory):
    env = dict(ENV)
    env["COMMRT_COST_CACHE"] = str(tmp_path_factory.mktemp("cost") / "cost.json")
    return env


@pytest.fixture(scope="session", params=WORLDS, ids=lambda p: f"{p[1]}{p[0]}")
def world(request, cost_env):
    n, transport = request.param
    with World(n, transport=transport, env=cost_env, timeout=120) as w:
        yield w
