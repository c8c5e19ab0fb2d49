"""Ready-made datasets: the scikit-learn digits and synthetic images."""
import numpy as np

from commrt.data.dataset import ArrayDataset, Dataset


def load_digits(split="train", test_fraction=0.2, seed=0, dtype=np.float32):
    """The 1797 8x8 handwritten digits that ship inside scikit-learn (no
    download) as images (N, 1, 8, 8) scaled to [0, 1] and int64 labels.

    The split is stratified and depends only on ``seed``: 'train' and 'test'
    are disjoint and together cover everything ('all')."""
    from sklearn.datasets import load_digits as _load

    bunch = _load()
    images = (bunch.images / 16.0).astype(dtype)[:, None]
    labels = bunch.target.astype(np.int64)
    if split == "all":
        return ArrayDataset(images, labels)
    if split not in ("train", "test"):
        raise ValueError(f"load_digits: split must be 'train', 'test' or 'all', got {split!r}")
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):                    # stratified: the same fraction of each class
        members = rng.permutation(np.flatnonzero(labels == c))
        test[members[:round(len(members) * test_fraction)]] = True
    keep = test if split == "test" else ~test
    return ArrayDataset(images[keep], labels[keep])


class SyntheticImages(Dataset):
    """``length`` images of ``shape`` in ``num_classes`` learnable classes:
    each image is its class's fixed random pattern plus noise.  Sample ``i``
    is generated from ``(seed, i)`` alone, so any size costs no memory and
    every process sees the same data."""

    def __init__(self, length, shape=(1, 28, 28), num_classes=10, noise=0.5, seed=0,
                 dtype=np.float32):
        self.length, self.shape, self.num_classes = length, tuple(shape), num_classes
        self.noise, self.seed, self.dtype = noise, seed, dtype
        self.patterns = np.random.default_rng([seed, 2**32 - 1]).standard_normal(
            (num_classes,) + self.shape).astype(dtype)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if not -self.length <= index < self.length:
            raise IndexError(f"SyntheticImages: index {index} out of range for length {self.length}")
        index %= self.length
        rng = np.random.default_rng([self.seed, index])
        label = int(rng.integers(self.num_classes))
        image = self.patterns[label] + self.noise * rng.standard_normal(self.shape, dtype=self.dtype)
        return image, np.int64(label)

    def get_batch(self, indices):
        samples = [self[int(i)] for i in indices]
        return (np.stack([s[0] for s in samples]),
                np.array([s[1] for s in samples], dtype=np.int64))


def synthetic_batch(batch_size, shape=(1, 28, 28), num_classes=10, seed=0, dtype=np.float32):
    """One random batch (images, labels) for benchmarks."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch_size,) + tuple(shape), dtype=dtype),
            rng.integers(num_classes, size=batch_size).astype(np.int64))
