"""Communicator.abort and the abort that spreads a collective's failure: every rank
fails with the same typed error, naming the rank that failed first."""
import time

import pytest

from commrt.collectives import ALGORITHMS
from commrt.collectives.all_reduce import hierarchical
from commrt.errors import FailureCode
from commrt.testing import World

import comm_ranks as R

ENV = {"COMMRT_COLL_PROBE_S": "0.5"}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_abort_fails_pending_and_later_operations_everywhere(transport):
    with World(3, transport=transport, env=ENV, timeout=60) as w:
        res = w.run(R.abort_by_rank1, timeout=50)
    pending = [res[0]["recv"], res[2]["coll"]]
    for r in pending:
        assert r is not None and r["type"] == "AbortedError", r
        assert r["code"] == FailureCode.ABORTED and r["rank"] == 1, r
        assert "stop now" in r["msg"], r
        assert r["s"] < 10, r                       # at once, not at the 30 s deadline
    for rank, r in enumerate(res):
        for what in ("later_send", "later_irecv", "later_coll", "later_barrier"):
            e = r[what]
            assert e is not None and e["type"] == "AbortedError", (rank, what, e)
            assert e["code"] == FailureCode.ABORTED and e["rank"] == 1, (rank, what, e)
        assert r["sub"] == 3.0                      # a sub-communicator is not affected


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_communicator_abort_heard_through_a_relay_fails_point_to_point_too(transport):
    """Communicator.abort poisons both contexts in one message; a rank that hears it
    first from another rank's relay (its collective failing) must find its
    point-to-point context aborted too.  Before, the relay carried only the
    collective context: a later send went through (seen once in the suite,
    test_abort_fails_pending_and_later_operations_everywhere over TCP)."""
    with World(3, transport=transport, env=ENV, timeout=60) as w:
        res = w.run(R.abort_heard_through_a_relay, timeout=50)
    for rank in (0, 2):
        for what in ("coll", "later_send", "later_recv", "later_coll"):
            e = res[rank][what]
            assert e is not None and e["type"] == "AbortedError", (rank, what, e)
            assert e["code"] == FailureCode.ABORTED and e["rank"] == 1, (rank, what, e)
            assert e["s"] < 10, (rank, what, e)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_timeout_on_one_rank_aborts_the_collective_everywhere(transport):
    # a probe interval past the bound below: the others hear the abort at once,
    # not at their next probe
    with World(3, transport=transport, env={"COMMRT_COLL_PROBE_S": "10"}, timeout=60) as w:
        t0 = time.monotonic()
        res = w.run(R.one_rank_times_out, timeout=50)
        took = time.monotonic() - t0
    assert res[0]["type"] == "CommTimeoutError", res[0]
    culprit = res[0]["rank"]
    for rank in (1, 2):
        r = res[rank]
        assert r["type"] == "CommTimeoutError", (rank, r)   # the same error ...
        assert r["rank"] == culprit, (rank, r, culprit)      # ... naming the same rank
        assert "rank 0" in r["msg"], r
        assert r["s"] < 5, r                 # not their 60 s deadline, nor their probe
    for r in res:                                              # and it stays aborted
        assert r["later"] is not None and r["later"]["code"] == FailureCode.TIMEOUT, r
    assert took < 40


@pytest.mark.parametrize("nbytes", [64, 1 << 19])
def test_a_timeout_aborts_every_collective_and_algorithm_everywhere(nbytes):
    """Every collective by every algorithm (each on a fresh group): rank 0 times out
    (no other rank has called yet), the others fail within seconds, not at
    their 30 s deadline nor at their next probe, all with the timeout, naming
    the same rank.  At 64 B
    rank 0 may finish alone where it only sends (eager messages: a broadcast's
    root); then no rank fails."""
    cases = [(kind, algo) for kind, algos in ALGORITHMS.items() for algo in algos]
    # a probe interval past the bound below: a rank that heard the abort only
    # at its next probe, not at once, fails the test; and heartbeats far apart
    # (the beat thread reads what peers sent): a rank whose part only sends
    # must read the abort itself, not be saved by a beat that came in time
    env = {"COMMRT_COLL_PROBE_S": "10", "COMMRT_HEARTBEAT_S": "20"}
    with World(3, transport="shm", env=env, timeout=60) as w:
        res = w.run(R.each_algorithm_times_out, cases, nbytes, timeout=len(cases) * 5)
    for i, case in enumerate(cases):
        first = res[0][i]
        if first is None and nbytes <= 64:
            assert res[1][i] is None and res[2][i] is None, (case, res[1][i], res[2][i])
            continue
        assert first is not None and first["type"] == "CommTimeoutError", (case, first)
        for rank in (1, 2):
            r = res[rank][i]
            assert r is not None and r["type"] == "CommTimeoutError", (case, rank, r)
            assert r["rank"] == first["rank"], (case, rank, r, first)
            assert r["s"] < 5, (case, rank, r)          # not their 30 s deadline


def test_a_timeout_reaches_planned_calls_now_or_at_the_next_call():
    """Small calls on prepared plans (no timeout=): where rank 0 times out, a rank
    whose part of the call needs a message fails in it; one whose part only
    sends (a gather's or a reduce's leaves: heartbeats 20 s apart, so no beat
    read the abort) may finish it, and then its next collective raises the
    same timeout.  A broadcast's root finishes alone and nobody fails."""
    kinds = ["gather", "reduce", "gatherv", "all_reduce", "broadcast"]
    env = {"COMMRT_COLL_PROBE_S": "10", "COMMRT_HEARTBEAT_S": "20"}
    with World(3, transport="shm", env=env, timeout=60) as w:
        res = w.run(R.planned_calls_time_out, kinds, timeout=50)
    for i, kind in enumerate(kinds):
        first = res[0][i][0]
        if kind == "broadcast":
            assert all(r[i] == (None, None) for r in res), (kind, [r[i] for r in res])
            continue
        assert first is not None and first["type"] == "CommTimeoutError", (kind, first)
        for rank in range(3):
            now, later = res[rank][i]
            for e in (now, later) if now is not None else (later,):
                assert e is not None and e["type"] == "CommTimeoutError", (kind, rank, e)
                assert e["rank"] == first["rank"] and e["s"] < 5, (kind, rank, e, first)
            if kind == "all_reduce":                 # it needs rank 0's message
                assert now is not None, (kind, rank)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nbytes", [64, 1 << 19])
def test_a_mismatch_fails_every_collective_and_algorithm_everywhere(transport, nbytes):
    """Every collective by every algorithm (each on a fresh group), rank 1's count
    one more than the others': every rank raises CollectiveMismatchError
    within seconds (hierarchical's ranks waiting in another group's step hear
    it on the call's context), or, where its part of the call only sent, in the next
    collective.  Never a timeout, never a result."""
    cases = [(kind, algo) for kind, algos in ALGORITHMS.items() for algo in algos
             if kind != "barrier"]
    with World(3, transport=transport, env=ENV, timeout=60) as w:
        res = w.run(R.each_algorithm_mismatched, cases, nbytes, timeout=len(cases) * 5)
    for i, case in enumerate(cases):
        for rank in range(3):
            now, later = res[rank][i]
            err = now or later
            assert err is not None and err["type"] == "CollectiveMismatchError", \
                (case, rank, now, later)
            assert now is None or now["s"] < 5, (case, rank, now)


def test_a_dead_rank_fails_every_collective_and_algorithm():
    """Every collective by every algorithm, 512 KiB a rank: the last rank is
    killed while the others wait in the call; each survivor either finished
    its part (it needed nothing more from the dead rank) or fails within
    seconds with PeerLostError naming it, and at least one fails."""
    for kind, algos in ALGORITHMS.items():
        for algo in algos:
            w = World(3, transport="shm", env=ENV, timeout=60).start()
            try:
                for conn in w._conns:
                    conn.send((R.rank_dies_in, (2, kind, algo, 1 << 19), {}))
                deadline = time.monotonic() + 30
                res = []
                for rank in (0, 1):
                    status, value = w._receive(rank, deadline)
                    assert status == "ok", (kind, algo, rank, value)
                    res.append(value)
            finally:
                w.close()
            assert any(r is not None for r in res), (kind, algo, res)
            for r in res:
                if r is not None:
                    assert r["type"] == "PeerLostError" and r["rank"] == 2, (kind, algo, r)
                    assert r["s"] < 5, (kind, algo, r)


HIERARCHICAL = [("all_reduce", "hierarchical")]
HOSTS = [0, 0, 1, 1, 2, 2]          # world rank -> pretend host


@pytest.mark.parametrize("nbytes", [64, 1 << 20])
def test_hierarchical_across_hosts_fails_every_rank_of_every_step(nbytes):
    """Three hosts of two ranks (hierarchical's host seam), so the host reduce, the
    leaders' ring and the host broadcast all run: a timeout on rank 0 and a
    count that differs on rank 3 (not a leader) fail every rank within seconds,
    those waiting in another host's or the leaders' step too, naming the same
    rank; so does killing a leader (rank 2) inside the call."""
    env = {"COMMRT_COLL_PROBE_S": "10"}      # an abort is heard at once, not at a probe
    with World(6, transport="shm", env=env, timeout=60) as w:
        w.run(hierarchical.pretend_hosts, HOSTS)
        late = w.run(R.each_algorithm_times_out, HIERARCHICAL, nbytes, timeout=30)
        differ = w.run(R.each_algorithm_mismatched, HIERARCHICAL, nbytes, timeout=30)
    for rank, (r,) in enumerate(late):
        assert r is not None and r["type"] == "CommTimeoutError", (rank, r)
        assert r["rank"] == late[0][0]["rank"], (rank, r, late[0])
        assert r["s"] < 5, (rank, r)
    for rank, ((now, later),) in enumerate(differ):
        err = now or later
        assert err is not None and err["type"] == "CollectiveMismatchError", (rank, now, later)
        assert now is None or now["s"] < 5, (rank, now)

    w = World(6, transport="shm", env=ENV, timeout=60).start()
    try:
        w.run(hierarchical.pretend_hosts, HOSTS)
        for conn in w._conns:
            conn.send((R.rank_dies_in, (2, "all_reduce", "hierarchical", nbytes), {}))
        deadline = time.monotonic() + 30
        res = {}
        for rank in (0, 1, 3, 4, 5):
            status, value = w._receive(rank, deadline)
            assert status == "ok", (rank, value)
            res[rank] = value
    finally:
        w.close()
    for rank, r in res.items():      # every survivor needs the leader's part of the sum
        assert r is not None and r["type"] == "PeerLostError" and r["rank"] == 2, (rank, r)
        assert r["s"] < 5, (rank, r)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_survivor_names_the_rank_that_died_first(transport):
    """Rank 2 is SIGKILLed; rank 0 leaves as soon as it sees the failure.  The
    others must blame rank 2, never rank 0 that merely left."""
    w = World(4, transport=transport, env=ENV, timeout=60).start()
    try:
        for conn in w._conns:
            conn.send((R.rank2_dies_in_collectives, (1 << 16,), {}))
        deadline = time.monotonic() + 45
        res = {}
        for rank in (0, 1, 3):
            kind, value = w._receive(rank, deadline)
            assert kind == "ok", value
            res[rank] = value
    finally:
        w.close()
    for rank, r in res.items():
        assert r["type"] == "PeerLostError", (rank, r)
        assert r["rank"] == 2, (rank, r)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_told_of_a_failure_passes_it_on_before_it_leaves(transport):
    """The first failure's abort may reach a rank late, on another channel, after a
    rank that was told of it has left: the rank that leaves passes it on first, so
    its departure is never blamed (issue 15, cascade blame)."""
    with World(3, transport=transport, env=ENV, timeout=60) as w:
        res = w.run(R.told_rank_leaves, timeout=50)
    for rank in (0, 1):
        r = res[rank]
        assert r is not None and r["type"] == "AbortedError", (rank, r)
        assert r["code"] == FailureCode.ERROR and r["rank"] == 2, (rank, r)
        assert "rank 2 failed first" in r["msg"], (rank, r)
