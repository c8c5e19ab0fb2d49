"""commrt.data: datasets and the DataLoader."""
from commrt.data.dataset import ArrayDataset, Dataset, Subset  # noqa: F401
from commrt.data.datasets import SyntheticImages, load_digits, synthetic_batch  # noqa: F401
from commrt.data.loader import DataLoader  # noqa: F401
