"""CPU reduction kernels against NumPy's ufuncs: every op, every dtype, every shape."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commrt.kernels import reduce as R
from commrt.kernels import reduce_into, reduce_into_many, scale_into, cast_into

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
DTYPES = [np.bool_] + INTS + FLOATS + [np.complex64, np.complex128]
OPS = list(R.OPS)

# The oracle, written from NumPy's ufuncs alone (not from commrt's reference).
ORACLE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "land": np.logical_and, "lor": np.logical_or, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def valid(op, dtype):
    kind = np.dtype(dtype).kind
    if kind in "biu":
        return True
    if kind == "f":
        return op not in ("band", "bor", "bxor")
    return op in ("sum", "prod", "land", "lor")


def expected(a, b, op):
    if a.dtype == np.float16 and op in ("sum", "prod"):
        return ORACLE[op](a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    with np.errstate(all="ignore"):
        return ORACLE[op](a, b).astype(a.dtype)


def sample(rng, dtype, n, special=True):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    x = rng.standard_normal(n) * 100
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(n)
    x = x.astype(dt)
    if special and n >= 8 and dt.kind == "f":
        x[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
        x[rng.integers(0, n)] = 0
    return x


def assert_same(got, want):
    assert got.dtype == want.dtype
    if got.dtype.kind == "c":  # NumPy's own complex product differs between its loops
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)  # NaN == NaN here; element-wise ops are exact


@settings(max_examples=250, deadline=None)
@given(op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES),
       n=st.sampled_from([0, 1, 2, 7, 63, 1000, 4099]), seed=st.integers(0, 2**32 - 1))
def test_reduce_into_matches_numpy(op, dtype, n, seed):
    rng = np.random.default_rng(seed)
    a, b = sample(rng, dtype, n), sample(rng, dtype, n)
    if not valid(op, dtype):
        with pytest.raises(TypeError, match="not defined"):
            reduce_into(a, b, op)
        return
    want = expected(a, b, op)
    b0 = b.copy()
    out = reduce_into(a, b, op)
    assert out is a
    assert_same(a, want)
    assert_same(b, b0)  # the source is never written


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_path_twice_and_parallel(op, dtype):
    """Second call takes the entry-point path; parallel=True the threaded kernel."""
    if not valid(op, dtype):
        return
    rng = np.random.default_rng(1)
    for parallel in (None, None, False, True):
        a, b = sample(rng, dtype, 3001), sample(rng, dtype, 3001)
        want = expected(a, b, op)
        reduce_into(a, b, op, parallel=parallel)
        assert_same(a, want)


def test_reference_is_numpy():
    rng = np.random.default_rng(2)
    for dtype in DTYPES:
        for op in OPS:
            if valid(op, dtype):
                a, b = sample(rng, dtype, 50), sample(rng, dtype, 50)
                assert_same(R.reference_reduce_into(a.copy(), b, op), expected(a, b, op))


def test_op_spellings():
    from commrt.collectives.ops import ReduceOp

    a = np.arange(5, dtype=np.int32)
    for op in ("sum", "SUM", ReduceOp.SUM):
        x = a.copy()
        reduce_into(x, a, op)
        assert_same(x, 2 * a)
    with pytest.raises(ValueError, match="unknown reduction"):
        reduce_into(a.copy(), a, "mean")
    with pytest.raises(ValueError, match="scale_into"):
        reduce_into(a.copy(), a, "avg")


def test_bool_arithmetic_is_logical():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    for op, want in (("sum", a | b), ("prod", a & b), ("min", a & b), ("max", a | b),
                     ("bxor", a ^ b)):
        x = a.copy()
        reduce_into(x, b, op)
        assert_same(x, want)


def test_integer_wraparound_and_logical_values():
    a = np.array([127, -128, 5, 0], dtype=np.int8)
    b = np.array([1, -1, 0, 3], dtype=np.int8)
    x = a.copy()
    reduce_into(x, b, "sum")
    assert_same(x, np.array([-128, 127, 5, 3], dtype=np.int8))
    x = a.copy()
    reduce_into(x, b, "land")
    assert_same(x, np.array([1, 1, 0, 0], dtype=np.int8))
    f = np.array([0.0, 2.5, np.nan], np.float32)
    reduce_into(f, np.array([1.0, 0.0, 1.0], np.float32), "lor")
    assert_same(f, np.array([1.0, 1.0, 1.0], np.float32))


def test_nan_propagates_through_min_and_max():
    a = np.array([1.0, np.nan, 3.0, np.nan], np.float64)
    b = np.array([np.nan, 2.0, 1.0, np.nan], np.float64)
    for op, uf in (("min", np.minimum), ("max", np.maximum)):
        x = a.copy()
        reduce_into(x, b, op)
        assert_same(x, uf(a, b))


def test_float16_combines_in_float32():
    # 2048 + 1 is not representable in half; 2048 + 1 + 1 via a float32
    # accumulator is (reduce_into_many), pairwise half is not.
    a = np.array([2048.0], np.float16)
    ones = [np.array([1.0], np.float16)] * 2
    x = a.copy()
    reduce_into_many(x, ones, "sum")
    assert x[0] == 2050.0
    y = a.copy()
    for o in ones:
        reduce_into(y, o, "sum")
    assert y[0] == 2048.0


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES),
       n=st.sampled_from([0, 1, 33, 40000]), k=st.integers(1, 7), seed=st.integers(0, 2**32 - 1))
def test_reduce_into_many(op, dtype, n, k, seed):
    if not valid(op, dtype):
        return
    rng = np.random.default_rng(seed)
    a = sample(rng, dtype, n)
    srcs = [sample(rng, dtype, n) for _ in range(k)]
    if a.dtype == np.float16 and op in ("sum", "prod"):
        acc = a.astype(np.float32)
        for s in srcs:
            acc = ORACLE[op](acc, s.astype(np.float32))
        want = acc.astype(np.float16)
    else:
        want = a.copy()
        for s in srcs:
            want = expected(want, s, op)
    reduce_into_many(a, srcs, op)
    assert_same(a, want)


def test_shapes_layouts_and_errors():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 7)).astype(np.float32)
    b = rng.standard_normal((6, 7)).astype(np.float32)
    want = a + b
    reduce_into(a, b, "sum")  # n-D contiguous
    assert_same(a, want)
    big = rng.standard_normal(40).astype(np.float64)
    other = rng.standard_normal(20).astype(np.float64)
    view = big[::2]  # strided destination
    want = view + other
    reduce_into(view, other, "sum")
    assert_same(big[::2], want)
    assert_same(big[1::2], big[1::2])
    mixed = np.ones(4, np.float32)
    reduce_into(mixed, np.full(4, 2, np.float16), "sum")  # mixed dtypes: NumPy's casting
    assert_same(mixed, np.full(4, 3, np.float32))
    with pytest.raises(ValueError, match="differ in size|elements"):
        reduce_into(np.ones(4, np.float32), np.ones(5, np.float32), "sum")
    with pytest.raises(ValueError, match="differ in size|elements"):
        reduce_into(np.ones(4, np.float32), np.ones(5, np.float32), "sum")  # fast path too
    with pytest.raises(TypeError):
        reduce_into(np.ones(4, np.float32), [1, 2, 3, 4], "sum")
    with pytest.raises(TypeError, match="not defined"):
        reduce_into(np.ones(4, np.float32), np.ones(4, np.float32), "bxor")
    with pytest.raises(TypeError):
        reduce_into(np.array(["a"]), np.array(["b"]), "sum")


def test_scale_into_and_cast_into():
    f = np.array([3.0, -3.0, 1.0], np.float32)
    scale_into(f, 2)
    assert_same(f, np.array([1.5, -1.5, 0.5], np.float32))
    i = np.array([7, -7, 8], np.int32)
    scale_into(i, 2)
    assert_same(i, np.array([3, -4, 4], np.int32))  # floor division
    h = np.array([3.0], np.float16)
    scale_into(h, 4)
    assert_same(h, np.array([0.75], np.float16))
    with pytest.raises(TypeError):
        scale_into(np.ones(2, bool), 2)
    dst = np.empty(3, np.float16)
    cast_into(dst, np.array([1.0, 2.5, 65520.0], np.float32))
    assert_same(dst, np.array([1.0, 2.5, np.inf], np.float16))


def test_numba_is_not_imported_by_commrt():
    import subprocess
    import sys

    code = "import sys, commrt, commrt.kernels; assert 'numba' not in sys.modules, 'numba loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "land"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_large_arrays_take_the_large_path(op, dtype):
    from commrt.kernels import reduce as R

    rng = np.random.default_rng(5)
    n = (R._NUMPY_LARGE_BYTES // np.dtype(dtype).itemsize) + 3
    a, b = sample(rng, dtype, n, special=False), sample(rng, dtype, n, special=False)
    want = expected(a, b, op)
    reduce_into(a, b, op)
    assert_same(a, want)
    with pytest.raises(ValueError, match="differ in size"):
        reduce_into(a, b[:-1], op)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_zero_ties_follow_numpy_on_every_cpu_path(dtype):
    """np.minimum/np.maximum give the right operand on a 0.0/-0.0 tie; the Numba
    kernels (serial and parallel) and the C combine loops must too, or a
    reduction's result would change sign with the path an algorithm takes."""
    from commrt.kernels import combine_into
    from commrt.kernels import reduce_numba as N

    n = 4096
    a = np.where(np.arange(n) % 2, 0.0, -0.0).astype(dtype)
    b = -a
    a[:4] = [np.nan, 1.0, -0.0, np.nan]
    b[:4] = [2.0, np.nan, 0.0, np.nan]
    for op, uf in (("min", np.minimum), ("max", np.maximum)):
        want = uf(a, b).view(np.uint8)
        for name, f in ((f"numba {op}", getattr(N, op + "_")),
                        (f"numba {op} parallel", getattr(N, op + "_par")),
                        (f"C {op}", lambda x, y: combine_into(x, y, op)),
                        (f"reduce_into {op}", lambda x, y: reduce_into(x, y, op))):
            x = a.copy()
            f(x, b)
            np.testing.assert_array_equal(x.view(np.uint8), want, err_msg=name)
