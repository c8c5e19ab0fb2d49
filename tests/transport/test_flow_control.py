"""Flow control: memory for unexpected messages is bounded per peer (credits),
nothing is lost or reordered, and two ranks that both send first end in a
clear timeout naming both, never a hang."""
import pytest

from commrt.testing import World

import wire_ranks as W

BOUND = 4 << 20                 # COMMRT_UNEXPECTED_BYTES, its default


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_flood_of_unmatched_messages_stays_bounded(transport):
    count, nbytes = 100_000, 8192
    with World(2, transport=transport, timeout=500) as w:
        res = w.run(W.flood, count, nbytes, 3.0, timeout=500)[1]
    print(transport, {k: (v / 2**20 if isinstance(v, int) and v > 4096 else v)
                      for k, v in res.items()})
    assert res["in_order"] and res["left"] == 0
    assert 0 < res["held_peak"] <= BOUND                # the flood was held, up to the grant
    limit = res["base"] + 2 * BOUND
    assert res["peak"] <= limit, res
    assert res["drain_peak"] <= limit, res
    assert res["after"] <= limit, res


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
