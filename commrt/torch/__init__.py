"""commrt inside PyTorch: the torch.distributed backend "commrt" and the tensor adapter.

``import commrt.torch`` registers both (``import torch`` alone does it where
the ``torch.backends`` entry point is installed, torch >= 2.5).  This package
and ``commrt.horovod`` are the only ones that import torch (DESIGN.md).
"""
from commrt.torch._tensor import as_numpy, contiguous, describe_tensor, to_tensor  # noqa: F401

__all__ = ["as_numpy", "to_tensor", "describe_tensor", "contiguous"]
