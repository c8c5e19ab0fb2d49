"""DistributedSampler: each rank's disjoint shard of a dataset, reshuffled every
epoch from a seed all ranks share.

    sampler = DistributedSampler(train_set, comm, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size, sampler=sampler)
    for epoch in range(epochs):
        loader.set_epoch(epoch)          # or sampler.set_epoch(epoch)
        ...

Epoch ``e`` permutes the indices with ``default_rng([seed, e])`` (the same
permutation on every rank, with no communication), then rank ``r`` of ``n``
takes positions ``r, r + n, r + 2n, ...``: the shards are disjoint and their
union is the dataset.  Where ``len(dataset)`` is not a multiple of ``n``,
``drop_last=False`` pads with the first indices of the permutation (every
rank then has ``ceil(len / n)`` samples, a few seen twice) and
``drop_last=True`` drops the tail (``floor(len / n)`` each, a few not seen
this epoch): either way every rank runs the same number of steps, which
synchronous SGD needs.
"""
import math

import numpy as np

__all__ = ["DistributedSampler"]


class DistributedSampler:
    def __init__(self, dataset, comm=None, shuffle=True, seed=0, drop_last=False, *,
                 rank=None, size=None):
        """``dataset``: a dataset (anything with ``len``) or its length.  The
        rank and world size come from ``comm``, a ``(rank, size)`` pair, or
        the ``rank=``/``size=`` keywords."""
        n = dataset if isinstance(dataset, (int, np.integer)) else len(dataset)
        if isinstance(comm, tuple):
            rank, size = comm
        elif comm is not None:
            rank, size = comm.rank, comm.size
        if rank is None or size is None:
            raise TypeError("DistributedSampler: pass a communicator, (rank, size), or rank= and "
                            "size=")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"DistributedSampler: rank {rank} out of range for size {size}")
        if n < 0:
            raise ValueError(f"DistributedSampler: dataset length must be >= 0, got {n}")
        self.dataset_len, self.rank, self.size = int(n), int(rank), int(size)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        if self.drop_last:
            self.num_samples = self.dataset_len // self.size
        else:
            self.num_samples = math.ceil(self.dataset_len / self.size)
        self.total_size = self.num_samples * self.size

    def set_epoch(self, epoch):
        """Choose the epoch whose permutation the next iteration uses."""
        self.epoch = int(epoch)

    def __len__(self):
        return self.num_samples

    def order(self):
        """The whole epoch's order before sharding, padded or cut to a multiple of size."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.dataset_len)
        else:
            order = np.arange(self.dataset_len)
        if self.total_size > len(order) and len(order):
            reps = math.ceil(self.total_size / len(order))
            order = np.tile(order, reps)
        return order[:self.total_size]

    def indices(self):
        """This rank's indices for the current epoch (a NumPy array)."""
        return self.order()[self.rank:self.total_size:self.size]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __repr__(self):
        return (f"DistributedSampler(len={self.dataset_len}, rank={self.rank}, size={self.size}, "
                f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
                f"epoch={self.epoch})")
