"""bfloat16 kernels (kernels/bfloat16.py, the C combine loops, reduce.py) bit for bit
against torch's own bfloat16 arithmetic on the CPU.

torch itself writes a NaN result as 0xFFFF in its vector loops and 0x7FC0 in
their scalar tails, and its MIN/MAX give the right operand of a 0.0/-0.0 tie
in vector loops and the left one in scalar tails; commrt always writes 0x7FC0
and gives the right operand (NumPy's rule, as for every other dtype), so NaNs
are compared as NaNs and signed zeros by value (ties are tested on their own)."""
import numpy as np
import pytest

from commrt.kernels import combine_address, combine_into
from commrt.kernels.bfloat16 import BFLOAT16, from_float32, widen
from commrt.kernels.reduce import (check_op_dtype, reduce_into, reduce_into_many,
                                   reference_reduce_into, scale_into)

torch = pytest.importorskip("torch")

OPS = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}


def as_bf16(t):
    return t.view(torch.int16).numpy().view(np.uint16).view(BFLOAT16).copy()


def operands(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, generator=g) * 1e3)
    b = (torch.randn(n, generator=g) * 1e3)
    special = [(float("nan"), 1.0), (1.0, float("nan")), (0.0, -0.0), (-0.0, 0.0),
               (float("inf"), float("-inf")), (3.3e38, 3.3e38), (1e-40, 1e-40), (1.0, 2.0 ** -8)]
    for i, (x, y) in enumerate(special[:n]):
        a[i], b[i] = x, y
    return a.to(torch.bfloat16), b.to(torch.bfloat16)


def same_bits(got, want):
    g = widen(got)
    w = want.float().numpy()
    nan = np.isnan(w)
    assert (np.isnan(g) == nan).all()
    zero = (w == 0) & (g == 0)
    keep = ~nan & ~zero
    assert (got.view(np.uint16)[keep] == want.view(torch.int16).numpy().view(np.uint16)[keep]).all()


def test_min_max_zero_ties_give_the_right_operand():
    a, b = from_float32(np.float32([0.0, -0.0])), from_float32(np.float32([-0.0, 0.0]))
    for op in ("min", "max"):
        assert list(reduce_into(a.copy(), b, op).view(np.uint16)) == [0x8000, 0]
        assert list(combine_into(a.copy(), b, op).view(np.uint16)) == [0x8000, 0]


def test_rounding_matches_torch_conversion():
    x = torch.randn(100_003) * 1e4
    x[:6] = torch.tensor([float("inf"), -float("inf"), 3.4e38, -0.0, 1e-42, 1.00390625])
    same_bits(from_float32(x.numpy()), x.to(torch.bfloat16))
    assert (widen(from_float32(x.numpy())) == x.to(torch.bfloat16).float().numpy()).all()


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 4099])
@pytest.mark.parametrize("op", sorted(OPS))
def test_reductions_match_torch(op, n):
    a, b = operands(n, n + len(op))
    want = OPS[op](a, b)
    got = as_bf16(a)
    reduce_into(got, as_bf16(b), op)
    same_bits(got, want)
    ref = as_bf16(a)
    reference_reduce_into(ref, as_bf16(b), op)
    same_bits(ref, want)


@pytest.mark.parametrize("op", sorted(OPS))
def test_c_loops_both_orders(op):
    a, b = operands(513, 3)
    assert combine_address(op, BFLOAT16) != 0
    fwd = combine_into(as_bf16(a), as_bf16(b), op)
    same_bits(fwd, OPS[op](a, b))
    rev = combine_into(as_bf16(a), as_bf16(b), op, True)
    same_bits(rev, OPS[op](b, a))


def test_many_sources_keep_a_float32_accumulator_and_round_once():
    srcs = [operands(300, s)[0] for s in range(4)]
    acc = srcs[0].float() + srcs[1].float() + srcs[2].float() + srcs[3].float()
    got = as_bf16(srcs[0])
    reduce_into_many(got, [as_bf16(s) for s in srcs[1:]], "sum")
    same_bits(got, acc.to(torch.bfloat16))


def test_average_and_rejected_ops():
    a = operands(100, 9)[0]
    got = as_bf16(a)
    scale_into(got, 3)
    same_bits(got, (a.float() / 3).to(torch.bfloat16))
    for op in ("band", "bor", "bxor"):
        with pytest.raises(TypeError, match="not defined"):
            check_op_dtype(op, BFLOAT16)
    assert check_op_dtype("lor", BFLOAT16) == "lor"
