"""Activations and (log-)softmax."""
from commrt.nn.backend import get_array_module
from commrt.nn.functions._util import as_tensor
from commrt.nn.tensor import Function


class ReLU(Function):
    def forward(self, x):
        y = get_array_module(x).maximum(x, 0)
        self.y = y
        return y

    def backward(self, gy):
        return (gy * (self.y > 0),)


class Tanh(Function):
    def forward(self, x):
        self.y = get_array_module(x).tanh(x)
        return self.y

    def backward(self, gy):
        return (gy * (1 - self.y * self.y),)


class Sigmoid(Function):
    def forward(self, x):
        xp = get_array_module(x)
        # tanh form: no overflow for large |x|
        self.y = (xp.tanh(x * 0.5) + 1) * 0.5
        return self.y

    def backward(self, gy):
        return (gy * self.y * (1 - self.y),)


def _log_softmax(x, axis):
    xp = get_array_module(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Softmax(Function):
    def forward(self, x):
        self.y = get_array_module(x).exp(_log_softmax(x, self.axis))
        return self.y

    def backward(self, gy):
        y = self.y
        return (y * (gy - (gy * y).sum(axis=self.axis, keepdims=True)),)


class LogSoftmax(Function):
    def forward(self, x):
        self.y = _log_softmax(x, self.axis)
        return self.y

    def backward(self, gy):
        xp = get_array_module(gy)
        return (gy - xp.exp(self.y) * gy.sum(axis=self.axis, keepdims=True),)


def relu(x):
    return ReLU.apply(as_tensor(x))


def tanh(x):
    return Tanh.apply(as_tensor(x))


def sigmoid(x):
    return Sigmoid.apply(as_tensor(x))


def softmax(x, axis=-1):
    return Softmax.apply(as_tensor(x), axis=axis)


def log_softmax(x, axis=-1):
    return LogSoftmax.apply(as_tensor(x), axis=axis)
