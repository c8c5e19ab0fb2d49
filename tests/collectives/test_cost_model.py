"""The cost model without processes: over a wide range of parameters (not one
host's numbers) its formulas give latency-bound sizes to the algorithm with
the fewest steps and bandwidth-bound sizes to a bandwidth-optimal one, and
its cache keeps one entry per (transport, host, cores, ranks on the host)
and version."""
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commrt import config
from commrt.collectives import cost, registry

# Parameters like calibrate's on a 2-core host, for the tests of the formulas'
# structure below (oversubscription, γ's growth), which hold for any values.
HOST = dict(alpha=5e-6, beta=7e-11, gamma=2e-11, gamma_mem=5e-11, mu=1.8e-11,
            segment=256 << 10, cores=2)


def params(n, busy):
    return cost.Params(alpha_busy=busy, local=n, **HOST)


def best(n, nbytes, p):
    pred = {a: registry.module("all_reduce", a).cost(n, nbytes, p)
            for a in registry.names("all_reduce") if a != "hierarchical"}
    return cost.cheapest(pred), pred


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(n=st.sampled_from([2, 4, 8]), alpha=st.floats(1e-7, 1e-4), busy=st.floats(1.0, 10.0),
       beta=st.floats(1e-11, 1e-9), gamma=st.floats(5e-12, 1e-10), mem=st.floats(1.0, 4.0),
       mu=st.floats(5e-12, 1e-10), cores=st.sampled_from([1, 2, 4, 16]))
def test_latency_bound_takes_fewest_steps_bandwidth_bound_a_bandwidth_optimal_one(
        n, alpha, busy, beta, gamma, mem, mu, cores):
    p = cost.Params(alpha, beta, gamma, mu, alpha * busy, gamma * mem, segment=256 << 10,
                    cores=cores, local=n)
    assert best(n, 8, p)[0] == "recursive_doubling", best(n, 8, p)
    # bytes that take a thousand times α to move: the bytes decide
    nbytes = max(64 << 20, int(1e3 * alpha * busy / beta))
    # each rank sends ~K or 2(N-1)/N·K, whatever N: not log2(N)·K, nor (N-1)·K at a root
    assert best(n, nbytes, p)[0] in ("rabenseifner", "ring", "dbtree"), (nbytes, best(n, nbytes, p))


def test_oversubscription_counts_the_work_of_every_rank():
    p = params(4, 40e-6)
    assert p.oversubscribed(4) and not p.oversubscribed(2)
    assert p.step(4) == 40e-6 and p.step(2) == 5e-6
    # lat + max(critical bytes, work / cores)
    assert p.time(4, 1.0, 2.0, 10.0) == 1.0 + 5.0
    assert p.time(2, 1.0, 2.0, 10.0) == 3.0
    # the ring and Rabenseifner move the same bytes; the ring waits on its
    # neighbour once per segment of each of its 2(N-1) steps
    _, pred = best(4, 1 << 20, p)
    assert pred["ring"] > pred["rabenseifner"]


def test_cache_disabled_by_an_empty_setting(monkeypatch):
    monkeypatch.setenv("COMMRT_COST_CACHE", "")
    assert cost._cache_path() is None


def test_gamma_grows_from_cache_to_memory_speed():
    p = params(2, 5e-6)
    assert p.g(64 << 10) == p.gamma and p.g(64 << 20) == p.gamma_mem
    assert p.gamma < p.g(4 << 20) < p.gamma_mem
    assert cost.Params(1e-6, 1e-10, 2e-11).g(64 << 20) == 2e-11  # no γ_mem measured: γ


def test_cache_is_keyed_by_ranks_per_host_and_versioned(tmp_path, monkeypatch):
    path = tmp_path / "cost.json"
    monkeypatch.setenv("COMMRT_COST_CACHE", str(path))
    values = (1e-6, 2e-10, 3e-11, 4e-11, 5e-6, 6e-11, 7e-5, 8e-9, 9e-6, 1e-6)
    assert len(values) == len(cost.FIELDS)
    cost._store("shm", 4, values)
    assert cost._load("shm", 4) == (values, 1, False)
    assert cost._load("shm", 2) is None
    assert cost._load("shm", 4, hosts=2) is None
    data = json.loads(path.read_text())
    (key,) = data
    data[key]["version"] = cost.CACHE_VERSION - 1  # an older model's numbers
    path.write_text(json.dumps(data))
    assert cost._load("shm", 4) is None


def test_a_cached_calibration_settles_once_two_measurements_agree():
    """A first measurement taken while the host was slow (every sample alike, so
    the spread test passes) is measured again by the next job, which keeps each
    field's smaller value; two that agree settle the entry, and four settle it
    whatever they were."""
    base = (3e-6, 1e-10, 4e-11, 4e-11, 3e-6, 1e-10, 0.0, 0.0, 6e-6, 8e-7)
    slow = tuple(v * 12 for v in base)
    values, samples, settled = cost._merge(None, slow)
    assert (values, samples, settled) == (slow, 1, False)
    values, samples, settled = cost._merge((values, samples, settled), base)
    assert values == base and samples == 2 and not settled     # 12x apart: not yet
    near = tuple(v * 1.2 for v in base)
    values, samples, settled = cost._merge((values, samples, settled), near)
    assert values == base and samples == 3 and settled
    # latencies alike but β 3x apart (N = 2 in the host's slow state): not yet
    slow_beta = tuple(v * 3 if k == "beta" else v for k, v in zip(cost.FIELDS, base))
    assert cost._merge((slow_beta, 1, False), base)[1:] == (2, False)
    assert cost._merge((base, 2, False), near)[1:] == (3, True)
    # four measurements settle it even when none agree
    prior = (slow, 3, False)
    assert cost._merge(prior, tuple(v * 3 for v in slow))[1:] == (4, True)


def test_a_job_measures_again_until_the_cache_settles(tmp_path, monkeypatch):
    """params() on a world of 2: a first job's entry (stored when its samples were
    quiet) is never settled, so the next job measures again; a settled entry is
    only read."""
    from commrt.testing import World

    path = tmp_path / "cost.json"
    monkeypatch.setenv("COMMRT_COST_CACHE", str(path))      # for _store below
    env = {"COMMRT_COST_CACHE": str(path)}
    with World(2, transport="shm", env=env, timeout=60) as w:
        assert w.run(_calibration_source) == ["measured", "measured"]
        if path.exists():                      # (not stored where the host was busy)
            (entry,) = json.loads(path.read_text()).values()
            assert entry["samples"] == 1 and not entry["settled"]
    with World(2, transport="shm", env=env, timeout=60) as w:
        assert w.run(_calibration_source) == ["measured", "measured"]
    data = json.loads(path.read_text()) if path.exists() else {}
    if not data:                               # both busy: store one by hand
        cost._store("shm", 2, (3e-6,) * len(cost.FIELDS))
        data = json.loads(path.read_text())
    for e in data.values():
        e["settled"] = True
    path.write_text(json.dumps(data))
    with World(2, transport="shm", env=env, timeout=60) as w:
        assert w.run(_calibration_source) == ["cached", "cached"]


def _calibration_source(comm):
    return cost.params(comm).source


def test_cache_key_names_the_network_namespace_and_interface(monkeypatch):
    from commrt.rendezvous import netif

    monkeypatch.setattr(netif, "namespace", lambda: "nsA")
    monkeypatch.setattr(netif, "default_route_interface", lambda: "eth0")
    monkeypatch.delenv("COMMRT_IFNAME", raising=False)
    a = cost._cache_key("shm+tcp", 2, 2)
    monkeypatch.setattr(netif, "namespace", lambda: "nsB")
    b = cost._cache_key("shm+tcp", 2, 2)
    assert a != b and ":nsA:eth0:" in a and ":nsB:eth0:" in b


def test_steps_across_hosts_take_the_network_class():
    p = cost.Params(alpha=5e-6, beta=1e-10, gamma=2e-11, alpha_net=50e-6, beta_net=1e-8,
                    hosts=2, local=2)
    net = p.net(2)
    assert (net.alpha, net.beta) == (50e-6, 2e-8) and p.net(1).beta == 1e-8
    assert cost.Params(alpha=5e-6, beta=1e-10, gamma=2e-11).net(4).beta == 1e-10  # one host
    groups = [[0, 1], [2, 3]]
    hier = registry.module("all_reduce", "hierarchical").cost(4, 16 << 20, p, groups=groups)
    ring = registry.module("all_reduce", "ring").cost(4, 16 << 20, p.net(1))
    assert hier < ring  # the slow link carries the leaders' bytes only


def test_forced_algorithm_is_read_on_every_call(monkeypatch):
    for var in ("COMMRT_ALLREDUCE_ALGO", "COMMRT_ALL_REDUCE_ALGO", "COMMRT_BROADCAST_ALGO"):
        monkeypatch.delenv(var, raising=False)
    assert config.forced_algorithm("all_reduce") == ""
    monkeypatch.setenv("COMMRT_ALLREDUCE_ALGO", "tree")        # the old name, an alias
    assert config.forced_algorithm("all_reduce") == "tree"
    monkeypatch.setenv("COMMRT_ALL_REDUCE_ALGO", "ring")       # the new name wins
    assert config.forced_algorithm("all_reduce") == "ring"
    monkeypatch.setenv("COMMRT_BROADCAST_ALGO", "pipeline")
    assert config.forced_algorithm("broadcast") == "pipeline"
    assert config.forced_algorithm("reduce") == ""


@pytest.mark.parametrize("n", [4, 8, 16])
def test_the_double_tree_wins_on_latency_not_on_bytes(n):
    p = cost.Params(alpha=5e-6, beta=1e-10, gamma=2e-11, segment=256 << 10, cores=64, local=n)
    dbtree, tree, raben = (registry.module("all_reduce", a)
                           for a in ("dbtree", "tree", "rabenseifner"))
    big = 256 << 20
    assert raben.cost(n, big, p) < dbtree.cost(n, big, p) < tree.cost(n, big, p)
    # its latency grows with the depth, log2 N, like the single tree's
    small = 8
    assert dbtree.cost(n, small, p) <= tree.cost(n, small, p) * 1.01


@pytest.mark.parametrize("n", [2, 4])
def test_the_ring_reduce_pays_for_its_scratch_copy(n):
    """reduce/ring.py copies the whole buffer into scratch at every non-root
    before its ring (the root waits for it): K·μ of its cost.  Without that
    term the model put the ring below binomial at N = 2 and 16 MiB, where it
    ran 1.8x slower."""
    p = params(n, 1.0)
    ring = registry.module("reduce", "ring")
    k = 16 << 20
    assert ring.cost(n, k, dataclasses.replace(p, mu=2 * p.mu)) - ring.cost(n, k, p) \
        == pytest.approx(k * p.mu)


class _World:
    """What predict reads of a communicator: its size (one host)."""
    def __init__(self, n):
        self.size = n

    def host_of(self, q):
        return "h"


def test_the_general_paths_own_cost_goes_to_algorithms_without_a_plan():
    """c_gen (Params.call) is charged where no prepared plan runs the call.  N = 3
    on 2 cores: the tree's formula looked as cheap as recursive doubling's fold
    at 8 B, yet before it had a plan the tree ran on the general path at 54-115
    µs and the planned recursive doubling at 5-7 µs (2026-12-04).  Now the
    tree is planned within one segment, and charged beyond."""
    from commrt.collectives import plans

    assert plans.applies("all_reduce", "recursive_doubling", 3, 8)
    assert plans.applies("all_reduce", "recursive_doubling", 3, 1 << 20)
    assert not plans.applies("all_reduce", "recursive_doubling", 3, 2 << 20)   # scratch bound
    assert plans.applies("all_reduce", "recursive_doubling", 4, 64 << 20)      # no scratch
    assert plans.applies("all_reduce", "rabenseifner", 4, 16 << 20)
    assert not plans.applies("all_reduce", "rabenseifner", 3, 8)
    assert plans.applies("all_reduce", "tree", 4, 8)                           # one segment
    assert not plans.applies("all_reduce", "tree", 4, (256 << 10) + 4)
    assert plans.applies("all_reduce", "ps", 4, 8)
    assert plans.applies("all_reduce", "dbtree", 4, 16 << 20)                  # its lanes
    assert not plans.applies("all_reduce", "dbtree", 4, (16 << 20) + 4)        # MAX_BYTES
    assert plans.applies("broadcast", "binomial", 4, 8)
    assert plans.applies("broadcast", "pipeline", 4, 8)
    assert plans.applies("broadcast", "pipeline", 4, 4 << 20)
    assert not plans.applies("broadcast", "pipeline", 4, (4 << 20) + 4)     # its own limit
    assert plans.applies("all_reduce", "ring", 3, 16 << 20)
    assert plans.applies("all_reduce", "reduce_bcast", 3, 8)
    assert not plans.applies("all_reduce", "ring", 3, 32 << 20)
    assert not plans.applies("broadcast", "binomial", 4, 64 << 20)
    assert not plans.applies("all_reduce", "recursive_doubling", 1, 8)
    # the layouts' own limits: the direct reduce-scatter's blocks (eager, beyond two
    # ranks), bruck's scratch
    assert plans.applies("reduce_scatter", "direct", 4, 64 << 10)
    assert not plans.applies("reduce_scatter", "direct", 4, 128 << 10)
    assert plans.applies("reduce_scatter", "direct", 2, 1 << 20)
    assert plans.applies("all_gather", "bruck", 4, 1 << 20)
    assert not plans.applies("all_gather", "bruck", 4, 2 << 20)

    world = _World(3)
    p = cost.Params(alpha=3e-6, beta=5e-11, gamma=4e-11, alpha_busy=5e-6, local=3, cores=2,
                    segment=256 << 10)
    for nbytes in (8, 2 << 20):
        without = cost.predict("all_reduce", world, nbytes, p)
        withc = cost.predict("all_reduce", world, nbytes, dataclasses.replace(p, call=20e-6))
        for name, t in withc.items():
            charged = not plans.applies("all_reduce", name, 3, nbytes)
            assert t == pytest.approx(without[name] + (20e-6 if charged else 0.0))
        assert (withc["tree"] > without["tree"]) == (nbytes > p.segment)
        assert withc["ps"] == pytest.approx(without["ps"])      # planned at any size
        assert withc["dbtree"] == pytest.approx(without["dbtree"])
    # an unplanned algorithm the formulas alone prefer (dbtree beyond plans.MAX_BYTES)
    # loses to a planned one (recursive doubling on a power of two: no scratch)
    world4, at = _World(4), 20 << 20
    alone = cost.predict("all_reduce", world4, at, p)
    assert alone["dbtree"] < alone["recursive_doubling"]
    gap = alone["recursive_doubling"] - alone["dbtree"]
    charged = cost.predict("all_reduce", world4, at, dataclasses.replace(p, call=2 * gap))
    assert charged["dbtree"] > charged["recursive_doubling"]
    assert charged["recursive_doubling"] == pytest.approx(alone["recursive_doubling"])


def test_a_planned_algorithm_steps_at_the_chains_alpha():
    """α_plan (a round of the barrier's prepared plan) replaces α and α_busy for
    the algorithms that run on a plan at that size; the others keep the general
    path's, and c_gen.  A pipeline whose every step waits on a neighbour
    (SEGMENT_WAITS: the ring) keeps α_busy per step where ranks outnumber
    cores, one segment or several: the plan removes its Python, not the
    context switch (measured at N = 3, 64-256 KiB: the ring 40-44 µs
    against the tree's 35-38)."""
    from commrt.collectives import plans

    world = _World(3)
    p = cost.Params(alpha=3e-6, beta=5e-11, gamma=4e-11, alpha_busy=9e-6, local=3, cores=2,
                    segment=256 << 10, call=4e-6)
    slow = cost.predict("all_reduce", world, 8, p)
    fast = cost.predict("all_reduce", world, 8, dataclasses.replace(p, alpha_plan=1e-6))
    for name in slow:
        waits = getattr(registry.module("all_reduce", name), "SEGMENT_WAITS", False)
        if plans.applies("all_reduce", name, 3, 8) and not waits:
            assert fast[name] < slow[name], name
        elif plans.applies("all_reduce", name, 3, 8):
            assert fast[name] == slow[name], name     # α_busy per step stays
        else:
            assert fast[name] == slow[name], name
    assert any(getattr(registry.module("all_reduce", n), "SEGMENT_WAITS", False)
               and plans.applies("all_reduce", n, 3, 8) for n in slow)
    # (recursive doubling and the tree tie at N = 3: three waits each)
    assert cost.cheapest(fast) in ("recursive_doubling", "tree")


def test_binomial_reduce_streams_its_copies_beside_its_combines():
    """reduce/binomial.py: each level's senders copy while their parents combine
    (copier SENDER), so a byte costs max(β, γ) where the level's ranks have a
    core each: a γ below β changes nothing there, and N = 4 on 2 cores (two
    pairs at the first level) pays that level twice.  At N = 2 and 3 on one
    host the ring reduce (a scratch copy, a reduce-scatter whose every segment
    waits on a neighbour, then the gather) is not chosen at any size: measured
    at 64 KiB-64 MiB it was 1.3-3x slower (fresh inputs, 2026-12-04)."""
    binomial, ring = registry.module("reduce", "binomial"), registry.module("reduce", "ring")
    p = params(2, 5e-6)
    k = 16 << 20
    assert binomial.cost(2, k, p) == binomial.cost(2, k, dataclasses.replace(p, gamma=p.beta / 2))
    assert binomial.cost(2, k, p) == pytest.approx(p.nseg(k) * p.alpha + k * p.beta)
    p4 = params(4, 20e-6)
    assert binomial.cost(4, k, p4) == pytest.approx(p.nseg(k) * 20e-6 + 2 * k * p.beta
                                                    + p.nseg(k) * 5e-6 + k * p.beta)
    for n in (2, 3):
        pn = params(n, 12e-6)
        for nbytes in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
            assert binomial.cost(n, nbytes, pn) < ring.cost(n, nbytes, pn), (n, nbytes)


def test_a_planned_segment_that_waits_on_a_neighbour_keeps_its_context_switch():
    """A plan's steps cost α_plan (its chain, no general path), but where ranks
    outnumber cores a pipelined chain's or a ring's step still waits for its
    neighbour to get a core (SEGMENT_WAITS: α_busy kept).  Charged α_plan, the
    planned pipelined broadcast won the choice at N = 3 on 2 cores from 1 MiB,
    where the binomial tree ran 1.3-1.7x faster (326 against 419 µs at 1 MiB,
    863 against 1307 at 4 MiB, 2026-12-04)."""
    world = _World(3)
    p = cost.Params(alpha=5e-6, beta=1e-10, gamma=3.5e-11, alpha_busy=12e-6, alpha_plan=2.7e-6,
                    local=3, cores=2, segment=256 << 10)
    pipeline = registry.module("broadcast", "pipeline")
    binomial = registry.module("broadcast", "binomial")
    assert pipeline.SEGMENT_WAITS and not getattr(binomial, "SEGMENT_WAITS", False)
    for nbytes in (1 << 20, 4 << 20):
        pred = cost.predict("broadcast", world, nbytes, p)
        assert pred["pipeline"] == pytest.approx(pipeline.cost(
            3, nbytes, dataclasses.replace(p, alpha=2.7e-6)))
        assert pred["binomial"] == pytest.approx(binomial.cost(
            3, nbytes, dataclasses.replace(p, alpha=2.7e-6, alpha_busy=2.7e-6)))
        assert cost.cheapest(pred) == "binomial"
    # one segment: each step still waits on its neighbour (since 2026-12-05; the
    # ring all-reduce at N = 3, 64-256 KiB, was chosen over a tree 15% faster)
    one = cost.predict("broadcast", world, 64 << 10, p)
    assert one["pipeline"] == pytest.approx(pipeline.cost(
        3, 64 << 10, dataclasses.replace(p, alpha=2.7e-6)))
    for kind in ("all_reduce", "reduce"):
        assert registry.module(kind, "ring").SEGMENT_WAITS


def test_the_direct_all_gathers_further_eager_messages_cost_half_a_step():
    """Each message of direct's one step after its first: half a step where its
    block goes eagerly (their waits overlap) or, where ranks outnumber cores,
    its sender writes it (below the single-copy threshold: their waits overlap
    too); a whole α where it does not (each its own handshake), as a variable-size
    direct all-gather's blocks, which stream.  Measured on 2 cores, planned:
    direct beat the ring at N = 3 and Bruck at N = 4 by 8-17% at 8 B - 16 KiB
    blocks, and lost to Bruck at N = 8 (2026-12-05); with its blocks written
    it beat the ring at N = 3 and 4 from 64 KiB to 1 MiB (1 MiB: 191 against
    219 µs, 245 against 268), where a whole α tied the two and the tie went to
    the ring.  From the threshold up (1 MiB blocks) the ring was faster."""
    direct = registry.module("all_gather", "direct")
    limit = config.get("COMMRT_EAGER_LIMIT")
    big = cost.single_copy_min()
    for n in (3, 4, 8):
        p = cost.Params(alpha=3e-6, beta=6e-11, gamma=3.5e-11, mu=3e-11, alpha_busy=7e-6,
                        alpha_plan=2.8e-6, local=n, cores=2, segment=256 << 10)
        q = dataclasses.replace(p, alpha=2.8e-6, alpha_busy=2.8e-6)   # planned
        assert direct.further(q, n, limit) == pytest.approx(q.step(n) / 2)
        assert direct.further(q, n, limit + 1) == q.alpha                  # streamed
        assert direct.further(q, n, limit + 1, True) == pytest.approx(q.step(n) / 2)
        assert direct.further(q, n, big, True) == q.alpha                   # read
        one_core_each = dataclasses.replace(q, cores=n)
        assert direct.further(one_core_each, n, limit + 1, True) == q.alpha
        world = _World(n)
        pick = {k: cost.cheapest(cost.predict("all_gather", world, k, p))
                for k in (8 * n, 1024 * n, 1 << 20, big * n)}
        assert pick[8 * n] == pick[1024 * n] == ("direct" if n < 8 else "bruck"), pick
        if n < 8:
            assert pick[1 << 20] == "direct" and pick[big * n] == "ring", pick


def test_hierarchical_pays_for_its_two_hand_offs():
    """Hierarchical twice wakes ranks that waited through a step (α_busy, α where
    it is the larger); its steps are one call (call.Members), so no c_gen
    beyond the one the model charges every unplanned algorithm.  At 64 KiB
    over a fast link, where each step's own bytes cost little, those decide
    against it
    (measured on namespace hosts at 10 Gbit/s: the flat ring 242 µs,
    hierarchical 708; docs/scale.md); at 16 MiB its leaders-only traffic
    still wins.  One host (no hosts to group) keeps no hand-offs."""
    mod = registry.module("all_reduce", "hierarchical")
    groups = [[0, 1], [2, 3]]
    p = cost.Params(alpha=3e-6, beta=1e-10, gamma=3e-11, alpha_net=9e-6, beta_net=9e-10,
                    hosts=2, local=2, cores=4, alpha_busy=70e-6, call=5e-6)
    bare = dataclasses.replace(p, alpha_busy=0.0, call=0.0)
    for nbytes in (8, 64 << 10, 16 << 20):
        extra = mod.cost(4, nbytes, p, groups=groups) - mod.cost(4, nbytes, bare, groups=groups)
        assert extra == pytest.approx(2 * 70e-6 - 2 * 3e-6)    # bare: 2α
    ring = registry.module("all_reduce", "ring").cost(4, 64 << 10, p.net(2))
    assert mod.cost(4, 64 << 10, p, groups=groups) > ring      # both on plans: no c_gen
    assert mod.cost(4, 16 << 20, p, groups=groups) < registry.module(
        "all_reduce", "ring").cost(4, 16 << 20, p.net(2))
    assert mod.cost(2, 64 << 10, p, groups=[[0], [1]]) == pytest.approx(
        registry.module("all_reduce", "ring").cost(2, 64 << 10, p.net()))
