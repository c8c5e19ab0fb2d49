"""The transport's local copy (``_core.copy_into``, Channel.copy): the bytes land
whole, in one memcpy or in pieces, overlapping ranges too; a wrong size or
buffer is refused before anything is written."""
import numpy as np
import pytest

from commrt.transport import _core


@pytest.fixture
def pieces():
    """Copies of 1 KiB up in 256-byte pieces (the real ones: 512 KiB pieces
    from the last-level cache's size up), restored afterwards."""
    old = _core._set_copy_piece(256, 1024)
    yield
    _core._set_copy_piece(*old)


SIZES = [0, 1, 255, 256, 511, 512, 1023, 1024, 1025, 4096 + 7, 70000, (1 << 20) + 3]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["default", "pieces"])
def test_every_byte_lands(n, mode, request):
    if mode == "pieces":
        request.getfixturevalue("pieces")
    rng = np.random.default_rng(n)
    src = rng.integers(0, 256, n, dtype=np.uint8)
    dst = np.full(n + 16, 0xAB, np.uint8)
    _core.copy_into(dst[8:8 + n], src)
    assert np.array_equal(dst[8:8 + n], src)
    assert (dst[:8] == 0xAB).all() and (dst[8 + n:] == 0xAB).all()    # nothing beyond


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shift", [-4099, -1, 1, 300, 4099])
def test_overlapping_ranges_copy_as_memmove(shift, pieces):
    a = np.arange(20000, dtype=np.uint32).view(np.uint8)
    want = a.copy()
    n = a.size - abs(shift)
    lo, hi = (0, shift) if shift > 0 else (-shift, 0)      # dst at hi, src at lo
    want[hi:hi + n] = want[lo:lo + n].copy()
    _core.copy_into(a[hi:hi + n], a[lo:lo + n])
    assert np.array_equal(a, want)


@pytest.mark.timeout(30)
def test_typed_arrays_copy_their_bytes(pieces):
    src = np.linspace(-1, 1, 3000, dtype=np.float64).reshape(30, 100)
    dst = np.zeros((30, 100))
    _core.copy_into(dst, src)
    assert np.array_equal(dst, src)


@pytest.mark.timeout(30)
def test_bad_buffers_are_refused_and_nothing_written():
    dst = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="dst holds 40 bytes, src 44"):
        _core.copy_into(dst, np.ones(11, np.float32))
    assert not dst.any()
    ro = np.zeros(10, np.float32)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only"):   # NumPy's words
        _core.copy_into(ro, np.ones(10, np.float32))
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        _core.copy_into(dst, np.ones(20, np.float32)[::2])
    with pytest.raises((BufferError, ValueError), match="contiguous"):     # Fortran order
        _core.copy_into(np.zeros((4, 5), np.float32).T, np.ones((5, 4), np.float32))
    assert not dst.any()


@pytest.mark.timeout(30)
def test_last_cache_is_read_from_sysfs(tmp_path):
    for i, (kind, level, size) in enumerate([("Data", 1, "32K"), ("Instruction", 1, "32K"),
                                             ("Unified", 2, "1024K"), ("Unified", 3, "16M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "type").write_text(kind + "\n")
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(size + "\n")
    assert _core._last_cache_bytes(str(tmp_path)) == 16 << 20
    assert _core._last_cache_bytes(str(tmp_path / "missing")) == 32 << 20
    from commrt.transport import last_cache_bytes      # the transport's public name
    assert last_cache_bytes() == _core._last_cache_bytes() > 0
