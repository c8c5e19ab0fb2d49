"""Cancellation: a blocking receive that timed out or was interrupted is unposted
(the next matching message is not lost into the abandoned buffer), and
Request.cancel has MPI_Cancel's semantics for receives."""
import pytest

from commrt.testing import World

import comm_ranks as R


@pytest.fixture(scope="module", params=["shm", "tcp"])
def world2(request):
    with World(2, transport=request.param, timeout=60) as w:
        yield w


def test_timed_out_recv_does_not_swallow_the_next_message(world2):
    res = world2.run(R.timed_out_recv_loses_nothing, timeout=50)
    assert res[0] == ("CommTimeoutError", [7.0] * 4, 32), res[0]


def test_interrupted_recv_does_not_swallow_the_next_message(world2):
    res = world2.run(R.interrupted_recv_loses_nothing, timeout=50)
    assert res[0] == ("interrupted", [5.0] * 4), res[0]


def test_request_cancel(world2):
    r0, sent_cancel = world2.run(R.cancel_semantics, timeout=50)
    assert sent_cancel is False                     # a send is never cancelled
    assert r0["cancel_unmatched"] is True and r0["cancelled"] is True
    assert "cancelled" in r0["wait"]
    assert r0["cancel_again"] is False
    assert r0["cancel_matched"] is False            # matched: completes normally
    assert r0["b"] == (16, [1.0, 1.0])              # the message went to the next receive
    assert r0["c"] == [2.0, 2.0]
    assert r0["big"] == 3.0
