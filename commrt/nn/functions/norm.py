"""Batch normalisation and dropout."""
from commrt.nn.backend import get_array_module
from commrt.nn.functions._util import as_tensor, require_float, require_same_dtype
from commrt.nn.random import generator
from commrt.nn.tensor import Function


class BatchNorm(Function):
    """Normalise over every axis but the channel axis 1.  In training the batch
    statistics are used and the running ones (arrays, updated in place) follow
    them; in evaluation the running statistics are used."""

    def forward(self, x, gamma, beta):
        xp = get_array_module(x)
        self.axes = (0,) + tuple(range(2, x.ndim))
        shape = [1, x.shape[1]] + [1] * (x.ndim - 2)
        if self.training:
            mean = x.mean(axis=self.axes, keepdims=True)
            var = x.var(axis=self.axes, keepdims=True)
            n = x.size // x.shape[1]
            m = self.momentum
            self.running_mean *= 1 - m
            self.running_mean += m * mean.reshape(-1)
            self.running_var *= 1 - m
            self.running_var += (m * n / max(n - 1, 1)) * var.reshape(-1)
        else:
            mean = self.running_mean.reshape(shape)
            var = self.running_var.reshape(shape)
        self.invstd = (1 / xp.sqrt(var + self.eps)).astype(x.dtype)
        self.xhat = (x - mean) * self.invstd
        self.gamma = gamma.reshape(shape)
        del self.running_mean, self.running_var
        return self.xhat * self.gamma + beta.reshape(shape)

    def backward(self, gy):
        axes, xhat = self.axes, self.xhat
        gbeta = gy.sum(axis=axes)
        ggamma = (gy * xhat).sum(axis=axes)
        if self.training:
            n = gy.size // gy.shape[1]
            shape = self.gamma.shape
            gx = (self.gamma * self.invstd / n) * (
                n * gy - gbeta.reshape(shape) - xhat * ggamma.reshape(shape))
        else:
            gx = gy * (self.gamma * self.invstd)
        return gx, ggamma, gbeta


def batch_norm(x, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5):
    x = as_tensor(x)
    require_float("batch_norm", x)
    require_same_dtype("batch_norm", x, gamma, beta)
    if x.ndim not in (2, 3, 4) or x.shape[1] != gamma.shape[0]:
        raise ValueError(f"batch_norm: input {tuple(x.shape)} does not match {gamma.shape[0]} "
                         "channels on axis 1")
    if training and x.size // x.shape[1] < 2:
        raise ValueError(f"batch_norm: training needs more than one value per channel, got "
                         f"input of shape {tuple(x.shape)}")
    return BatchNorm.apply(x, gamma, beta, running_mean=running_mean, running_var=running_var,
                           training=training, momentum=momentum, eps=eps)


class Dropout(Function):
    def forward(self, x):
        xp = get_array_module(x)
        keep = generator(xp).random(x.shape, dtype=x.dtype) >= self.p
        self.scale = keep * x.dtype.type(1 / (1 - self.p))
        return x * self.scale

    def backward(self, gy):
        return (gy * self.scale,)


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""
    x = as_tensor(x)
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    require_float("dropout", x)
    return Dropout.apply(x, p=p)
