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
