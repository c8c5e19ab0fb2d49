"""SyncBatchNorm: batch normalisation over the whole global batch.

Each rank sums its count, its values and their squares per channel; one
Sum allreduce (an autograd function, so backward allreduces the gradients
of those sums) gives the global mean and variance.  Ranks may hold batches
of different sizes.
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from commrt.horovod.process_sets import global_process_set
from commrt.horovod.torch.mpi_ops import Sum, allreduce


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous batch normalisation across ranks (Horovod's signature)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training:
            return super().forward(input)            # eval: the running statistics
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
        c = input.shape[1]
        x = input.transpose(0, 1).reshape(c, -1)
        count = torch.full((1,), x.shape[1], dtype=x.dtype)
        stats = torch.cat([count, x.sum(1), (x * x).sum(1)])
        stats = allreduce(stats, op=Sum, name=None, process_set=self.process_set)
        n = stats[0]
        mean = stats[1:1 + c] / n
        var = stats[1 + c:] / n - mean * mean
        if self.training and self.track_running_stats:
            m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
            with torch.no_grad():
                unbiased = var * (n / (n - 1).clamp(min=1))
                self.running_mean.mul_(1 - m).add_(mean.detach() * m)
                self.running_var.mul_(1 - m).add_(unbiased.detach() * m)
        shape = [1, c] + [1] * (input.dim() - 2)
        y = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y
