"""DistributedSampler: disjoint shards whose union is the dataset, the same
permutation on every rank from the shared seed, a new one each epoch, and the
padding / drop-last policies."""
import numpy as np
import pytest

from commrt.data import ArrayDataset, DataLoader
from commrt.parallel import DistributedSampler


def shards(n, size, **kw):
    return [DistributedSampler(n, (r, size), **kw) for r in range(size)]


@pytest.mark.parametrize("n", [0, 1, 7, 12, 13, 100])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_shards_are_disjoint_and_cover_the_dataset(n, size):
    parts = [s.indices() for s in shards(n, size, drop_last=True)]
    together = np.concatenate(parts)
    assert len(set(together.tolist())) == len(together)          # disjoint
    assert all(len(p) == n // size for p in parts)                # equal steps on every rank
    padded = [s.indices() for s in shards(n, size, drop_last=False)]
    assert all(len(p) == -(-n // size) for p in padded)
    assert set(np.concatenate(padded).tolist()) == set(range(n))  # nothing left out
    # padding repeats as few samples as possible
    if n:
        assert len(np.concatenate(padded)) - n == (-n) % size


def test_same_seed_same_permutation_and_new_one_each_epoch():
    a, b = shards(100, 4, seed=7), shards(100, 4, seed=7)
    assert all(np.array_equal(x.indices(), y.indices()) for x, y in zip(a, b))
    first = [s.indices().copy() for s in a]
    for s in a:
        s.set_epoch(1)
    second = [s.indices() for s in a]
    assert not np.array_equal(np.concatenate(first), np.concatenate(second))
    assert set(np.concatenate(second).tolist()) == set(range(100))
    other = shards(100, 4, seed=8)
    assert not np.array_equal(other[0].indices(), first[0])


def test_no_shuffle_is_round_robin():
    assert list(DistributedSampler(10, (1, 3), shuffle=False)) == [1, 4, 7, 0]  # padded
    assert list(DistributedSampler(10, (1, 3), shuffle=False, drop_last=True)) == [1, 4, 7]


def test_with_a_dataloader_and_a_communicator_like_object():
    class Comm:
        rank, size = 1, 2
    data = ArrayDataset(np.arange(10, dtype=np.float32).reshape(10, 1), np.arange(10))
    sampler = DistributedSampler(data, Comm(), seed=3)
    loader = DataLoader(data, 2, sampler=sampler)
    loader.set_epoch(5)
    assert sampler.epoch == 5 and len(loader) == 3
    seen = np.concatenate([y for _, y in loader])
    assert np.array_equal(seen, sampler.indices())


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank 4 out of range"):
        DistributedSampler(10, (4, 4))
    with pytest.raises(TypeError, match="communicator"):
        DistributedSampler(10)
