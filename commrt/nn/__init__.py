"""commrt.nn: a small NumPy/CuPy training engine.

    Tensor, no_grad            reverse-mode autograd over xp = numpy | cupy
    functions (as F)           differentiable operations and losses
    Module and layers          Linear, Conv2d, pooling, BatchNorm, Dropout, ...
    models                     LeNet, ResNet
    save_checkpoint, load_checkpoint
"""
# tensor first: it installs the operators from functions, which import it back
from commrt.nn.tensor import Function, Tensor, enable_grad, is_grad_enabled, no_grad  # noqa: F401,I001
from commrt.nn import functions, init  # noqa: F401
from commrt.nn import functions as F  # noqa: F401
from commrt.nn.backend import get_array_module  # noqa: F401
from commrt.nn.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
from commrt.nn.layers import (  # noqa: F401
    AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, Module,
    Parameter, ReLU, ResidualBlock, Sequential, Sigmoid, Tanh,
)
from commrt.nn.models import LeNet, ResNet  # noqa: F401
from commrt.nn.random import manual_seed  # noqa: F401
