"""Persistent exchange chains (transport/chain.pxi): bound once, run many times;
results, refused buffers, and the hand-over of a step that is not clean (meta
or size mismatch, a late peer, a dead one) as ordinary Requests."""
import json
import os

import pytest

import chain_ranks as R
from commrt.testing import World, WorldError


@pytest.fixture(scope="module", params=[(2, "shm"), (4, "shm"), (2, "tcp")],
                ids=lambda p: f"{p[1]}{p[0]}")
def world(request):
    n, transport = request.param
    with World(n, transport=transport, timeout=120) as w:
        yield w


@pytest.mark.parametrize("rebind", [False, True])
@pytest.mark.parametrize("n", [1, 5, 4096])
def test_runs_reduce_and_leave_nothing_behind(world, n, rebind):
    for out in world.run(R.sums, 6, n, rebind):
        assert out["ret"] == [out["nsteps"]] * 6, out
        assert all(out["ok"]), out
        assert out["live_growth"] <= 0, out


def test_refused_buffers_send_nothing(world):
    for rets, sent, ret, x in world.run(R.refused_buffers):
        assert rets == [-1] * 5 and sent == 0, (rets, sent)
        total = sum(range(1, world.size + 1))
        assert ret == (world.size - 1).bit_length() and x == [total] * 4


def test_chains_without_hook_or_steps(world):
    for rets, nsteps, none in world.run(R.no_hook):
        assert rets == [nsteps] * 5 and none == 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nbytes", [64, 1 << 20])
def test_a_message_naming_its_tag_matches_only_that_tags_receive(transport, nbytes):
    """A chain message may name its own tag (a lane of a call: dbtree's trees):
    rank 1 posts its receives in the opposite order of rank 0's sends, and each
    block still lands in the range its tag's receive names (eager and large
    messages alike); a tag below -1 (-1: the chain's) is refused."""
    with World(2, transport=transport, timeout=60) as w:
        res = w.run(R.lanes, nbytes)
    assert res[0][0] == [1.0, 2.0, 3.0]
    assert res[1][0] == [3.0, 2.0, 1.0], res[1]
    for _, refused in res:
        assert refused is not None and "tag" in refused, refused


def test_meta_mismatch_stops_and_hands_over():
    with World(2, timeout=60) as w:
        res = w.run(R.meta_mismatch)
    for r, out in enumerate(res):
        other = 1 - r
        assert out["k"] == 0 and out["again"] is None, out
        assert out["meta"] == 100 + other and out["source"] == other and out["nbytes"] == 16
        assert out["tmp"] == [other + 1.0] * 2 and out["buf"] == [r + 1.0] * 2  # not combined
        assert out["clean"] == 1 and out["sum"] == [3.0, 3.0], out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_late_peer_hands_over_then_runs_clean(transport):
    with World(2, transport=transport, timeout=60) as w:
        r0, r1 = w.run(R.late_peer, 0.01)
    assert r0["k"] == 0 and r0["meta"] == 9, r0
    assert r0["tmp"] == [2.0] * 3 and r0["buf_before"] == [1.0] * 3, r0
    assert r1["k"] == 1 and r1["handover"] is None, r1
    for out in (r0, r1):
        assert out["rets"] == [1, 1] and out["sum"] == [3.0] * 3, out
        assert out["live"] == 0, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_peer_fails_the_handed_over_receive(transport, tmp_path):
    with World(2, transport=transport, timeout=60) as w:
        with pytest.raises(WorldError, match="rank 1"):
            w.run(R.dead_peer, str(tmp_path), timeout=45)
    k, err, elapsed = json.loads((tmp_path / "0.json").read_text())
    assert k == 0 and err is not None and err[0] == 1 and "rank 1" in err[1], (k, err)


def test_sizes_that_differ_stop_the_chain():
    with World(2, timeout=60) as w:
        (k0, what0, detail0), (k1, what1, nbytes1) = w.run(R.sizes_differ)
    assert k0 == 0 and what0 == "truncated", detail0
    assert k1 == 0 and what1 == "ok" and nbytes1 == 8


def test_stamped_runs_send_base_or_seq():
    with World(2, timeout=60) as w:
        outs = w.run(R.stamped, timeout=60)
    for r, out in enumerate(outs):
        assert "stamp" in out["unstamped"], out
        assert out["clean"] == 1 and out["sum"] == [3.0, 3.0], out
        assert out["k"] == 0 and out["meta"] == ((2 - r) << 40) | 0xAB, out


@pytest.mark.parametrize("pause_s,learns", [(0.00005, True), (0.005, False)], ids=["near", "far"])
def test_a_step_learns_its_spin_where_ranks_share_cores(pause_s, learns):
    """Where ranks outnumber cores (here both on one core, this process pinned
    to it while World spawns them) a chain step learns its own spin budget
    (engine.pxi, block() and learn_budget()): answers that keep coming a
    little after its waiter fell asleep (the sender pausing 0.05 ms before
    each run) double it until they come while it spins (at most
    COMMRT_OVERSUB_SPIN_MAX_US); answers 5 ms away leave it
    at the minimum (COMMRT_OVERSUB_SPIN_US), so a step that waits for a
    computing peer does not spin through the computation."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    env = {"COMMRT_OVERSUB_SPIN_US": "50", "COMMRT_OVERSUB_SPIN_MAX_US": "250"}
    try:
        with World(2, transport="shm", env=env, timeout=60) as w:
            os.sched_setaffinity(0, mask)
            budgets = w.run(R.learned_spin, pause_s, timeout=50)[1]
    finally:
        os.sched_setaffinity(0, mask)
    assert len(budgets) == 1, budgets
    if learns:      # doubled from 50 until the answers came while it spun, at most the cap
        assert 100.0 <= budgets[0] <= 250.0, budgets
    else:
        assert budgets[0] <= 50.0, budgets
