"""Weight initialisation (in place on a Parameter's data).

Kaiming (He) keeps the variance of activations constant through ReLU
layers; Xavier (Glorot) through linear/tanh layers.
"""
import math

from commrt.nn.random import generator


def fans(shape):
    """(fan_in, fan_out) of a weight of shape (out, in, *kernel)."""
    if len(shape) < 2:
        raise ValueError(f"fans need a weight with at least 2 axes, got shape {tuple(shape)}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


_GAINS = {"linear": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0)}


def gain(nonlinearity):
    try:
        return _GAINS[nonlinearity]
    except KeyError:
        raise ValueError(f"unknown nonlinearity {nonlinearity!r}; one of {sorted(_GAINS)}") from None


def _fill_uniform(t, bound):
    xp = t.xp
    t.data[...] = generator(xp).uniform(-bound, bound, t.shape).astype(t.dtype)
    return t


def _fill_normal(t, std):
    xp = t.xp
    t.data[...] = (generator(xp).standard_normal(t.shape) * std).astype(t.dtype)
    return t


def kaiming_uniform_(t, nonlinearity="relu", mode="fan_in"):
    fan = fans(t.shape)[0 if mode == "fan_in" else 1]
    return _fill_uniform(t, gain(nonlinearity) * math.sqrt(3.0 / fan))


def kaiming_normal_(t, nonlinearity="relu", mode="fan_in"):
    fan = fans(t.shape)[0 if mode == "fan_in" else 1]
    return _fill_normal(t, gain(nonlinearity) / math.sqrt(fan))


def xavier_uniform_(t, nonlinearity="linear"):
    fan_in, fan_out = fans(t.shape)
    return _fill_uniform(t, gain(nonlinearity) * math.sqrt(6.0 / (fan_in + fan_out)))


def xavier_normal_(t, nonlinearity="linear"):
    fan_in, fan_out = fans(t.shape)
    return _fill_normal(t, gain(nonlinearity) * math.sqrt(2.0 / (fan_in + fan_out)))


def zeros_(t):
    t.data[...] = 0
    return t


def ones_(t):
    t.data[...] = 1
    return t
