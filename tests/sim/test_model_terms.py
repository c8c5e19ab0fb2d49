"""The simulator's model terms measured point to point for the validation: α per
message size where ranks outnumber cores (fitted back through the engine), the
machine's cores shared by namespace hosts with TCP's copies on them, rendezvous
messages that move once received, and the replay of saved measurements."""
import dataclasses
import json
import os

import pytest

from commrt.sim import schedules, validate
from commrt.sim.calibrate import fit_alpha, shift_steps
from commrt.sim.engine import Topology, curve, simulate

A, B, G = 5e-6, 1e-9, 2e-10


def topo(nodes, per_node, **kw):
    base = dict(alpha_shm=A, beta_shm=B, alpha_net=2 * A, beta_net=4 * B, gamma=G,
                segment=1 << 30)
    base.update(kw)
    return Topology(nodes, per_node, **base)


def test_curves_are_log_linear_between_their_sizes_and_flat_beyond():
    pts = ((1 << 10, 4.0), (1 << 20, 1.0))
    assert curve(pts, 1) == 4.0 and curve(pts, 1 << 30) == 1.0
    assert curve(pts, 1 << 15) == pytest.approx(2.5)   # half way in log size


def test_alpha_per_size_only_where_ranks_outnumber_cores():
    pts = ((1 << 10, 1e-5), (1 << 20, 1e-4))
    assert topo(1, 4, cores=4, alpha_at=pts).a(1 << 20) == A    # a core each
    assert topo(1, 4, alpha_at=pts).a(1 << 20) == A             # cores not modelled
    over = topo(1, 4, cores=2, alpha_at=pts)
    assert over.oversubscribed and over.a(1 << 20) == 1e-4 and over.a(1 << 10) == 1e-5
    # namespace hosts on one machine: 2 x 2 ranks on its 2 cores share them
    assert topo(2, 2, cores=2, shared_cores=True).oversubscribed
    assert not topo(2, 2, cores=2).oversubscribed


@pytest.mark.parametrize("n", [3, 4, 8])
@pytest.mark.parametrize("nbytes", [8 << 10, 1 << 20])
def test_fitted_alpha_gives_back_the_measured_shift_exchange(n, nbytes):
    t = topo(1, n, cores=2)
    copies = simulate(dataclasses.replace(t, alpha_at=((1, 0.0),)),
                      shift_steps(n, nbytes), itemsize=1) / (n - 1)
    measured = 3 * copies + 20e-6
    a = fit_alpha(t, nbytes, measured)
    assert a > 0
    again = simulate(dataclasses.replace(t, alpha_at=((1, a),)), shift_steps(n, nbytes),
                     itemsize=1) / (n - 1)
    assert again == pytest.approx(measured, rel=1e-6)
    # faster than the copies themselves: no negative α
    assert fit_alpha(t, nbytes, copies / 2) == 0.0
    with pytest.raises(ValueError, match="outnumber"):
        fit_alpha(topo(1, n, cores=n), nbytes, measured)


def test_tcp_copies_take_turns_on_the_machines_cores():
    """Two hosts' ranks receive at once across the link; TCP's copies (net_cpu)
    cost nothing where cores are not modelled, and queue on one shared core."""
    k = 1 << 20

    def steps(r):   # ranks 0, 1 on host 0 each exchange with one on host 1
        return [[("send", (r + 2) % 4, 0, k), ("recv", (r + 2) % 4, 0, k)]]
    wire = simulate(topo(2, 2), steps, itemsize=1)
    cpu = 2 * B
    spread = simulate(topo(2, 2, net_cpu=cpu), steps, itemsize=1)
    shared = simulate(topo(2, 2, net_cpu=cpu, cores=1, shared_cores=True), steps, itemsize=1)
    assert spread == wire
    # four receives of k bytes (one segment each) on one core, one after another
    # from the first message's arrival (2α + k·β_net): 4·k·net_cpu
    assert shared == pytest.approx(2 * A + 4 * B * k + 4 * k * cpu, rel=1e-9)
    assert shared > wire


def test_a_rendezvous_message_moves_once_its_receive_is_posted():
    """Rank 2 is busy with a local combine of D seconds before it posts the receive
    of rank 0's message across the link: with the eager limit below the size the
    bytes leave only then (and rank 0's call ends when they have left)."""
    c = 1 << 16
    nb = 4 * c

    def steps(r):
        return {0: [[("send", 2, 0, c)]], 1: [],
                2: [[("combine", 3, 0, c)], [("recv", 0, 0, c)]],
                3: [[("send", 2, 0, c)]]}[r]
    t = topo(2, 2)
    d = A + nb * (B + G)          # rank 2's local receive and combine
    assert simulate(t, steps) == pytest.approx(max(d, 2 * A + nb * 4 * B), rel=1e-9)
    assert simulate(dataclasses.replace(t, eager=16384), steps) == \
        pytest.approx(d + 2 * A + nb * 4 * B, rel=1e-9)
    # below the eager limit it is sent at once, as before
    assert simulate(dataclasses.replace(t, eager=nb), steps) == simulate(t, steps)


def test_rendezvous_keeps_the_symmetry_shortcut_exact():
    from commrt.sim import engine

    for algo in ("rabenseifner", "recursive_doubling", "ring"):
        steps = schedules.steps_of(algo, 16, 1 << 16)
        t = topo(16, 1, eager=16384)
        short, taken = engine.run(t, steps)
        assert taken and short == engine.run(t, steps, shortcut=False)[0]


def _params(n, cores=2):
    return {"alpha": 8e-6, "beta": 2e-10, "gamma": 1e-10, "gamma_mem": 3e-10,
            "segment": 1 << 18, "cores": cores, "gamma_busy": 4e-10,
            "beta_at": [[8192, 5e-10], [1 << 20, 2e-10]], "alpha_oversub": 1e-5,
            "oneway_at": [[8192, 4e-10], [1 << 20, 1.2e-10]],
            "shift": [[8192, 60e-6], [1 << 20, 900e-6]]}


def test_the_validation_topology_takes_each_term_and_leaves_it_out():
    p = _params(4)
    full = validate.topology(4, p, validate.TERMS)
    assert full.cores == 2 and full.eager and full.alpha_wait
    assert full.crowd_spin == pytest.approx(50e-6)
    # γ_busy beside another rank's combine, γ_mem alone ("alone"); without it, every one
    assert (full.gamma_mem, full.gamma_busy, full.g(16 << 20)) == (3e-10, 4e-10, 4e-10)
    shared = validate.topology(4, p, tuple(t for t in validate.TERMS if t != "alone"))
    assert shared.gamma_mem == 4e-10 and shared.gamma_busy is None
    assert len(full.alpha_at) == 2 and full.a(8192) > 0
    # one copy's β, and the exchange's rest on the node's memory
    assert full.beta_at == ((8192, 4e-10), (1 << 20, 1.2e-10))
    assert [k for k, _ in full.bus_at] == [8192, 1 << 20]
    assert [m for _, m in full.bus_at] == pytest.approx([1e-10, 0.8e-10])
    bare = validate.topology(4, p, terms=())
    assert bare.alpha_at == () and bare.gamma_mem == 3e-10 and bare.eager is None
    assert not bare.alpha_wait and not validate.topology(4, p).bus_at   # not by default
    assert bare.bus_at == () and bare.beta_at == ((8192, 5e-10), (1 << 20, 2e-10))
    assert bare.a(8192) == 1e-5                           # the ring-pass hop
    assert validate.topology(2, p).cores is None          # a core each


def test_hosts_topology_from_the_jobs_point_to_point_figures():
    p = dict(_params(2), alpha_net=40e-6, beta_net=1e-9, sim={
        "cores": 2,
        "net": [[8, 50e-6, 20e-6], [1 << 16, 150e-6, 40e-6], [1 << 20, 1.2e-3, 0.5e-3]],
        "shm": [[8, 9e-6, 9e-6], [1 << 16, 30e-6, 30e-6]]})
    t = validate.hosts_topology(2, 2, p)
    assert t.cores == 2 and t.shared_cores and t.oversubscribed
    assert t.alpha_net == 50e-6 and t.bn(1 << 20) == pytest.approx((1.2e-3 - 50e-6) / (1 << 20))
    assert t.net_cpu == pytest.approx((0.5e-3 - 20e-6) / ((1 << 20) - 8))
    assert t.alpha_shm == 9e-6 and len(t.beta_at) == 1
    plain = validate.hosts_topology(2, 2, dict(p, sim=None))
    assert plain.cores is None and plain.net_cpu == 0 and plain.beta_net == 1e-9


def test_hosts_busy_terms_give_back_the_patterns_they_were_fitted_to():
    """Every rank across the link at once (cross) and every rank with its host's
    other (inner): α_net, β_net per size and α per size solved through the engine
    give the measured times back."""
    from commrt.sim.calibrate import pattern_steps

    cross = [[8, 200e-6], [1 << 16, 900e-6], [1 << 20, 9e-3]]
    inner = [[8 << 10, 80e-6], [1 << 20, 2e-3]]
    p = dict(_params(2), alpha_net=40e-6, beta_net=1e-9, sim={
        "cores": 2, "call": 0.0, "cross": cross, "inner": inner,
        "net": [[8, 50e-6, 20e-6], [1 << 20, 1.2e-3, 0.5e-3]],
        "shm": [[8, 9e-6, 9e-6], [1 << 16, 30e-6, 30e-6]]})
    t = validate.hosts_topology(2, 2, p, validate.HOST_TERMS)
    assert validate.hosts_topology(2, 2, p).beta_net_at != t.beta_net_at   # not by default
    for k, want in cross:
        steps = pattern_steps(4, lambda r: [((r + 2) % 4, (r - 2) % 4)], k)
        assert simulate(t, steps, itemsize=1) == pytest.approx(want, rel=1e-3)
    for k, want in inner:
        steps = pattern_steps(4, lambda r: [(r ^ 1, r ^ 1)], k)
        assert simulate(t, steps, itemsize=1) == pytest.approx(want, rel=1e-3)
    assert len(t.beta_net_at) == 2 and len(t.alpha_at) == 2


def test_replay_simulates_saved_measurements_with_their_calibration(tmp_path):
    p2, p4 = _params(2), _params(4)
    saved = {"cells": {"2|rabenseifner|65536": {"measured": [1e-4, 2e-4], "simulated": [0, 0]},
                       "4|ring|1048576": {"measured": [3e-3], "simulated": [0]}},
             "params": {"2|0": p2, "2|1": dict(p2, alpha=2e-5), "4|0": p4}}
    path = tmp_path / "v.json"
    path.write_text(json.dumps(saved))
    data = validate.replay([str(path)])
    cell = data[(2, "rabenseifner", 65536)]
    assert cell["measured"] == [1e-4, 2e-4]
    assert cell["simulated"][0] == validate.predicted(2, 65536, "rabenseifner", p2)
    assert cell["simulated"][1] > cell["simulated"][0]   # round 2's own α
    ring = data[(4, "ring", 1048576)]["simulated"][0]
    assert ring == validate.predicted(4, 1 << 20, "ring", p4)
    assert validate.within(data, 1e9) == (2, 2)


def test_replaying_runs_of_one_host_and_across_hosts_reports_each_apart(capsys):
    """--replay with both kinds of saved runs: one table each (it raised TypeError
    sorting N beside link rates)."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "data", "sim")
    files = [os.path.join(root, "v-hosts-5.json"), os.path.join(root, "v-shm-5.json")]
    assert [(across, [os.path.basename(f) for f in fs])
            for across, fs in validate.replay_groups(files)] == \
        [(False, ["v-shm-5.json"]), (True, ["v-hosts-5.json"])]
    assert validate.main(["--replay", *files]) == 0
    out = capsys.readouterr().out
    assert out.count("within 25%") == 2
    assert out.index("N ") < out.index("link ")
    assert "10gbit" in out and "recursive_doubling" in out


def test_each_ranks_call_comes_before_its_first_step():
    from commrt.sim import engine

    steps = schedules.steps_of("recursive_doubling", 8, 1 << 12)
    plain = simulate(topo(8, 1), steps)
    for shortcut in (True, False):
        assert engine.run(topo(8, 1, call=7e-6), steps, shortcut=shortcut)[0] == \
            pytest.approx(plain + 7e-6, rel=1e-12)
    # sharing one core, the ranks' calls take turns on it before anything moves
    assert simulate(topo(1, 4, cores=1, call=1e-3), schedules.steps_of(
        "recursive_doubling", 4, 16)) >= 4e-3


def test_copies_at_once_share_the_nodes_memory():
    """bus_at: an exchange's two copies take the node's memory one at a time for
    their bus part, so a step costs α + s·(β + m) where one copy alone costs
    α + s·β; other nodes' memories are their own."""
    k, m = 1 << 20, 0.5 * B
    t = topo(1, 2, bus_at=((1, m),))
    both = simulate(t, lambda r: [[("send", 1 - r, 0, k), ("recv", 1 - r, 0, k)]], itemsize=1)
    one = simulate(t, lambda r: [[("send", 1, 0, k)]] if r == 0 else [[("recv", 0, 0, k)]],
                   itemsize=1)
    assert one == pytest.approx(A + k * B, rel=1e-12)
    assert both == pytest.approx(A + k * (B + m), rel=1e-12)
    assert simulate(topo(1, 2), lambda r: [[("send", 1 - r, 0, k), ("recv", 1 - r, 0, k)]],
                    itemsize=1) == pytest.approx(one, rel=1e-12)
    two_nodes = topo(2, 2, bus_at=((1, m),))
    assert simulate(two_nodes, lambda r: [[("send", r ^ 1, 0, k), ("recv", r ^ 1, 0, k)]],
                    itemsize=1) == pytest.approx(both, rel=1e-12)


def test_a_message_its_idle_sender_helps_move_takes_the_one_way_beta():
    """oneway_at: a message sent in its sender's last step, which only sends, or a
    combine the sender streams, costs α + s·β1 (both cores move it); a message
    of an exchange, or one sent where ranks outnumber cores, keeps β."""
    k, b1 = 1 << 20, 0.4 * B
    t = topo(1, 2, oneway_at=((1, b1),))
    one = lambda r: [[("send", 1, 0, k)]] if r == 0 else [[("recv", 0, 0, k)]]  # noqa: E731
    assert simulate(t, one, itemsize=1) == pytest.approx(A + k * b1, rel=1e-12)
    assert simulate(topo(1, 2), one, itemsize=1) == pytest.approx(A + k * B, rel=1e-12)
    both = lambda r: [[("send", 1 - r, 0, k), ("recv", 1 - r, 0, k)]]  # noqa: E731
    assert simulate(t, both, itemsize=1) == pytest.approx(A + k * B, rel=1e-12)
    # not its sender's last step: its core goes on to the next one
    first = lambda r: ([[("send", 1, 0, k)], [("recv", 1, 0, 1)]] if r == 0  # noqa: E731
                       else [[("recv", 0, 0, k)], [("send", 0, 0, 1)]])
    assert simulate(t, first, itemsize=1) > A + k * B
    # a streamed combine: the sender's core copies, the receiver's combines (γ < β1 here)
    streamed = registry_sender_copies([[("combine", 0, 0, k)]])
    s = lambda r: [[("send", 1, 0, k)]] if r == 0 else streamed  # noqa: E731
    assert simulate(t, s, itemsize=1) == pytest.approx(A + k * b1 + k * G, rel=1e-12)
    crowded = dataclasses.replace(t, cores=1)   # two ranks on one core: β
    assert simulate(crowded, one, itemsize=1) == pytest.approx(A + k * B, rel=1e-12)
    p = _params(2)
    assert validate.topology(2, p).oneway_at == ((8192, 4e-10), (1 << 20, 1.2e-10))
    assert validate.topology(2, p, terms=("shift",)).oneway_at == ()


def registry_sender_copies(steps):
    from commrt.collectives.registry import Msg, sender_copies

    return sender_copies([[Msg(*m) for m in step] for step in steps])


def test_an_oversubscribed_alpha_is_a_wait_or_a_cores_work():
    """alpha_wait: four ranks on two cores each receive one message at once; as a
    wait α is paid once, in parallel, before the four copies share the cores;
    as work it queues with each copy."""
    k, x = 1 << 16, 50e-6
    steps = shift_steps(4, k)
    one = lambda r: [steps(r)[0]]   # noqa: E731  (d = 1 only)
    work = topo(1, 4, cores=2, alpha_at=((1, x),))
    wait = dataclasses.replace(work, alpha_wait=True)
    assert simulate(work, one, itemsize=1) == pytest.approx(2 * (x + k * B), rel=1e-12)
    assert simulate(wait, one, itemsize=1) == pytest.approx(x + 2 * k * B, rel=1e-12)
    # a core each: α is α_shm either way
    spread = dataclasses.replace(wait, cores=4)
    assert simulate(spread, one, itemsize=1) == pytest.approx(A + k * B, rel=1e-12)


def test_an_oversubscribed_alpha_grows_with_the_ranks_busy_when_it_is_matched():
    """crowd: α fitted to every rank exchanging (x) where all are busy, α_shm where
    no more than the cores are, linear between (Topology.crowded).  A chain of
    eight ranks on two cores, each passing 1 MiB on: the first hop is matched at
    the call's start, every rank busy (x); each later one while only its two
    ranks are (its sender has just started its step; the others are past their
    spin or done): α_shm.  The first hop's sender returned at once (an eager
    send), so seven ranks are busy then, not eight.  Without the term every hop
    pays x."""
    k, x = 1 << 20, 500e-6
    chain = dict(cores=2, alpha_at=((1, x),), alpha_wait=True)
    full = topo(1, 8, **chain)
    crowd = topo(1, 8, crowd_spin=50e-6, **chain)
    assert [crowd.crowded(k, b) for b in (1, 2, 5, 8)] == pytest.approx([A, A, (A + x) / 2, x])
    assert full.crowded(k, 2) == x                     # the term off

    def steps(r):
        recv = [[("recv", r - 1, 0, k)]] if r else []
        return recv + ([[("send", r + 1, 0, k)]] if r < 7 else [])
    assert simulate(full, steps, itemsize=1) == pytest.approx(7 * (x + k * B), rel=1e-12)
    first = crowd.crowded(k, 7)
    assert first == pytest.approx(A + (x - A) * 5 / 6)
    assert simulate(crowd, steps, itemsize=1) == pytest.approx(first + 6 * A + 7 * k * B,
                                                               rel=1e-12)
    # the shift exchange that α is fitted to: ranks waiting for a core past their
    # spin are not busy, so the fit, through the same engine, puts back what
    # the term takes off
    shift = shift_steps(8, 1 << 16)
    took = simulate(full, shift, itemsize=1)
    fitted = fit_alpha(crowd, 1 << 16, took / 7)
    assert fitted > x
    assert simulate(dataclasses.replace(crowd, alpha_at=((1, fitted),)), shift,
                    itemsize=1) == pytest.approx(took, rel=1e-6)


def test_a_combine_alone_on_its_node_takes_gamma_mem_and_beside_another_gamma_busy():
    """gamma_busy: γ_mem of a combine while another rank of the node combines.  A
    binomial reduce's step on two ranks has one combine (rank 0's): γ_mem;
    an exchange that combines both ways has two at once: γ_busy (the one
    booked second sees the first).  Without gamma_busy every one is γ_mem."""
    k, gm = 16 << 20, 2 * G
    alone = topo(1, 2, gamma_mem=gm, gamma_busy=3 * gm)
    assert alone.g(k, together=False) == gm and alone.g(k) == 3 * gm
    assert alone.g(1 << 10, together=True) == G                  # in cache: γ

    def reduce(r):
        return [[("combine", 1, 0, k)]] if r == 0 else [[("send", 0, 0, k)]]

    def exchange(r):
        return [[("send", 1 - r, 0, k), ("combine", 1 - r, 0, k)]]
    assert simulate(alone, reduce, itemsize=1) == pytest.approx(A + k * (B + gm), rel=1e-12)
    assert simulate(alone, exchange, itemsize=1) == pytest.approx(A + k * (B + 3 * gm),
                                                                  rel=1e-12)
    plain = topo(1, 2, gamma_mem=gm)
    assert simulate(plain, exchange, itemsize=1) == pytest.approx(A + k * (B + gm), rel=1e-12)


def test_a_cell_counts_as_planned_only_where_the_run_that_measured_it_had_the_plan():
    """A saved run's mark (forced_plans) says which forced algorithms ran on plans:
    ps got its plan with mark 2, so a replay of a mark-1 run keeps its ps cells
    on the general path (the call's own work charged), and a mark-2 run's
    not; the ring had its plan in both; dbtree got its plan with mark 3."""
    base = topo(1, 3, call=20e-6, alpha_shm=5e-6)
    for algo, mark, planned in (("ps", 1, False), ("ps", 2, True), ("ring", 1, True),
                                ("ring", 2, True), ("dbtree", 2, False),
                                ("dbtree", 3, True)):
        got = validate.cell_topology(base, algo, 3, 64 << 10, mark, alpha_plan=1e-6)
        assert (got.call == 0.0) == planned, (algo, mark)
        assert got.alpha_shm == (1e-6 if planned else 5e-6), (algo, mark)
    assert validate.cell_topology(base, "ps", 3, 64 << 10, None).call == 20e-6


def test_planned_cells_take_the_chained_shift_exchanges_alpha():
    """Where ranks outnumber cores a prepared plan's steps wait as an exchange
    chain's do (each learning its own spin), the general path's as plain
    waits: "chain" fits α per size to the shift exchange run as one chain
    (shift_chain) and gives it to the planned cells only; without the figure
    or the term, the plain shift exchange's α as before."""
    p = _params(4)
    p["shift_chain"] = [[8192, 20e-6], [1 << 20, 500e-6]]
    topo4 = validate.topology(4, p)
    chain_at = validate.plan_alpha_at(topo4, p)
    assert [k for k, _ in chain_at] == [8192, 1 << 20]
    assert all(a >= 0 for _, a in chain_at)
    # a faster pattern fits a smaller α than the plain one at every size
    assert all(c < a for (_, c), (_, a) in zip(chain_at, topo4.alpha_at)), (chain_at,
                                                                           topo4.alpha_at)
    planned = validate.cell_topology(topo4, "ring", 4, 64 << 10, 2, 1e-6, chain_at)
    assert planned.alpha_at == chain_at
    general = validate.cell_topology(topo4, "dbtree", 4, 64 << 10, 2, 1e-6, chain_at)
    assert general.alpha_at == topo4.alpha_at
    assert validate.plan_alpha_at(topo4, p, terms=("shift",)) == ()
    assert validate.plan_alpha_at(validate.topology(2, p), p) == ()     # a core each
    del p["shift_chain"]
    assert validate.plan_alpha_at(topo4, p) == ()


def test_planned_cells_where_each_rank_has_a_core_take_the_chained_exchanges_beta():
    """The pair's exchange run as a one-step exchange chain (beta_chain_at: many
    runs a timing, less α_plan) is the β per size of the cells that ran on a
    plan where each rank has a core ("chain"); the general path's cells, the
    oversubscribed ones (whose plans' α per size is fitted with the plain
    curve) and runs saved without the figure keep the plain exchange's."""
    p = _params(2)
    p["beta_chain_at"] = [[8192, 3e-10], [1 << 20, 1e-10]]
    topo2 = validate.topology(2, p)
    beta_chain = validate.plan_beta_at(topo2, p)
    assert beta_chain == ((8192, 3e-10), (1 << 20, 1e-10))
    planned = validate.cell_topology(topo2, "ring", 2, 64 << 10, 3, 1e-6, (), beta_chain)
    assert planned.beta_at == beta_chain
    general = validate.cell_topology(topo2, "ring", 2, 32 << 20, 3, 1e-6, (), beta_chain)
    assert general.beta_at == topo2.beta_at == ((8192, 5e-10), (1 << 20, 2e-10))
    assert validate.plan_beta_at(topo2, p, terms=("shift",)) == ()
    assert validate.plan_beta_at(validate.topology(4, p), p) == ()        # 4 ranks, 2 cores
    del p["beta_chain_at"]
    assert validate.plan_beta_at(topo2, p) == ()
    # the chained figure moves a planned cell's simulated time the way it says
    fast = {**p, "beta_chain_at": [[8192, 1e-11], [1 << 20, 1e-11]]}
    assert validate.predicted(2, 1 << 20, "ring", fast) < validate.predicted(2, 1 << 20, "ring", p)


def test_the_shift_exchange_runs_on_a_chain_too():
    """validate._shift_times(chained=True) times the same exchanges as one exchange
    chain (a real 3-rank job): a time per exchange for each size, every rank
    agreeing (rank 0's broadcast)."""
    from commrt.testing import World

    with World(3, timeout=60) as w:
        got = w.run(_shift_both, timeout=50)
    assert got[0] == got[1] == got[2]
    plain, chained = got[0]
    assert [k for k, _ in plain] == [k for k, _ in chained] == [8192, 1 << 20]
    assert all(0 < t < 0.05 for _, t in plain + chained), got[0]


def _shift_both(comm):
    sizes = (8192, 1 << 20)
    return (validate._shift_times(comm, sizes), validate._shift_times(comm, sizes, chained=True))


def test_a_combine_that_lands_costs_its_copy_and_the_measured_extra_not_gamma():
    """land_at: a shared-memory receive that combines as it lands (a reduce-receive)
    costs α + s·β(s) + s·land(s) instead of the copy and then s·γ(s); the
    validation gives it only to algorithms whose every combine lands (LANDS),
    only with the "land" term, planned or not."""
    k, x = 1 << 20, 0.1 * G
    both = lambda r: [[("send", 1 - r, 0, k), ("combine", 1 - r, 0, k)]]  # noqa: E731
    assert simulate(topo(1, 2), both, itemsize=1) == pytest.approx(A + k * (B + G), rel=1e-12)
    landed = topo(1, 2, land_at=((1, x),))
    assert simulate(landed, both, itemsize=1) == pytest.approx(A + k * (B + x), rel=1e-12)
    # the uniform shortcut (rank 0's timeline) agrees with the full run
    from commrt.sim import engine
    steps = schedules.steps_of("ring", 8, 1 << 16)
    t = topo(1, 8, land_at=((1, x),))
    short, taken = engine.run(t, steps)
    assert taken and short == pytest.approx(engine.run(t, steps, shortcut=False)[0], rel=1e-12)
    # which algorithms: those whose module says every combine lands
    p = {**_params(2), "land_at": [[8192, 0.0], [1 << 20, 2e-11]]}
    topo2 = validate.topology(2, p)
    for algo in ("ring", "rabenseifner", "dbtree"):
        assert validate.land_topology(topo2, algo, p).land_at == ((8192, 0.0), (1 << 20, 2e-11))
    for algo in ("recursive_doubling", "tree", "reduce_bcast"):
        assert validate.land_topology(topo2, algo, p).land_at == ()
    # the parameter server's combines all land on its plan, not on the general path
    assert validate.land_topology(topo2, "ps", p, planned=True).land_at == \
        ((8192, 0.0), (1 << 20, 2e-11))
    assert validate.land_topology(topo2, "ps", p, planned=False).land_at == ()
    assert validate.land_topology(topo2, "ring", p, terms=("shift",)).land_at == ()
    assert validate.land_topology(topo2, "ring", _params(2)).land_at == ()   # an older run
    # and it moves the simulated time the way it says (γ here is 1e-10 per byte)
    assert validate.predicted(2, 1 << 20, "rabenseifner", p) \
        < validate.predicted(2, 1 << 20, "rabenseifner", _params(2))


def test_a_segment_of_a_call_that_overflows_the_caches_moves_at_the_calls_beta(monkeypatch):
    """footprint: a shared-memory message of a call whose buffers overflow the caches
    moves no faster per byte than β at the call's size (the curve's small sizes
    were measured from buffers the caches hold); the validation sets it only
    where a node's ranks' buffers together reach the last-level cache, only
    with the "footprint" term."""
    seg, big = 1 << 18, 1 << 24
    pts = ((seg, 5e-11), (1 << 22, 4e-11), (big, 1.2e-10))
    t = topo(1, 2, beta_at=pts)
    one = lambda r: [[("send", 1 - r, 0, seg), ("recv", 1 - r, 0, seg)]]  # noqa: E731
    assert simulate(t, one, itemsize=1) == pytest.approx(A + seg * 5e-11, rel=1e-12)
    sized = dataclasses.replace(t, footprint=big)
    assert simulate(sized, one, itemsize=1) == pytest.approx(A + seg * 1.2e-10, rel=1e-12)
    # never faster than its own size's β: a footprint whose β is lower changes nothing
    assert dataclasses.replace(t, footprint=1 << 22).b(seg) == 5e-11
    assert sized.b(big) == t.b(big) and sized.b(1 << 25) == t.b(1 << 25)
    # only β: the one-way, land and γ curves stay per message
    assert dataclasses.replace(sized, oneway_at=pts).b1(seg) == 5e-11
    from commrt.transport import last_cache_bytes
    cache = last_cache_bytes()
    assert validate.sized(t, 2, cache // 2).footprint == cache // 2
    assert validate.sized(t, 2, cache // 4).footprint == 0
    assert validate.sized(t, 2, cache, terms=("shift",)).footprint == 0
    # a validation cell takes it: the ring's segments at N = 2 over a cache's worth
    p = {**_params(2), "beta_at": [list(x) for x in pts]}
    with_it = validate.predicted(2, cache, "ring", p)
    monkeypatch.setattr(validate, "_cache_bytes", lambda: 1 << 40)
    assert validate.predicted(2, cache, "ring", p) < with_it


def test_the_chained_pattern_can_combine_as_it_lands():
    """_pattern_times(chained=True, land=True) runs the pair's exchange as a chain
    whose receive combines float32 SUM as it lands (a real 2-rank job): the
    received values are added into the receive buffer every lap, and it gives
    a time per size like the plain chain's."""
    from commrt.testing import World

    with World(2, timeout=60) as w:
        got = w.run(_land_both, timeout=50)
    assert got[0][0] == got[1][0]
    for times, total in got:
        assert [k for k, _ in times] == [8192, 1 << 20]
        assert all(0 < t < 0.05 for _, t in times)
        assert total > 1   # ones were added in more than once: the receives combined


def _land_both(comm):
    import numpy as np

    sizes = (8192, 1 << 20)
    times = validate._pattern_times(comm, [(1 - comm.rank,) * 2], sizes, target_s=0.02,
                                    chained=True, land=True)
    # one more lap of a landing chain, checked: b = b + a with a all ones
    a, b = np.ones(2048, np.float32), np.full(2048, 5, np.float32)
    from commrt.kernels import combine_address
    lap = validate._chained_lap(comm, [(1 - comm.rank,) * 2], a, b,
                                combine_address("sum", np.dtype(np.float32)))
    lap()
    lap()
    assert (b == 7).all(), b[:4]
    return times, float(b[0])


RATE, BURST = 1.25e8, 36000     # a 1 Gbit/s link with tc's burst of 36000 bytes


def _one_message(nbytes):
    """A call that sends nbytes from node 0 to node 1 (one rank each)."""
    return lambda r: [[("send", 1, 0, nbytes)]] if r == 0 else [[("recv", 0, 0, nbytes)]]


def _shaped(**kw):
    return topo(2, 1, beta_net=1 / RATE, link_rate=RATE, link_burst=BURST, **kw)


def test_a_full_bucket_lets_its_burst_through_at_once():
    t = _shaped(beta_burst=1e-10)
    # under the burst: every byte at the unshaped β
    assert simulate(t, _one_message(20000), itemsize=1) == pytest.approx(2 * A + 20000e-10)
    # beyond it: the rest at the rate
    k = 100000
    assert simulate(t, _one_message(k), itemsize=1) == pytest.approx(2 * A + (k - BURST) / RATE)
    # no rate: the measured β alone, as before the bucket
    plain = topo(2, 1, beta_net=1 / RATE)
    assert simulate(plain, _one_message(k), itemsize=1) == pytest.approx(2 * A + k / RATE)
    assert simulate(dataclasses.replace(t, link_burst=0), _one_message(k), itemsize=1) == \
        simulate(plain, _one_message(k), itemsize=1)


def test_a_loop_of_calls_finds_the_bucket_as_the_last_call_left_it():
    """One message of twice the burst: the first call's bucket is full (B / rate
    sooner); it ends empty, and refills only during α before the second call's
    message leaves, so the second takes exactly its bytes at the rate."""
    t = _shaped()
    k = 2 * BURST
    first = simulate(t, _one_message(k), itemsize=1)
    assert first == pytest.approx(2 * A + BURST / RATE)
    assert simulate(t, _one_message(k), itemsize=1, calls=2) == pytest.approx(k / RATE)
    # where the calls leave the link idle long enough, every call finds it full
    slow = dataclasses.replace(t, call=1e-3)
    assert simulate(slow, _one_message(k), itemsize=1, calls=3) == \
        pytest.approx(simulate(slow, _one_message(k), itemsize=1))
    with pytest.raises(ValueError, match="calls"):
        simulate(t, _one_message(k), calls=0)


def test_the_symmetry_shortcut_keeps_the_bucket_exact():
    """Rank 0's timeline alone (uniform) and every rank's give the same time with
    shaped links, one call and a loop's second."""
    t = dataclasses.replace(_shaped(beta_burst=2e-9), nodes=4)
    steps = schedules.steps_of("rabenseifner", 4, 1 << 15)
    for calls in (1, 2):
        fast = simulate(t, steps, calls=calls)
        assert fast == pytest.approx(simulate(t, steps, shortcut=False, calls=calls))
    assert simulate(t, steps, calls=2) > simulate(t, steps)    # the second finds less


def test_hosts_topology_takes_the_links_shaping_and_the_bursts_beta():
    idle = [[8, 20e-6], [8192, 30e-6], [16384, 40e-6], [24576, 50e-6]]
    assert validate.burst_beta(idle) == pytest.approx(10e-6 / 8192, rel=1e-3)
    p = dict(_params(2), alpha_net=40e-6, beta_net=8e-9, link={"rate": RATE, "burst": BURST},
             sim={"cores": 2, "burst": idle, "net": [[8, 50e-6, 20e-6], [1 << 20, 9e-3, 1e-3]],
                  "shm": [[8, 9e-6, 9e-6], [1 << 16, 30e-6, 30e-6]]})
    t = validate.hosts_topology(2, 2, p)
    assert (t.link_rate, t.link_burst) == (RATE, BURST)
    assert t.beta_burst == pytest.approx(10e-6 / 8192, rel=1e-3)
    assert validate.hosts_topology(2, 2, p, ()).link_rate is None
    # a run saved before the calibration measured the burst: no bucket
    old = dict(p, sim=dict(p["sim"], burst=None))
    assert validate.hosts_topology(2, 2, old).link_rate is None
    steps = schedules.steps_of("ring", 4, 1 << 14, ranks_per_node=2)
    assert validate.in_a_loop(t, steps) == simulate(t, steps, calls=2)
    assert validate.in_a_loop(validate.hosts_topology(2, 2, old), steps) == \
        simulate(validate.hosts_topology(2, 2, old), steps)


def test_tc_rates_and_sizes_in_bytes():
    from commrt.bench import _netns

    assert _netns.rate_bytes("1gbit") == 1.25e8 and _netns.rate_bytes("800mbit") == 1e8
    assert _netns.rate_bytes("125mbps") == 1.25e8
    assert _netns.size_bytes("36000b") == 36000 and _netns.size_bytes("32kb") == 32768
    for bad in ("fast", "10", "1gbits"):
        with pytest.raises(ValueError, match="rate"):
            _netns.rate_bytes(bad)


def test_tokens_never_make_a_message_slower_than_its_measured_beta():
    """Where the link's rate does not bind (β_net above 1/rate: the CPUs set the
    time) and the burst's bytes measured slower still, the measured β holds."""
    t = topo(2, 1, beta_net=2e-9, link_rate=1.25e9, link_burst=BURST, beta_burst=3e-9)
    plain = topo(2, 1, beta_net=2e-9)
    for k in (20000, 100000):
        assert simulate(t, _one_message(k), itemsize=1) == \
            simulate(plain, _one_message(k), itemsize=1)
