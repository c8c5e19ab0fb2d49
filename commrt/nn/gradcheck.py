"""Numerical gradient checks: compare backward with central differences.

``check_grad(fn, tensors)`` evaluates ``fn()`` (a closure over ``tensors``),
back-propagates a random projection ``sum(r * fn())`` and compares each
tensor's gradient with ``(f(x + eps) - f(x - eps)) / 2 eps`` element by
element.  Use float64 and tiny shapes: it costs two forward passes per
element.
"""
import numpy as np

from commrt.nn.backend import to_device
from commrt.nn.tensor import Tensor, no_grad


def numerical_grad(fn, tensor, weights, eps=1e-6):
    data = tensor.data
    grad = np.zeros(data.shape, dtype=np.float64)
    with no_grad():
        for index in np.ndindex(*data.shape):
            orig = data[index].item()
            data[index] = orig + eps
            plus = float((to_device(fn().data, "cpu") * weights).sum())
            data[index] = orig - eps
            minus = float((to_device(fn().data, "cpu") * weights).sum())
            data[index] = orig
            grad[index] = (plus - minus) / (2 * eps)
    return grad


def check_grad(fn, tensors, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0):
    """Raise AssertionError if a tensor's analytic gradient differs from the
    numerical one; returns the analytic gradients."""
    for t in tensors:
        if t.dtype != np.float64:
            raise TypeError(f"check_grad: use float64 tensors, got {t.dtype}")
        t.grad = None
    out = fn()
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    (out * Tensor(out.xp.asarray(weights))).sum().backward()
    analytic = []
    for k, t in enumerate(tensors):
        got = np.zeros(t.shape) if t.grad is None else to_device(t.grad, "cpu")
        want = numerical_grad(fn, t, weights, eps)
        if not np.allclose(got, want, atol=atol, rtol=rtol):
            worst = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
            raise AssertionError(f"check_grad: tensor {k} of shape {tuple(t.shape)}: analytic "
                                 f"{got[worst]:.8g} != numerical {want[worst]:.8g} at {worst}")
        analytic.append(got)
    return analytic
