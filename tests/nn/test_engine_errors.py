"""Bad input fails early with messages that name the operation and shapes."""
import numpy as np
import pytest

from commrt import nn
from commrt.nn import functions as F


def f32(*shape):
    return nn.Tensor(np.zeros(shape, np.float32), requires_grad=True)


@pytest.mark.parametrize("call,error,pattern", [
    (lambda: f32(2, 3) + f32(4, 3), ValueError, r"Add: shapes \(2, 3\) and \(4, 3\)"),
    (lambda: f32(2, 3) * f32(2), ValueError, r"Mul: shapes \(2, 3\) and \(2,\)"),
    (lambda: f32(2, 3) @ f32(4, 5), ValueError, r"MatMul: shapes \(2, 3\) and \(4, 5\).*3 != 4"),
    (lambda: f32(2, 3) @ nn.Tensor(np.zeros((3, 2))), TypeError, r"MatMul: dtypes differ"),
    (lambda: f32(2, 3).reshape(4, 2), ValueError, r"Reshape: cannot reshape \(2, 3\)"),
    (lambda: f32(2, 3)[5], IndexError, r"GetItem: .*input shape \(2, 3\)"),
    (lambda: F.concatenate([f32(2, 3), f32(3, 2)]), ValueError,
     r"Concatenate: shapes \(2, 3\), \(3, 2\)"),
    (lambda: F.cross_entropy(f32(2, 3), np.array([0, 3])), ValueError,
     r"targets must lie in \[0, 3\)"),
    (lambda: F.cross_entropy(f32(2, 3), np.array([0.0, 1.0])), TypeError, "integer class"),
    (lambda: F.cross_entropy(f32(2, 3), np.array([0, 1, 2])), ValueError, r"logits \(2, 3\).*targets \(3,\)"),
    (lambda: F.mse_loss(f32(2, 3), np.zeros((3, 2))), ValueError, r"mse_loss: prediction \(2, 3\)"),
    (lambda: nn.Linear(4, 2)(f32(3, 5)), ValueError, r"linear: input of shape \(3, 5\).*\(2, 4\)"),
    (lambda: nn.Linear(4, 2)(nn.Tensor(np.zeros((3, 4)))), TypeError, r"linear: inputs must share one dtype"),
    (lambda: nn.Conv2d(3, 4, 3)(f32(1, 2, 5, 5)),
     ValueError, r"conv2d: input \(1, 2, 5, 5\).*\(4, 3, 3, 3\)"),
    (lambda: nn.Conv2d(1, 1, 3)(nn.Tensor(np.zeros((1, 1, 5, 5), np.int64))),
     TypeError, "conv2d: expected a floating-point"),
    (lambda: nn.Conv2d(1, 1, 5)(f32(1, 1, 3, 3)), ValueError, r"5x5 kernel.*does not fit.*\(1, 1, 3, 3\)"),
    (lambda: nn.MaxPool2d(2)(f32(2, 3)), ValueError, r"max_pool2d: expected an \(N, C, H, W\)"),
    (lambda: nn.BatchNorm2d(3)(f32(2, 3)), ValueError, r"BatchNorm2d: expected a 4-D input"),
    (lambda: nn.BatchNorm1d(3)(f32(1, 3)), ValueError, r"more than one value per channel"),
    (lambda: nn.BatchNorm1d(3)(f32(4, 2)), ValueError, r"batch_norm: input \(4, 2\) does not match 3"),
    (lambda: F.dropout(f32(2), 1.0), ValueError, r"dropout: p must be in \[0, 1\)"),
])
def test_errors_name_operation_and_shapes(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_freed_graph_error_names_conv_and_shapes():
    conv = nn.Conv2d(1, 2, 3)
    loss = conv(nn.Tensor(np.ones((1, 1, 4, 4), np.float32))).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match=r"freed graph: .*\(inputs"):
        loss.backward()


def test_mixing_devices_is_refused():
    class FakeDeviceArray(np.ndarray):
        """A host array that claims to live elsewhere (stands in for CuPy)."""
    a = nn.Tensor(np.ones(2))
    b = nn.Tensor(np.ones(2))
    b.data = np.ones(2).view(FakeDeviceArray)
    with pytest.raises(ValueError, match=r"Add: inputs are on different devices"):
        a + b


def test_module_state_errors():
    model = nn.Linear(2, 3)
    state = model.state_dict()
    state["weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"weight has shape \(2, 2\).*\(3, 2\)"):
        model.load_state_dict(state)
    with pytest.raises(KeyError, match=r"missing keys \['bias'\]"):
        model.load_state_dict({"weight": np.zeros((3, 2), np.float32)})
