"""Liveness: a stopped rank is named by every survivor within 10 s (the GIL-free
heartbeat), while a rank that computes or sleeps for long is never blamed."""
import os
import signal

import pytest

from commrt.testing import World

import wire_ranks as W


@pytest.mark.timeout(120)
# TCP's is long (COMMRT_LONG_TESTS): tests/faults/test_stop_rank.py stops a rank on both
@pytest.mark.parametrize("transport", ["shm", pytest.param("tcp", marks=pytest.mark.long)])
def test_stopped_rank_is_named_by_every_survivor_within_10_s(transport, tmp_path):
    stamp = tmp_path / "stopped_at"
    with World(3, transport=transport, timeout=90) as w:
        try:
            res = w.run(W.wait_for_silent, 2, 60.0, str(stamp), 3.0, timeout=80)
        finally:
            try:
                os.kill(w.pids[2], signal.SIGCONT)
            except ProcessLookupError:
                pass
            w.kill(2)
    stopped_at = float(stamp.read_text())
    for rank in (0, 1):
        kind, msg, t, culprit = res[rank]
        assert kind == "PeerUnresponsiveError", (rank, kind, msg)
        assert culprit == 2 and "lost peer rank 2" in msg and "no heartbeat for" in msg, msg
        took = t - stopped_at
        print(f"{transport}: rank {rank} named rank 2 {took:.1f} s after SIGSTOP")
        assert took <= 10.0, (rank, took)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_rank_computing_or_sleeping_is_not_blamed(transport):
    # the computing rank holds the GIL for 3 s, then sleeps 2 s: over three liveness timeouts
    env = {"COMMRT_LIVENESS_TIMEOUT_S": "1.5", "COMMRT_HEARTBEAT_S": "0.25"}
    with World(2, transport=transport, env=env, timeout=90) as w:
        res = w.run(W.compute_then_answer, 3.0, 2.0, timeout=90)
        assert res[0] == 1 and res[1] > 0
        assert w.run(W.meta_words, 8)[1]["send"] == (W.HI, W.HI - 1)     # still healthy


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_whose_beat_thread_cannot_have_the_lock_still_beats(transport):
    """Rank 1 holds its engine lock for three liveness timeouts while driving
    progress: its beat thread misses every round, and its progress passes pay
    the TCP beats it owes, so rank 0 never finds it silent."""
    env = {"COMMRT_LIVENESS_TIMEOUT_S": "1.5", "COMMRT_HEARTBEAT_S": "0.25"}
    with World(2, transport=transport, env=env, timeout=90) as w:
        res = w.run(W.drive_holding_lock_then_answer, 4.5, timeout=90)
        assert res[0] == 1
        if transport == "tcp":      # shared memory beats without the lock
            assert res[1]["beats_paid"] >= 8, res[1]
        assert w.run(W.meta_words, 8)[1]["send"] == (W.HI, W.HI - 1)     # still healthy
