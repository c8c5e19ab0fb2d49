"""The call history (collectives/_entry.pyx History) reads as the deque(maxlen=256)
of (seq, meta, meta2) tuples it replaced: the mismatch reports and the cost
model's calibration read, trim and restore it."""
import collections

import pytest

from commrt.collectives._entry import History


def entries(k):
    return [(i, (1 << 63) | (i * 7), (1 << 64) - 1 - i) for i in range(k)]


@pytest.mark.parametrize("k", [0, 1, 255, 256, 257, 600])
def test_history_reads_as_a_bounded_deque(k):
    h, d = History(), collections.deque(maxlen=256)
    for e in entries(k):
        h.append(e)
        d.append(e)
    assert len(h) == len(d)
    assert list(h) == list(d)
    assert list(reversed(h)) == list(reversed(d))


def test_pop_clear_and_extend_as_a_deque():
    h, d = History(), collections.deque(maxlen=256)
    h.extend(entries(300))
    d.extend(entries(300))
    for _ in range(3):
        assert h.pop() == d.pop()
    h.append((9, 9, 9))
    d.append((9, 9, 9))
    assert list(h) == list(d)
    saved = list(h)
    h.clear()
    assert len(h) == 0 and list(h) == []
    with pytest.raises(IndexError):
        h.pop()
    h.extend(saved)
    assert list(h) == saved


def test_values_out_of_range_are_refused():
    h = History()
    with pytest.raises(OverflowError):
        h.append((0, 1 << 64, 0))
    with pytest.raises(ValueError):
        h.append((0, 1))
    assert len(h) == 0
