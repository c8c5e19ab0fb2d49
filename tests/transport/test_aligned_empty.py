"""transport/buffers.aligned_empty: the memory commrt allocates for messages
starts where PyTorch's tensors and the benchmarks' buffers do."""
import numpy as np
import pytest

from commrt.transport.buffers import ALIGN, aligned_empty


@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32", "complex128"])
@pytest.mark.parametrize("count", [1, 3, 4097, 1 << 20])
def test_start_size_and_type(count, dtype):
    for _ in range(20):         # heap and mmap placements alike
        a = aligned_empty(count, dtype)
        assert a.ctypes.data % ALIGN == 0
        assert a.shape == (count,) and a.dtype == np.dtype(dtype)
        assert a.flags.c_contiguous and a.flags.writeable
        a[:] = 7                  # its whole length is ours
        assert (a == 7).all()


def test_other_alignments():
    for align in (16, 128, 4096):
        assert aligned_empty(1000, np.float64, align).ctypes.data % align == 0


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
def test_from_a_huge_page_on_a_mapping_of_its_own(dtype, thp_mode, pages_under):
    """From HUGE_MIN bytes on: a private mapping of its own on a huge page's
    boundary, advised to huge pages (their pages do not depend on what the
    process freed before); written whole, read back."""
    from commrt.transport.buffers import HUGE_MIN

    item = np.dtype(dtype).itemsize
    for nbytes in (HUGE_MIN, 3 * HUGE_MIN + 4096):
        a = aligned_empty(nbytes // item, dtype)
        assert a.ctypes.data % HUGE_MIN == 0 and a.nbytes == nbytes
        a[:] = 3
        assert (a == 3).all()
        start, end, _, eligible = pages_under(a)
        assert end - start >= nbytes
        if thp_mode != "never":
            assert eligible == "1"
    below = aligned_empty(HUGE_MIN // 2, np.uint8)
    assert below.ctypes.data % ALIGN == 0
    assert aligned_empty(HUGE_MIN, np.uint8, align=3 * HUGE_MIN).ctypes.data % (3 * HUGE_MIN) == 0


def test_the_mapping_goes_with_its_last_view():
    """The array keeps its mapping; once the last view is gone the mapping is
    unmapped (no leak per scratch buffer replaced): the process's virtual size
    falls by what the mappings took."""
    import gc

    from commrt.transport.buffers import HUGE_MIN, mapped_zeros

    def virtual_kb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))

    views = [mapped_zeros(HUGE_MIN, True)[1:] for _ in range(8)]
    assert not any(v.any() for v in views)
    held = virtual_kb()
    del views
    gc.collect()
    # each mapping is its buffer plus a huge page of room: 8 x 4 MiB
    assert virtual_kb() <= held - 8 * 2 * HUGE_MIN // 1024 + 1024
