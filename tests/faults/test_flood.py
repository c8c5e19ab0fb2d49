"""A flood of 10^5 unmatched 8 KiB messages (flow control, docs/reliability.md):
the receiver's resident memory stays within its baseline + 2x the bound
(COMMRT_UNEXPECTED_BYTES) while they arrive unmatched, while it drains them and
after; nothing is lost, nothing reordered.  Before flow control the receiver
grew by 792 MiB."""
import pytest

from commrt.testing import World

import campaign_ranks as R

BOUND = 4 << 20                 # COMMRT_UNEXPECTED_BYTES, its default


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_flood_of_unmatched_messages_stays_bounded(transport, figure):
    count, nbytes = 100_000, 8192
    with World(2, transport=transport, timeout=500) as w:
        res = w.run(R.flood, count, nbytes, 3.0, timeout=500)[1]
    base = res["base"]
    figure("flood", transport=transport, count=count, nbytes=nbytes, bound=BOUND,
           held_peak=res["held_peak"], peak_over=res["peak"] - base,
           drain_over=res["drain_peak"] - base, after_over=res["after"] - base)
    assert res["in_order"] and res["left"] == 0
    assert 0 < res["held_peak"] <= BOUND                # the flood was held, up to the grant
    limit = base + 2 * BOUND
    assert res["peak"] <= limit, res
    assert res["drain_peak"] <= limit, res
    assert res["after"] <= limit, res
