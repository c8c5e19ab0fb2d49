"""Reduction.first (dst = src OP dst) keeps the left operand's bits where the
operands differ in them, with the C loop and without one (float16)."""
import numpy as np
import pytest

from commrt.collectives.reduction import Reduction


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("kernel", ["min", "max", "sum"])
def test_first_takes_src_as_the_left_operand_in_place(dtype, kernel):
    dtype = np.dtype(dtype)
    red = Reduction(None, kernel, dtype, False)
    src = np.array([0.0, -0.0, 1.5, -2.0], dtype)
    dst = np.array([-0.0, 0.0, 2.5, -3.0], dtype)
    want = src.copy()
    red(want, dst)                        # src OP dst, into a copy of src
    kept = dst                            # first() works in place, on dst itself
    red.first(dst, src)
    assert dst is kept
    assert dst.tobytes() == want.tobytes()
    assert src.tobytes() == np.array([0.0, -0.0, 1.5, -2.0], dtype).tobytes()
