"""The C combine loops (kernels/_combine.pyx, combine.h) against NumPy, for every
(op, dtype) they cover, in both operand orders."""
import numpy as np
import pytest

from commrt.kernels import combine_address, combine_into
from commrt.kernels.reduce import UFUNCS

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
COVERED = ([(op, dt) for dt in INTS for op in ("sum", "prod", "min", "max", "band", "bor", "bxor")]
           + [(op, dt) for dt in FLOATS for op in ("sum", "prod", "min", "max")])


def operands(dtype, n, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        a = rng.standard_normal(n).astype(dt) * 1e3
        b = rng.standard_normal(n).astype(dt) * 1e3
        # NaNs on either side and both, signed zeros, infinities, overflow to inf
        special = [np.nan, -0.0, 0.0, np.inf, -np.inf, np.finfo(dt).max]
        for i, (x, y) in enumerate([(np.nan, 1.0), (1.0, np.nan), (np.nan, np.nan), (0.0, -0.0),
                                    (-0.0, 0.0), (np.inf, -np.inf), (special[5], special[5])]):
            if i < n:
                a[i], b[i] = x, y
        return a, b
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    b = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    if n >= 2:      # wrap-around both ways
        a[0], b[0] = info.max, info.max
        a[1], b[1] = info.min, info.min if dt.kind == "i" else 1
    return a, b


def reference(op, left, right):
    with np.errstate(all="ignore"):
        return UFUNCS[op](left, right)


@pytest.mark.parametrize("op,dtype", COVERED)
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
@pytest.mark.parametrize("src_first", [False, True])
def test_combine_matches_numpy_bitwise(op, dtype, n, src_first):
    a, b = operands(dtype, n, seed=n)
    want = reference(op, b, a) if src_first else reference(op, a, b)
    got = a.copy()
    assert combine_into(got, b, op, src_first) is got
    # NaN payloads and signed zeros included: compare the bits
    assert got.tobytes() == want.tobytes(), (op, dtype, src_first, got[:8], want[:8])


@pytest.mark.parametrize("op,dtype", COVERED)
def test_every_covered_pair_has_two_c_entry_points(op, dtype):
    fwd, rev = combine_address(op, dtype), combine_address(op, dtype, True)
    assert fwd and rev and fwd != rev


@pytest.mark.parametrize("op,dtype", [("sum", "float16"), ("sum", "bool"), ("sum", "complex64"),
                                      ("land", "int32"), ("band", "float32"), ("avg", "float32"),
                                      ("sum", ">f4")])
def test_pairs_without_a_c_loop_say_so(op, dtype):
    assert combine_address(op, dtype) == 0
    a = np.ones(3, dtype)
    with pytest.raises(TypeError, match="no C loop"):
        combine_into(a, a.copy(), op)


def test_bad_operands_are_refused():
    a = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="src is"):
        combine_into(a, np.ones(5, np.float32), "sum")
    with pytest.raises(ValueError, match="src is"):
        combine_into(a, np.ones(4, np.float64), "sum")
    with pytest.raises(TypeError, match="NumPy arrays"):
        combine_into(a, [1, 2, 3, 4], "sum")
    with pytest.raises(ValueError):            # not contiguous
        combine_into(np.ones(8, np.float32)[::2], a, "sum")
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises((ValueError, BufferError)):
        combine_into(ro, a, "sum")
