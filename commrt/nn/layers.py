"""Modules: containers of parameters, buffers and sub-modules, and the layers.

A Module registers every Parameter, buffer (``register_buffer``) and
sub-Module assigned to it as an attribute, in assignment order, so that
``named_parameters()`` gives the same order on every process: the order in
which data-parallel training reduces gradients.
"""
from collections import OrderedDict

import numpy as np

from commrt.nn import functions as F
from commrt.nn import init
from commrt.nn.backend import device_of, to_device
from commrt.nn.tensor import Tensor


class Parameter(Tensor):
    """A leaf Tensor that a Module owns and an optimizer updates."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return f"Parameter(shape={tuple(self.shape)}, dtype={self.dtype})"


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call Module.__init__() before "
                                 "assigning attributes")
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, array):
        """State that is saved and moved with the module but not trained."""
        object.__setattr__(self, name, array)
        self._buffers[name] = array

    def forward(self, *args):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal -------------------------------------------------------------------
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}{name}.")

    def modules(self):
        return [m for _, m in self.named_modules()]

    def children(self):
        return list(self._modules.values())

    def named_parameters(self):
        for prefix, m in self.named_modules():
            for name, p in m._parameters.items():
                yield prefix + name, p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        for prefix, m in self.named_modules():
            for name, b in m._buffers.items():
                yield prefix + name, b

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    # ---- modes and gradients -------------------------------------------------------
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad[...] = 0

    # ---- state -----------------------------------------------------------------------
    def state_dict(self):
        """Name -> NumPy copy of every parameter and buffer."""
        state = OrderedDict((n, to_device(p.data, "cpu").copy()) for n, p in self.named_parameters())
        state.update((n, to_device(b, "cpu").copy()) for n, b in self.named_buffers())
        return state

    def load_state_dict(self, state, strict=True):
        """Copy ``state`` into the parameters and buffers in place."""
        own = OrderedDict((n, p.data) for n, p in self.named_parameters())
        own.update(self.named_buffers())
        missing = [n for n in own if n not in state]
        unexpected = [n for n in state if n not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, target in own.items():
            if name not in state:
                continue
            value = state[name]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"load_state_dict: {name} has shape {tuple(value.shape)} in the "
                                 f"state but {tuple(target.shape)} in the model")
            target[...] = to_device(value, device_of(target))

    def to(self, device):
        """Move parameters and buffers to ``device`` ('cpu' or 'cuda[:N]')."""
        for m in self.modules():
            for name, p in m._parameters.items():
                p.data = to_device(p.data, device)
                p.grad = None if p.grad is None else to_device(p.grad, device)
            for name, b in list(m._buffers.items()):
                m.register_buffer(name, to_device(b, device))
        return self

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


# ---- layers ---------------------------------------------------------------------------

class Linear(Module):
    """y = x W^T + b, W of shape (out_features, in_features); Kaiming init."""

    def __init__(self, in_features, out_features, bias=True, dtype=np.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = init.kaiming_uniform_(Parameter(np.empty((out_features, in_features), dtype)))
        self.bias = Parameter(np.zeros(out_features, dtype)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution through im2col and one BLAS product; Kaiming init."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, dtype=np.float32):
        super().__init__()
        kh, kw = _pair(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = (kh, kw), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.weight = init.kaiming_uniform_(
            Parameter(np.empty((out_channels, in_channels, kh, kw), dtype)))
        self.bias = Parameter(np.zeros(out_channels, dtype)) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}")


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(MaxPool2d):
    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class _BatchNorm(Module):
    ndims = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, dtype=np.float32):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(np.ones(num_features, dtype))
        self.bias = Parameter(np.zeros(num_features, dtype))
        self.register_buffer("running_mean", np.zeros(num_features, dtype))
        self.register_buffer("running_var", np.ones(num_features, dtype))

    def forward(self, x):
        if x.ndim not in self.ndims:
            raise ValueError(f"{type(self).__name__}: expected a {' or '.join(map(str, self.ndims))}"
                             f"-D input, got shape {tuple(x.shape)}")
        return F.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, self.momentum, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L) inputs."""
    ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W) inputs."""
    ndims = (4,)


class Dropout(Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    def forward(self, x):
        return F.flatten(x, 1)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Sequential(Module):
    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x


class ResidualBlock(Module):
    """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)) with 3x3 convolutions;
    the shortcut is a 1x1 convolution and BatchNorm when the shape changes."""

    def __init__(self, in_channels, out_channels, stride=1, dtype=np.float32):
        super().__init__()
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, dtype=dtype)
        self.bn1 = BatchNorm2d(out_channels, dtype=dtype)
        self.conv2 = Conv2d(out_channels, out_channels, 3, 1, 1, bias=False, dtype=dtype)
        self.bn2 = BatchNorm2d(out_channels, dtype=dtype)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = Sequential(Conv2d(in_channels, out_channels, 1, stride, bias=False,
                                              dtype=dtype), BatchNorm2d(out_channels, dtype=dtype))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.shortcut is None else self.shortcut(x)))
