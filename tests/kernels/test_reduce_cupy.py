"""CuPy reduction kernels on a real GPU; skipped, with the reason, where there is none."""
import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="cupy is not installed")
try:
    _gpu = cupy.cuda.is_available()
except Exception:  # noqa: BLE001 - a broken driver is 'no GPU' here
    _gpu = False
pytestmark = pytest.mark.skipif(not _gpu, reason="cupy.cuda.is_available() is False: no GPU")

from commrt.kernels import reduce_into, reduce_into_many, scale_into  # noqa: E402

ORACLE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "land": np.logical_and, "lor": np.logical_or, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor}


@pytest.mark.parametrize("op", list(ORACLE))
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int32, np.uint64, np.float16,
                                   np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1000, 1 << 20])
def test_cupy_reduce_into(op, dtype, n):
    if np.dtype(dtype).kind == "f" and op in ("band", "bor", "bxor"):
        pytest.skip("bitwise ops are not defined on floats")
    rng = np.random.default_rng(n)
    if np.dtype(dtype).kind in "biu":
        a = rng.integers(0, 100, n).astype(dtype)
        b = rng.integers(0, 100, n).astype(dtype)
    else:
        a = (rng.standard_normal(n) * 10).astype(dtype)
        b = (rng.standard_normal(n) * 10).astype(dtype)
    if dtype is np.float16 and op in ("sum", "prod"):
        want = ORACLE[op](a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    else:
        want = ORACLE[op](a, b).astype(dtype)
    d = cupy.asarray(a)
    reduce_into(d, cupy.asarray(b), op)
    np.testing.assert_array_equal(cupy.asnumpy(d), want)


def test_cupy_float16_accumulates_in_float32_and_scale():
    d = cupy.asarray(np.array([2048.0], np.float16))
    reduce_into_many(d, [cupy.asarray(np.array([1.0], np.float16))] * 2, "sum")
    assert float(d[0]) == 2050.0
    x = cupy.asarray(np.array([7, -7], np.int32))
    scale_into(x, 2)
    np.testing.assert_array_equal(cupy.asnumpy(x), [3, -4])
