"""Helpers shared by the function nodes."""
import numpy as np

from commrt.nn.backend import get_array_module


def tensor_class():
    from commrt.nn.tensor import Tensor
    return Tensor


def as_tensor(x, like=None):
    """``x`` as a Tensor; a constant takes the dtype and device of ``like``
    (so that ``float32_tensor * 2.0`` stays float32)."""
    Tensor = tensor_class()
    if isinstance(x, Tensor):
        return x
    if like is not None:
        xp = like.xp
        if np.isscalar(x) or (isinstance(x, np.ndarray) and x.ndim == 0):
            dtype = like.dtype if like.dtype.kind == "f" else None
            return Tensor._wrap(xp.asarray(x, dtype=dtype), False)
        return Tensor._wrap(xp.asarray(x), False)
    return Tensor._wrap(get_array_module(x).asarray(x), False)


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape``: the gradient of a broadcast is a sum over
    the axes it stretched."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def normalize_axis(axis, ndim):
    """A tuple of non-negative axes (all axes when ``axis`` is None)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim if ndim else 0 for a in axes)


def pair(v, what):
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(i) for i in v)
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {v}")
    return v


def require_float(op, *tensors):
    for t in tensors:
        if t.dtype.kind != "f":
            raise TypeError(f"{op}: expected a floating-point input, got dtype {t.dtype} "
                            f"for shape {tuple(t.shape)}")


def require_same_dtype(op, *tensors):
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        desc = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in tensors)
        raise TypeError(f"{op}: inputs must share one dtype, got {desc}")
