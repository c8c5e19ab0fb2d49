"""Differentiable functions on Tensors (the ``F`` of the engine).

Each operation is a ``Function`` node (forward and backward on arrays) with a
short public wrapper that checks its arguments and names the operation and
shapes in every error.
"""
from commrt.nn.functions.activation import log_softmax, relu, sigmoid, softmax, tanh
from commrt.nn.functions.conv import avg_pool2d, conv2d, linear, max_pool2d
from commrt.nn.functions.loss import cross_entropy, mse_loss
from commrt.nn.functions.math import (
    add, concatenate, div, exp, flatten, getitem, log, matmul, max, mean, mul, neg, pow, reshape,
    sub, sum, transpose,
)
from commrt.nn.functions.norm import batch_norm, dropout

__all__ = [
    "add", "sub", "mul", "div", "neg", "pow", "matmul", "sum", "mean", "max", "reshape",
    "flatten", "transpose", "getitem", "concatenate", "exp", "log", "relu", "tanh", "sigmoid",
    "softmax", "log_softmax", "cross_entropy", "mse_loss", "dropout", "linear", "conv2d",
    "max_pool2d", "avg_pool2d", "batch_norm",
]


def install_tensor_methods(Tensor):
    """Give Tensor its operators and methods (called once by commrt.nn.tensor)."""
    ops = {
        "__add__": add, "__radd__": lambda a, b: add(b, a),
        "__sub__": sub, "__rsub__": lambda a, b: sub(b, a),
        "__mul__": mul, "__rmul__": lambda a, b: mul(b, a),
        "__truediv__": div, "__rtruediv__": lambda a, b: div(b, a),
        "__pow__": pow, "__rpow__": lambda a, b: pow(b, a),
        "__matmul__": matmul, "__rmatmul__": lambda a, b: matmul(b, a),
        "__neg__": neg, "__getitem__": getitem,
        "sum": sum, "mean": mean, "max": max, "reshape": reshape, "flatten": flatten,
        "transpose": transpose, "exp": exp, "log": log, "relu": relu, "tanh": tanh,
        "sigmoid": sigmoid, "softmax": softmax, "log_softmax": log_softmax,
    }
    for name, fn in ops.items():
        setattr(Tensor, name, fn)
    Tensor.T = property(lambda self: transpose(self))
