"""A randomized soak of collectives checked against NumPy (COMMRT_SOAK_OPS collectives
per run, default 10^4, split between shared memory and TCP, world sizes drawn
from 2..8), and leak checks over 50 init/close cycles: descriptors, threads,
resident memory, /dev/shm, the job's TMPDIR."""

import pytest

from commrt import config
from commrt.testing import World

import campaign_ranks as R

SOAK_OPS = config.get("COMMRT_SOAK_OPS")
CYCLES = 50
WARM = 5                    # cycles before the counts settle (lazy imports, cost cache, arenas)
RSS_GROWTH_KIB = 24 << 10   # resident growth allowed over the 45 settled cycles


def world_env(tmp_path):
    return {"COMMRT_COST_CACHE": str(tmp_path / "cost.json"), "COMMRT_TIMEOUT": "120"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_soak_of_random_collectives(transport, rng, seed, tmp_path, private_tmp, figure):
    n = rng.randint(2, 8)
    ops = max(1, SOAK_OPS // 2)
    with World(n, transport=transport, env=world_env(tmp_path), timeout=120) as w:
        results = w.run(R.soak, seed, ops, timeout=max(300.0, ops * 0.2))
    assert [r["ops"] for r in results] == [ops] * n
    rate = ops / max(r["seconds"] for r in results)
    print(f"soak {transport} N={n}: {ops} collectives checked, {rate:.0f}/s (seed {seed})")
    figure("soak", transport=transport, n=n, ops=ops, rate=rate)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_init_close_cycles_leak_nothing(transport, rng, seed, tmp_path, private_tmp):
    n = rng.randint(2, 4)
    with World(n, transport=transport, env=world_env(tmp_path), timeout=120) as w:
        rows = w.run(R.init_close_cycles, CYCLES, seed, timeout=500)
    for rank, usage in enumerate(rows):
        settled, last = usage[WARM - 1], usage[-1]
        where = f"rank {rank} of {n} ({transport}), cycle {WARM} -> {CYCLES}"
        assert last["fds"] <= settled["fds"], f"{where}: descriptors {settled['fds']} -> {last['fds']}"
        assert last["threads"] <= settled["threads"], \
            f"{where}: threads {settled['threads']} -> {last['threads']}"
        growth = last["rss_kib"] - settled["rss_kib"]
        assert growth < RSS_GROWTH_KIB, f"{where}: resident memory grew {growth} KiB"
        assert all(u["fds"] == usage[WARM - 1]["fds"] for u in usage[WARM - 1:]), \
            f"{where}: descriptors went {[u['fds'] for u in usage]}"
