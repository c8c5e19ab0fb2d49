"""The coordinator's arrays for torch tensors, on commrt.torch's tensor adapter.

commrt.torch does the conversion (zero copy for contiguous CPU tensors, an
explicit staged copy for others, bfloat16 as commrt's BFLOAT16); this module
only adds Horovod's rules: inputs must be contiguous, and bfloat16 tensors
that ranks reduce are staged as float32, because pre/post-scaling and
averaging are NumPy arithmetic, which BFLOAT16 arrays do not have.
Each function returns (flat array, finish): finish() writes a staged
result back into the tensor.
"""
import torch

from commrt.kernels.bfloat16 import BFLOAT16
from commrt.torch import as_numpy, contiguous
from commrt.torch import to_tensor as _from_numpy


def noop():
    pass


def check_tensor(tensor, what="tensor"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise ValueError("sparse tensors go through sparse_allreduce_async or sparse_as_dense")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def dtype_code(array):
    """The dtype as the coordinator's signatures carry it."""
    dt = array.dtype
    # BFLOAT16 is the only structured dtype that reaches here (== on it is slow)
    return "bfloat16" if dt.names is not None and dt == BFLOAT16 else dt.str


def reduce_view(tensor):
    """(array reduced in place, finish) for a tensor that ranks combine."""
    if tensor.dtype is torch.bfloat16:
        wide = tensor.detach().float()

        def finish():
            with torch.no_grad():
                tensor.copy_(wide)
        return as_numpy(wide), finish
    return move_view(tensor)


def move_view(tensor):
    """(array, finish) for a tensor that is only moved, or reduced natively."""
    if tensor.is_cpu and tensor.dtype is not torch.bfloat16:
        try:                 # the common case, without the adapter's per-call checks:
            return tensor.detach().numpy().reshape(-1), noop
        except (RuntimeError, TypeError):        # conj/neg bit, a dtype NumPy lacks
            pass
    staged, back = contiguous(tensor)
    return as_numpy(staged), back or noop


def to_tensor(array, like):
    """A tensor of like's dtype and device holding array (a result the coordinator made)."""
    t = _from_numpy(array)
    if t.dtype != like.dtype:
        t = t.to(like.dtype)
    return t if like.device.type == "cpu" else t.to(like.device)
