"""DataLoader: batches of a dataset in a seeded order.

The order of epoch ``e`` depends only on ``(seed, e)``, so every process of a
data-parallel job can compute the same permutation; a ``sampler`` (any
iterable of indices with an optional ``set_epoch``) replaces the built-in
order, e.g. to give each rank its own shard.
"""
import math

import numpy as np

from commrt.data.dataset import fetch_batch


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=False, seed=0, drop_last=False, sampler=None):
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be >= 1, got {batch_size}")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: shuffle and sampler are exclusive (the sampler orders)")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.seed, self.drop_last, self.sampler = shuffle, seed, drop_last, sampler
        self.epoch = 0

    def set_epoch(self, epoch):
        """Choose the epoch whose order the next iteration uses."""
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def indices(self):
        if self.sampler is not None:
            return np.fromiter(iter(self.sampler), dtype=np.int64)
        if self.shuffle:
            return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))
        return np.arange(len(self.dataset))

    def __len__(self):
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        order = self.indices()
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            yield fetch_batch(self.dataset, order[start:start + self.batch_size])
