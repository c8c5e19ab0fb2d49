"""Every differentiable operation against central finite differences (float64)."""
import numpy as np
import pytest

from commrt import nn
from commrt.nn import functions as F
from commrt.nn.gradcheck import check_grad

rng = np.random.default_rng(1234)


def leaf(*shape, low=None):
    data = rng.standard_normal(shape) if low is None else rng.uniform(low, low + 1.5, shape)
    return nn.Tensor(data, requires_grad=True)


# name -> (function of the leaves, leaves)
CASES = {
    "add_broadcast": (lambda a, b: a + b, lambda: (leaf(2, 3), leaf(3))),
    "add_scalar": (lambda a: 2.5 + a, lambda: (leaf(4),)),
    "sub_broadcast": (lambda a, b: a - b, lambda: (leaf(2, 1, 3), leaf(4, 1))),
    "rsub": (lambda a: 1.0 - a, lambda: (leaf(3),)),
    "mul_broadcast": (lambda a, b: a * b, lambda: (leaf(2, 3), leaf(2, 1))),
    "mul_same_tensor": (lambda a: a * a, lambda: (leaf(5),)),
    "div": (lambda a, b: a / b, lambda: (leaf(2, 3), leaf(3, low=0.5))),
    "rdiv": (lambda a: 2.0 / a, lambda: (leaf(3, low=0.5),)),
    "neg": (lambda a: -a, lambda: (leaf(3, 2),)),
    "pow_const": (lambda a: a ** 3, lambda: (leaf(4),)),
    "pow_fractional": (lambda a: a ** 0.5, lambda: (leaf(4, low=0.5),)),
    "pow_tensor": (lambda a, b: a ** b, lambda: (leaf(3, low=0.5), leaf(3))),
    "matmul_2d": (lambda a, b: a @ b, lambda: (leaf(2, 3), leaf(3, 4))),
    "matmul_vec": (lambda a, b: a @ b, lambda: (leaf(2, 3), leaf(3))),
    "vec_matmul": (lambda a, b: a @ b, lambda: (leaf(3), leaf(3, 2))),
    "matmul_batched_broadcast": (lambda a, b: a @ b, lambda: (leaf(2, 2, 3), leaf(3, 2))),
    "sum_all": (lambda a: a.sum(), lambda: (leaf(2, 3),)),
    "sum_axis_keepdims": (lambda a: F.sum(a, axis=(0, 2), keepdims=True), lambda: (leaf(2, 3, 2),)),
    "mean_axis": (lambda a: a.mean(axis=1), lambda: (leaf(2, 3),)),
    "max_all": (lambda a: a.max(), lambda: (leaf(3, 4),)),
    "max_axis": (lambda a: F.max(a, axis=-1, keepdims=True), lambda: (leaf(3, 4),)),
    "reshape": (lambda a: a.reshape(3, 2) * 1.0, lambda: (leaf(2, 3),)),
    "flatten": (lambda a: F.flatten(a), lambda: (leaf(2, 2, 2),)),
    "transpose": (lambda a: a.transpose(1, 2, 0), lambda: (leaf(2, 3, 2),)),
    "T": (lambda a: a.T, lambda: (leaf(2, 3),)),
    "getitem_slice": (lambda a: a[1:, ::2], lambda: (leaf(3, 5),)),
    "getitem_int_none": (lambda a: a[1, None, :], lambda: (leaf(3, 4),)),
    "getitem_fancy_repeat": (lambda a: a[np.array([0, 2, 0])], lambda: (leaf(3, 2),)),
    "getitem_bool": (lambda a: a[np.array([True, False, True])], lambda: (leaf(3, 2),)),
    "concatenate": (lambda a, b: F.concatenate([a, b, a], axis=1), lambda: (leaf(2, 1), leaf(2, 3))),
    "exp": (lambda a: a.exp(), lambda: (leaf(4),)),
    "log": (lambda a: a.log(), lambda: (leaf(4, low=0.5),)),
    "relu": (lambda a: F.relu(a), lambda: (leaf(3, 4),)),
    "tanh": (lambda a: F.tanh(a), lambda: (leaf(3, 4),)),
    "sigmoid": (lambda a: F.sigmoid(a), lambda: (leaf(3, 4),)),
    "softmax": (lambda a: F.softmax(a, axis=1), lambda: (leaf(2, 4),)),
    "softmax_axis0": (lambda a: F.softmax(a, axis=0), lambda: (leaf(3, 2),)),
    "log_softmax": (lambda a: F.log_softmax(a), lambda: (leaf(2, 4),)),
    "cross_entropy": (lambda a: F.cross_entropy(a, np.array([1, 0, 3])), lambda: (leaf(3, 4),)),
    "cross_entropy_sum": (lambda a: F.cross_entropy(a, np.array([2, 2]), reduction="sum"),
                          lambda: (leaf(2, 3),)),
    "cross_entropy_none": (lambda a: F.cross_entropy(a, np.array([2, 0]), reduction="none"),
                           lambda: (leaf(2, 3),)),
    "mse": (lambda a, b: F.mse_loss(a, b), lambda: (leaf(2, 3), leaf(2, 3))),
    "mse_const_target": (lambda a: F.mse_loss(a, np.ones((2, 3))), lambda: (leaf(2, 3),)),
    "mse_none": (lambda a, b: F.mse_loss(a, b, reduction="none"), lambda: (leaf(3), leaf(3))),
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda: (leaf(3, 4), leaf(2, 4), leaf(2))),
    "linear_3d_input": (lambda x, w: F.linear(x, w), lambda: (leaf(2, 2, 3), leaf(4, 3))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    fn, make = CASES[name]
    leaves = make()
    check_grad(lambda: fn(*leaves), leaves)


def test_dropout_gradient_with_a_fixed_mask():
    x = leaf(4, 5)

    def fn():
        nn.manual_seed(7)                           # the same mask on every evaluation
        return F.dropout(x, 0.4)
    check_grad(fn, [x])


def test_dropout_statistics_and_eval_identity():
    nn.manual_seed(0)
    x = nn.Tensor(np.ones((200, 100)), requires_grad=True)
    y = F.dropout(x, 0.25)
    kept = y.data != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y.data[kept], 1 / 0.75)
    assert F.dropout(x, 0.25, training=False) is x


def test_max_splits_gradient_among_ties():
    x = nn.Tensor(np.array([1.0, 3.0, 3.0]), requires_grad=True)
    x.max().backward()
    np.testing.assert_allclose(x.grad, [0, 0.5, 0.5])


def test_softmax_and_log_softmax_are_stable_for_large_inputs():
    x = nn.Tensor(np.array([[1000.0, 1000.0, -1000.0]]))
    np.testing.assert_allclose(F.softmax(x).data, [[0.5, 0.5, 0.0]])
    np.testing.assert_allclose(F.log_softmax(x).data[0, :2], [np.log(0.5)] * 2)
    assert np.isfinite(F.sigmoid(nn.Tensor(np.array([-1000.0, 1000.0]))).data).all()


def test_cross_entropy_value_matches_definition():
    logits = rng.standard_normal((5, 4))
    targets = np.array([0, 3, 1, 1, 2])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    want = -np.log(p[np.arange(5), targets]).mean()
    assert F.cross_entropy(nn.Tensor(logits), targets).item() == pytest.approx(want)


def test_float32_stays_float32():
    x = nn.Tensor(rng.standard_normal((2, 3)).astype(np.float32), requires_grad=True)
    y = F.softmax(x * 2.0 + 1 - x / 3.0).sum() * 0.5
    assert y.dtype == np.float32
    y.backward()
    assert x.grad.dtype == np.float32
