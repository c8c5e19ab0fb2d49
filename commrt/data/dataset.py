"""Datasets: anything with ``__len__`` and ``__getitem__``.  A dataset may also
define ``get_batch(indices)`` returning whole batches at once (one fancy-index
per array instead of a Python loop over samples); DataLoader uses it."""
import numpy as np


class Dataset:
    def __len__(self):
        raise NotImplementedError

    def __getitem__(self, index):
        raise NotImplementedError


class ArrayDataset(Dataset):
    """Samples are rows of equally long arrays, e.g. ``ArrayDataset(images, labels)``."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"ArrayDataset: arrays differ in length: {[len(a) for a in arrays]}")
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def get_batch(self, indices):
        return tuple(a[indices] for a in self.arrays)


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, np.asarray(indices, dtype=np.int64)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[int(self.indices[index])]

    def get_batch(self, indices):
        return fetch_batch(self.dataset, self.indices[indices])


def fetch_batch(dataset, indices):
    """One batch as a tuple of stacked arrays."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices)
    samples = [dataset[int(i)] for i in indices]
    if not isinstance(samples[0], tuple):
        return np.stack(samples)
    return tuple(np.stack(field) for field in zip(*samples))
