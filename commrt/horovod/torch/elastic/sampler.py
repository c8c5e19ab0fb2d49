"""ElasticSampler: each sample of an epoch once, across re-formations of the job.

The epoch's index order is fixed by (seed, epoch); ``record_batch`` counts
what the whole job has processed, that count is part of the committed
state, and after a reset the remaining indices are split afresh over the
new number of ranks.  Horovod's contract: after the last restore, every
sample of the epoch is processed exactly once (padding aside, when the
remainder does not divide by the number of ranks).
"""
import math
import random

import torch.utils.data

from commrt.horovod.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Count a batch of batch_size per rank as processed by the whole job."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = self.remaining_indices[:]
        idx += idx[:self.total_size - len(idx)]
        return iter(idx[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
