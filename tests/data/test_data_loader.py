"""DataLoader batching and ordering; the digits and synthetic datasets."""
import numpy as np
import pytest

from commrt.data import ArrayDataset, DataLoader, Dataset, Subset, SyntheticImages, load_digits


def numbered(n):
    return ArrayDataset(np.arange(n) * 10, np.arange(n))


@pytest.mark.parametrize("n,batch,drop_last,sizes", [
    (10, 3, False, [3, 3, 3, 1]), (10, 3, True, [3, 3, 3]), (9, 3, True, [3, 3, 3]),
    (2, 5, False, [2]), (2, 5, True, []), (0, 4, False, [])])
def test_batch_sizes_and_last_batch_policy(n, batch, drop_last, sizes):
    loader = DataLoader(numbered(n), batch, drop_last=drop_last)
    assert [len(b[1]) for b in loader] == sizes and len(loader) == len(sizes)


def test_unshuffled_order_and_fields():
    xs, ys = zip(*DataLoader(numbered(5), 2))
    np.testing.assert_array_equal(np.concatenate(ys), np.arange(5))
    np.testing.assert_array_equal(np.concatenate(xs), np.arange(5) * 10)


def test_shuffle_is_a_seeded_permutation_that_changes_per_epoch():
    def epoch_order(seed, epoch):
        loader = DataLoader(numbered(20), 6, shuffle=True, seed=seed)
        loader.set_epoch(epoch)
        return np.concatenate([b[1] for b in loader])
    a = epoch_order(0, 0)
    assert sorted(a) == list(range(20)) and not (a == np.arange(20)).all()
    np.testing.assert_array_equal(a, epoch_order(0, 0))
    assert not (a == epoch_order(0, 1)).all() and not (a == epoch_order(1, 0)).all()


def test_sampler_and_generic_datasets():
    class Squares(Dataset):                 # no get_batch: samples are stacked
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return np.array([i, i * i]), i % 2

    class EverySecond:
        def __init__(self):
            self.epochs = []

        def set_epoch(self, e):
            self.epochs.append(e)

        def __iter__(self):
            return iter([1, 3, 5])

        def __len__(self):
            return 3
    sampler = EverySecond()
    loader = DataLoader(Squares(), 2, sampler=sampler)
    loader.set_epoch(4)
    batches = list(loader)
    np.testing.assert_array_equal(batches[0][0], [[1, 1], [3, 9]])
    np.testing.assert_array_equal(batches[1][1], [1])
    assert sampler.epochs == [4] and len(loader) == 2
    with pytest.raises(ValueError, match="exclusive"):
        DataLoader(Squares(), 2, shuffle=True, sampler=sampler)
    sub = Subset(numbered(10), [7, 2])
    assert sub[0] == (70, 7) and [int(v) for v in next(iter(DataLoader(sub, 2)))[1]] == [7, 2]


def test_digits_split_is_stratified_disjoint_and_complete():
    train, test, full = load_digits("train"), load_digits("test"), load_digits("all")
    assert len(train) + len(test) == len(full) == 1797
    x, y = train.arrays
    assert x.shape[1:] == (1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert 0 <= x.min() and x.max() <= 1
    counts = np.bincount(test.arrays[1], minlength=10) / np.bincount(full.arrays[1], minlength=10)
    assert np.all(np.abs(counts - 0.2) < 0.02)
    rows = {r.tobytes() for r in train.arrays[0]}
    assert sum(r.tobytes() in rows for r in test.arrays[0]) < 5      # a few digits repeat exactly
    np.testing.assert_array_equal(load_digits("test").arrays[1], test.arrays[1])
    with pytest.raises(ValueError, match="split"):
        load_digits("validation")


def test_synthetic_images_are_deterministic_per_index_and_learnable():
    a, b = SyntheticImages(1000, shape=(1, 4, 4), seed=3), SyntheticImages(10**9, shape=(1, 4, 4), seed=3)
    np.testing.assert_array_equal(a[17][0], b[17][0])
    x, y = a.get_batch(np.arange(200))
    assert x.shape == (200, 1, 4, 4) and x.dtype == np.float32 and set(y) <= set(range(10))
    # nearest class pattern recovers the label: the classes are separable
    dist = ((x[:, None] - a.patterns[None]) ** 2).sum(axis=(2, 3, 4))
    assert (dist.argmin(1) == y).mean() > 0.95
    with pytest.raises(IndexError):
        a[1000]
