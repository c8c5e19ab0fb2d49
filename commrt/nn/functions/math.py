"""Arithmetic, reductions and shape operations."""
import numpy as np

from commrt.nn.backend import get_array_module
from commrt.nn.functions._util import as_tensor, normalize_axis, tensor_class, unbroadcast
from commrt.nn.tensor import Function


def _check_broadcast(op, a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} "
                         "cannot be broadcast together") from None


class _Binary(Function):
    @classmethod
    def apply(cls, a, b):
        Tensor = tensor_class()
        if not isinstance(a, Tensor):
            a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
        b = as_tensor(b, like=a)
        _check_broadcast(cls.__name__, a, b)
        return super().apply(a, b)


class Add(_Binary):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, gy):
        sa, sb = self.shapes
        return unbroadcast(gy, sa), unbroadcast(gy, sb)


class Sub(_Binary):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, gy):
        sa, sb = self.shapes
        gb = unbroadcast(-gy, sb) if self.needs_input_grad[1] else None
        return unbroadcast(gy, sa), gb


class Mul(_Binary):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, gy):
        a, b = self.a, self.b
        ga = unbroadcast(gy * b, a.shape) if self.needs_input_grad[0] else None
        gb = unbroadcast(gy * a, b.shape) if self.needs_input_grad[1] else None
        return ga, gb


class Div(_Binary):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a / b

    def backward(self, gy):
        a, b = self.a, self.b
        ga = unbroadcast(gy / b, a.shape) if self.needs_input_grad[0] else None
        gb = unbroadcast(-gy * a / (b * b), b.shape) if self.needs_input_grad[1] else None
        return ga, gb


class Pow(_Binary):
    def forward(self, a, b):
        self.a, self.b = a, b
        self.y = a ** b
        return self.y

    def backward(self, gy):
        a, b, y = self.a, self.b, self.y
        xp = get_array_module(a)
        ga = gb = None
        if self.needs_input_grad[0]:
            ga = unbroadcast(gy * b * a ** (b - 1), a.shape)
        if self.needs_input_grad[1]:
            safe = xp.where(a > 0, a, 1)          # d(a**b)/db = a**b log a, 0 where a <= 0
            gb = unbroadcast(gy * y * xp.log(safe), b.shape)
        return ga, gb


class Neg(Function):
    def forward(self, x):
        return -x

    def backward(self, gy):
        return (-gy,)


class Exp(Function):
    def forward(self, x):
        self.y = get_array_module(x).exp(x)
        return self.y

    def backward(self, gy):
        return (gy * self.y,)


class Log(Function):
    def forward(self, x):
        self.x = x
        return get_array_module(x).log(x)

    def backward(self, gy):
        return (gy / self.x,)


class MatMul(Function):
    """numpy.matmul semantics: 1-D operands are promoted, leading axes broadcast."""

    @classmethod
    def apply(cls, a, b):
        a, b = as_tensor(a), as_tensor(b)
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"MatMul: operands must have at least one axis, got shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        k_a = a.shape[-1]
        k_b = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            raise ValueError(f"MatMul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not match "
                             f"(inner dimensions {k_a} != {k_b})")
        if a.dtype != b.dtype:
            raise TypeError(f"MatMul: dtypes differ: {tuple(a.shape)} {a.dtype} @ "
                            f"{tuple(b.shape)} {b.dtype}")
        return super().apply(a, b)

    def forward(self, a, b):
        self.a, self.b = a, b
        return a @ b

    def backward(self, gy):
        xp = get_array_module(gy)
        a, b = self.a, self.b
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if a.ndim == 1:
            gy = xp.expand_dims(gy, -2)
        if b.ndim == 1:
            gy = xp.expand_dims(gy, -1)
        ga = gb = None
        if self.needs_input_grad[0]:
            ga = unbroadcast(gy @ xp.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
        if self.needs_input_grad[1]:
            gb = unbroadcast(xp.swapaxes(a2, -1, -2) @ gy, b2.shape).reshape(b.shape)
        return ga, gb


def _expand_reduced(g, shape, axes, keepdims):
    """Give a reduced gradient back the reduced axes (size 1) so it broadcasts."""
    if not keepdims:
        g = g.reshape([1 if i in axes else n for i, n in enumerate(shape)])
    return g


class Sum(Function):
    def forward(self, x):
        self.shape = x.shape
        self.axes = normalize_axis(self.axis, x.ndim)
        return x.sum(axis=self.axes, keepdims=self.keepdims)

    def backward(self, gy):
        xp = get_array_module(gy)
        g = _expand_reduced(gy, self.shape, self.axes, self.keepdims)
        return (xp.broadcast_to(g, self.shape),)


class Mean(Function):
    def forward(self, x):
        self.shape = x.shape
        self.axes = normalize_axis(self.axis, x.ndim)
        self.count = int(np.prod([x.shape[a] for a in self.axes]))
        return x.mean(axis=self.axes, keepdims=self.keepdims)

    def backward(self, gy):
        xp = get_array_module(gy)
        g = _expand_reduced(gy, self.shape, self.axes, self.keepdims) / self.count
        return (xp.broadcast_to(g, self.shape).astype(gy.dtype, copy=False),)


class Max(Function):
    """Gradient shared equally among tied maxima."""

    def forward(self, x):
        if x.size == 0:
            raise ValueError(f"Max: cannot reduce an empty array of shape {tuple(x.shape)}")
        self.axes = normalize_axis(self.axis, x.ndim)
        y = x.max(axis=self.axes, keepdims=True)
        self.x, self.y = x, y
        return y if self.keepdims else y.reshape([n for i, n in enumerate(y.shape) if i not in self.axes])

    def backward(self, gy):
        mask = self.x == self.y
        g = _expand_reduced(gy, self.x.shape, self.axes, self.keepdims)
        return (mask * (g / mask.sum(axis=self.axes, keepdims=True)).astype(gy.dtype),)


class Reshape(Function):
    def forward(self, x):
        self.in_shape = x.shape
        try:
            return x.reshape(self.shape)
        except ValueError:
            raise ValueError(f"Reshape: cannot reshape {tuple(x.shape)} ({x.size} elements) "
                             f"into {tuple(self.shape)}") from None

    def backward(self, gy):
        return (gy.reshape(self.in_shape),)


class Transpose(Function):
    def forward(self, x):
        self.axes_ = tuple(range(x.ndim))[::-1] if self.axes is None else \
            tuple(a % x.ndim for a in self.axes)
        if sorted(self.axes_) != list(range(x.ndim)):
            raise ValueError(f"Transpose: axes {self.axes} do not permute a {x.ndim}-D "
                             f"input of shape {tuple(x.shape)}")
        return x.transpose(self.axes_)

    def backward(self, gy):
        return (gy.transpose(np.argsort(self.axes_)),)


def _is_basic_index(index):
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice, np.integer)) for i in items)


class GetItem(Function):
    def forward(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        try:
            return x[self.index]
        except IndexError as e:
            raise IndexError(f"GetItem: {e} (input shape {tuple(x.shape)})") from None

    def backward(self, gy):
        xp = get_array_module(gy)
        gx = xp.zeros(self.shape, dtype=gy.dtype)
        if _is_basic_index(self.index):
            gx[self.index] = gy
        else:
            xp.add.at(gx, self.index, gy)           # repeated indices accumulate
        return (gx,)


class Concatenate(Function):
    def forward(self, *xs):
        self.sizes = [x.shape[self.axis] for x in xs]
        xp = get_array_module(xs[0])
        try:
            return xp.concatenate(xs, axis=self.axis)
        except ValueError:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs)
            raise ValueError(f"Concatenate: shapes {shapes} do not match off axis {self.axis}") from None

    def backward(self, gy):
        xp = get_array_module(gy)
        return tuple(xp.split(gy, np.cumsum(self.sizes)[:-1].tolist(), axis=self.axis))


# ---- public wrappers -------------------------------------------------------------

def add(a, b):
    return Add.apply(a, b)


def sub(a, b):
    return Sub.apply(a, b)


def mul(a, b):
    return Mul.apply(a, b)


def div(a, b):
    return Div.apply(a, b)


def pow(a, b):  # noqa: A001 - mirrors the operator's name
    return Pow.apply(a, b)


def neg(x):
    return Neg.apply(as_tensor(x))


def exp(x):
    return Exp.apply(as_tensor(x))


def log(x):
    return Log.apply(as_tensor(x))


def matmul(a, b):
    return MatMul.apply(a, b)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    return Sum.apply(as_tensor(x), axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(as_tensor(x), axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return Max.apply(as_tensor(x), axis=axis, keepdims=keepdims)


def reshape(x, *shape):
    shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
    return Reshape.apply(as_tensor(x), shape=shape)


def flatten(x, start_axis=1):
    x = as_tensor(x)
    return reshape(x, tuple(x.shape[:start_axis]) + (-1,))


def transpose(x, *axes):
    axes = tuple(axes[0]) if len(axes) == 1 and not isinstance(axes[0], int) else axes
    return Transpose.apply(as_tensor(x), axes=axes or None)


def getitem(x, index):
    Tensor = type(x)
    if isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    elif isinstance(index, Tensor):
        index = index.data
    return GetItem.apply(x, index=index)


def concatenate(tensors, axis=0):
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("Concatenate: needs at least one tensor")
    return Concatenate.apply(*tensors, axis=axis)
