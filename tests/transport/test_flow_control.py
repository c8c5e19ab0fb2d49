"""Flow control: two ranks that both send first end in a clear timeout naming
both, never a hang; messages to oneself are bounded like a peer's.  (A flood
of 10^5 unmatched messages staying within the bound, nothing lost, in order:
tests/faults/test_flood.py, part of the fault campaign.)"""
import pytest

from commrt.testing import World

import wire_ranks as W

@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_both_ranks_sending_first_time_out_naming_both(transport):
    with World(2, transport=transport, timeout=90) as w:
        msgs = w.run(W.both_send_first, 2000, 8192, 3.0, timeout=90)
    for rank, msg in enumerate(msgs):
        assert msg is not None, "sends never blocked: the bound did not hold"
        assert "timed out after 3 s" in msg
        assert f"rank {rank}'s message to rank {1 - rank}" in msg, msg
        assert "sendrecv or non-blocking sends" in msg


# -- messages to oneself: the same bound as any peer's -------------------------------
SELF_GRANT = 1 << 16            # MIN_CREDIT: the smallest grant, so a few messages fill it


@pytest.fixture
def alone():
    from commrt.transport._core import Engine

    eng = Engine(0, 1, credit_bytes=SELF_GRANT, timeout=30.0)
    eng.start()
    yield eng
    eng.close()


def test_messages_to_oneself_are_held_beyond_the_bound_not_copied(alone):
    """isend to oneself used to copy every message at once, without bound; beyond
    the grant they now wait, uncopied, for their receives, in send order."""
    import numpy as np

    count, nbytes = 200, 8192                       # 1.6 MB against a 64 KiB grant
    msgs = [np.full(nbytes, i % 251, np.uint8) for i in range(count)]
    sends = [alone.isend(m, 0, 7, 3) for m in msgs]
    info = alone.memory_info()
    assert info["unexpected_bytes"] <= SELF_GRANT, info
    assert info["sends_held_for_credit"] >= count - SELF_GRANT // nbytes, info
    assert not sends[-1].test()                     # waits for its receive
    got = np.empty(nbytes, np.uint8)
    for i in range(count):
        st = alone.irecv(got, 0, 7, 3).wait(10)
        assert st.nbytes == nbytes and (got == i % 251).all(), i    # in order, intact
        assert alone.memory_info()["unexpected_bytes"] <= SELF_GRANT
    for s in sends:
        s.wait(10)
    assert alone.memory_info()["sends_held_for_credit"] == 0


def test_a_message_to_oneself_larger_than_the_bound_goes_straight_to_its_receive(alone):
    import numpy as np

    big = np.arange(1 << 18, dtype=np.uint32)        # 1 MiB: more than the whole grant
    s = alone.isend(big, 0, 7, 4)
    assert alone.memory_info()["unexpected_bytes"] == 0      # not copied
    out = np.zeros_like(big)
    alone.recv(out, 0, 7, 4, timeout=10)
    s.wait(10)
    assert (out == big).all()


def test_a_blocking_send_to_oneself_past_the_bound_times_out_saying_why(alone):
    import numpy as np

    from commrt.errors import CommTimeoutError

    msg = np.zeros(8192, np.uint8)
    with pytest.raises(CommTimeoutError) as exc:
        for _ in range(SELF_GRANT // 8192 + 2):
            alone.send(msg, 0, 7, 5, timeout=0.5)
    text = str(exc.value)
    assert "rank 0's message to itself waits for its matching receive" in text, text
    assert "post the receive first" in text, text


def test_sends_to_oneself_waiting_fail_on_abort_and_close(alone):
    import numpy as np

    from commrt.errors import AbortedError, CommError

    msg = np.zeros(1 << 17, np.uint8)               # above the grant: waits at once
    on_aborted = alone.isend(msg, 0, 8, 1)
    on_open = alone.isend(msg, 0, 10, 1)
    alone.abort(8, [], "stop")
    with pytest.raises(AbortedError, match="stop"):
        on_aborted.wait(5)
    assert not on_open.test()
    alone.close()
    with pytest.raises(CommError, match="closed with this operation pending"):
        on_open.wait(5)
