"""The graph machinery: topological backward, accumulation, modes, hooks."""
import numpy as np
import pytest

from commrt import nn
from commrt.nn import functions as F


def t(values, grad=True):
    return nn.Tensor(np.asarray(values, dtype=np.float64), requires_grad=grad)


def test_diamond_graph_sums_both_paths():
    x = t([2.0])
    a = x * 3          # da/dx = 3
    b = x * x          # db/dx = 2x = 4
    (a + b).sum().backward()
    np.testing.assert_allclose(x.grad, [7.0])


def test_deep_chain_does_not_recurse():
    x = t([1.0])
    y = x
    for _ in range(5000):
        y = y * 1.0 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0])


def test_gradients_accumulate_across_backward_calls_until_cleared():
    x = t([1.0, 2.0])
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad, [5.0, 5.0])
    x.zero_grad()
    assert x.grad is None


def test_serial_training_dataflow():
    # The dataflow of one step: m = W.x, s = m + b, y = sum(s).
    x = nn.Tensor(np.array([1.0, 2.0]))
    W = t([[1.0, 0.0], [0.5, -1.0]])
    b = t([0.1, 0.2])
    y = F.sum(W @ x + b)
    y.backward()
    np.testing.assert_allclose(W.grad, [[1, 2], [1, 2]])
    np.testing.assert_allclose(b.grad, [1, 1])
    assert x.grad is None


def test_no_grad_records_nothing_and_restores_the_mode():
    x = t([1.0])
    with nn.no_grad():
        y = x * 2
        with nn.enable_grad():
            z = x * 2
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and nn.is_grad_enabled()

    @nn.no_grad()
    def f(v):
        return v * 2
    assert not f(x).requires_grad and nn.is_grad_enabled()


def test_detach_cuts_the_graph_but_shares_data():
    x = t([1.0, 2.0])
    d = (x * 2).detach()
    assert not d.requires_grad and d.is_leaf
    y = (x * d).sum()
    y.backward()
    np.testing.assert_allclose(x.grad, d.data)


def test_second_backward_through_freed_graph_names_the_operation():
    x = t(np.ones((2, 3)))
    y = F.relu(x @ t(np.ones((3, 4)))).sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"freed graph: Sum\(inputs \(2, 4\)\)"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = t([3.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, [12.0])


def test_backward_of_non_scalar_needs_a_gradient():
    x = t([1.0, 2.0])
    y = x * 2
    with pytest.raises(RuntimeError, match=r"single-element output.*\(2,\)"):
        y.backward()
    y.backward(np.array([1.0, 10.0]))
    np.testing.assert_allclose(x.grad, [2.0, 20.0])
    with pytest.raises(ValueError, match=r"grad has shape \(3,\)"):
        (x * 2).backward(np.ones(3))


def test_backward_without_graph_is_an_error():
    with pytest.raises(RuntimeError, match="does not require grad"):
        t([1.0], grad=False).sum().backward()


def test_leaf_backward_and_integer_leaves():
    x = t([5.0])
    x.backward()
    np.testing.assert_allclose(x.grad, [1.0])
    with pytest.raises(TypeError, match="floating-point"):
        nn.Tensor(np.array([1, 2]), requires_grad=True)


def test_grad_hook_runs_once_per_leaf_after_all_uses_in_reverse_order():
    w1, w2 = t([1.0, 2.0]), t([3.0])
    events = []
    w1.register_grad_hook(lambda p: events.append(("w1", p.grad.copy())))
    w2.register_grad_hook(lambda p: events.append(("w2", p.grad.copy())))
    h = w1 * 2                       # w1 is used twice: the hook must wait for both
    y = (h * w2).sum() + (w1 * 5).sum()
    y.backward()
    assert [e[0] for e in events].count("w1") == 1 and len(events) == 2
    grads = dict(events)
    np.testing.assert_allclose(grads["w1"], [2 * 3 + 5] * 2)
    np.testing.assert_allclose(grads["w2"], [6.0])


def test_grad_hooks_fire_layer_by_layer_from_the_output():
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    order = []
    for name, p in model.named_parameters():
        p.register_grad_hook(lambda p, name=name: order.append(name))
    model(nn.Tensor(np.ones((2, 3), np.float32))).sum().backward()
    assert order[:2] == ["2.weight", "2.bias"] or order[:2] == ["2.bias", "2.weight"]
    assert set(order[2:]) == {"0.weight", "0.bias"}


def test_grad_hook_handle_removes_the_hook_and_grad_is_owned():
    x = t([1.0, 1.0])
    calls = []
    handle = x.register_grad_hook(lambda p: calls.append(1))
    y = t([0.0, 0.0])
    (x + y).sum().backward()     # Add passes the same array to both inputs
    x.grad *= 10                 # in place, as an all-reduce would
    np.testing.assert_allclose(y.grad, [1.0, 1.0])
    handle.remove()
    (x * 1).sum().backward()
    assert calls == [1]
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2).register_grad_hook(print)


def test_operators_with_constants_and_arrays_on_either_side():
    x = t([1.0, 2.0])
    y = (3 - x) * np.array([1.0, 2.0]) + 1 / x - x ** 2 + 2 ** x
    y.sum().backward()
    want = -np.array([1.0, 2.0]) - 1 / np.array([1.0, 4.0]) - 2 * np.array([1.0, 2.0]) \
        + np.log(2) * 2 ** np.array([1.0, 2.0])
    np.testing.assert_allclose(x.grad, want)


def test_repr_and_properties():
    x = t(np.zeros((2, 3)))
    y = x.sum()
    assert "grad_fn=Sum" in repr(y) and y.shape == () and x.ndim == 2 and len(x) == 2
    assert x.device == "cpu" and isinstance(y.data, np.ndarray)
