"""Torch tensors <-> the NumPy arrays the coordinator moves.

A contiguous CPU tensor is shared without a copy (its NumPy view); bfloat16,
which NumPy lacks, travels as its 16-bit pattern where nothing is combined
and as float32 where ranks reduce; other devices are staged through host
memory.  Each function returns (array, finish): finish() writes a staged
result back into the tensor.
"""
import torch

_REDUCE_AS = {torch.bfloat16: torch.float32}
_MOVE_AS = {torch.bfloat16: torch.int16}


def _noop():
    pass


def check_tensor(tensor, what="tensor"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if tensor.is_sparse:
        raise ValueError("sparse tensors go through sparse_allreduce_async or sparse_as_dense")


def reduce_view(tensor):
    """(array reduced in place, finish) for a tensor that ranks combine."""
    wide = _REDUCE_AS.get(tensor.dtype)
    if wide is None and tensor.device.type == "cpu":
        return tensor.detach().numpy(), _noop
    host = tensor.detach().to("cpu", wide or tensor.dtype).contiguous()

    def finish():
        with torch.no_grad():
            tensor.copy_(host)
    return host.numpy(), finish


def move_view(tensor):
    """(array, finish) for a tensor that is only moved (broadcast, gather)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        host = t.cpu()
        as_ = _MOVE_AS.get(host.dtype)
        arr = (host.view(as_) if as_ else host).numpy()

        def finish():
            with torch.no_grad():
                tensor.copy_(host)
        return arr, finish
    as_ = _MOVE_AS.get(t.dtype)
    return (t.view(as_) if as_ else t).numpy(), _noop


def to_tensor(array, like):
    """A tensor on like's device and of like's dtype holding array (moved bytes)."""
    t = torch.from_numpy(array)
    if like.dtype in _MOVE_AS:
        t = t.view(like.dtype)
    elif t.dtype != like.dtype:
        t = t.to(like.dtype)
    return t if like.device.type == "cpu" else t.to(like.device)
