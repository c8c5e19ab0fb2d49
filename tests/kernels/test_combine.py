"""The C combine loops (kernels/_combine.pyx, combine.h) against NumPy, for every
(op, dtype) they cover, in both operand orders."""
import numpy as np
import pytest

from commrt.kernels import combine_address, combine_into
from commrt.kernels.reduce import UFUNCS

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
COVERED = ([(op, dt) for dt in INTS for op in ("sum", "prod", "min", "max", "band", "bor", "bxor")]
           + [(op, dt) for dt in FLOATS + ["float16"] for op in ("sum", "prod", "min", "max")])


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


@pytest.mark.parametrize("op,dtype", [("sum", "bool"), ("sum", "complex64"),
                                      ("land", "int32"), ("band", "float32"), ("avg", "float32"),
                                      ("sum", ">f4")])
def test_pairs_without_a_c_loop_say_so(op, dtype):
    assert combine_address(op, dtype) == 0
    a = np.ones(3, dtype)
    with pytest.raises(TypeError, match="no C loop"):
        combine_into(a, a.copy(), op)


def test_float16_loops_match_numpy_on_every_half():
    """Every float16 bit pattern (subnormals, infinities, NaNs, overflow to inf)
    against a shuffled partner: NumPy's float16 ufuncs and `x /= np.float16(n)`,
    `x *= np.float16(f)` bit for bit; the 8-wide F16C part and the scalar tail
    (65,537 elements: one left over) both checked."""
    from commrt.kernels import f16_scale

    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    a = np.concatenate([every, every[12345:12346]])
    b = a[np.random.default_rng(3).permutation(a.size)]
    with np.errstate(all="ignore"):
        for op in ("sum", "prod", "min", "max"):
            for src_first in (False, True):
                want = reference(op, b, a) if src_first else reference(op, a, b)
                got = combine_into(a.copy(), b, op, src_first)
                assert got.tobytes() == want.tobytes(), (op, src_first)
        for f in (2, 3, 4, 0.5, 1 / 3, 1e-3, 65504.0):
            got = f16_scale(a.copy(), f, True)
            assert got.tobytes() == (a / np.float16(f)).tobytes(), ("divide", f)
            got = f16_scale(a.copy(), f)
            assert got.tobytes() == (a * np.float16(f)).tobytes(), ("multiply", f)
    with pytest.raises(TypeError, match="float16"):
        f16_scale(np.ones(4, np.float32), 2)


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
