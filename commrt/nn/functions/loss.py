"""Losses: cross-entropy (fused with log-softmax) and mean squared error."""
from commrt.nn.backend import get_array_module
from commrt.nn.functions._util import as_tensor, require_float
from commrt.nn.functions.activation import _log_softmax
from commrt.nn.tensor import Function

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    def forward(self, logits, targets):
        xp = get_array_module(logits)
        n = logits.shape[0]
        self.logp = _log_softmax(logits, 1)
        self.targets = targets
        losses = -self.logp[xp.arange(n), targets]
        if self.reduction == "none":
            return losses
        total = losses.sum()
        return total / n if self.reduction == "mean" else total

    def backward(self, gy):
        xp = get_array_module(gy)
        n = self.logp.shape[0]
        g = xp.exp(self.logp)                        # softmax
        g[xp.arange(n), self.targets] -= 1
        if self.reduction == "none":
            g *= gy[:, None]
        else:
            g *= gy / n if self.reduction == "mean" else gy
        return g, None


def cross_entropy(logits, targets, reduction="mean"):
    """Mean negative log-likelihood of integer class ``targets`` (N,) under
    ``softmax(logits)`` with logits of shape (N, classes)."""
    logits = as_tensor(logits)
    if not hasattr(targets, "requires_grad"):     # labels from a loader: onto the logits' device
        targets = as_tensor(get_array_module(logits.data).asarray(targets))
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    require_float("cross_entropy", logits)
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (N, classes) and targets (N,), got "
                         f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}")
    if targets.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: targets must be integer class indices, got dtype "
                        f"{targets.dtype}")
    if targets.size and (int(targets.data.min()) < 0 or int(targets.data.max()) >= logits.shape[1]):
        raise ValueError(f"cross_entropy: targets must lie in [0, {logits.shape[1]}), got range "
                         f"[{int(targets.data.min())}, {int(targets.data.max())}]")
    return CrossEntropy.apply(logits, targets, reduction=reduction)


class MSE(Function):
    def forward(self, pred, target):
        self.diff = pred - target
        sq = self.diff * self.diff
        if self.reduction == "none":
            return sq
        return sq.mean() if self.reduction == "mean" else sq.sum()

    def backward(self, gy):
        g = self.diff * 2
        if self.reduction == "mean":
            g *= gy / self.diff.size
        else:
            g = g * gy
        return g, (-g if self.needs_input_grad[1] else None)


def mse_loss(pred, target, reduction="mean"):
    pred = as_tensor(pred)
    target = as_tensor(target, like=pred)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if pred.shape != target.shape:
        raise ValueError(f"mse_loss: prediction {tuple(pred.shape)} and target "
                         f"{tuple(target.shape)} must have the same shape")
    require_float("mse_loss", pred)
    return MSE.apply(pred, target, reduction=reduction)
