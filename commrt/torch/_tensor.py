"""The torch tensor adapter: torch.Tensor <-> what commrt moves.

``as_numpy(t)`` is the flat NumPy view of a contiguous CPU tensor, zero copy
(bfloat16 as ``commrt.kernels.bfloat16.BFLOAT16``, the same bytes).
``describe_tensor(t, writable, name)`` is the adapter registered with the one
buffer function (``commrt.transport.buffers``), so point-to-point and the
public collectives take tensors: contiguous CPU tensors in place; any other
(non-contiguous, conjugate or negative views, GPU tensors) through an
explicit contiguous host copy that is copied back once the operation that
writes it has finished, so the answer is right, at the price of two copies.
"""
import numpy as np
import torch

from commrt.kernels.bfloat16 import BFLOAT16
from commrt.transport import buffers as _buffers

_BF16 = torch.bfloat16
_I16 = torch.int16
_CPU = torch.device("cpu")

# torch dtypes with a NumPy twin of the same bytes (bfloat16 through BFLOAT16)
SUPPORTED = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
             torch.float32, torch.float64, torch.complex64, torch.complex128)
_SUPPORTED = frozenset(SUPPORTED)


def _check_dtype(t, name):
    if t.dtype not in _SUPPORTED:
        raise TypeError(f"{name}: commrt cannot move {t.dtype} tensors; supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in SUPPORTED)}")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: commrt moves dense tensors, not {t.layout}")


def in_place_ok(t):
    """Whether t can be handed to commrt without a copy."""
    return t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _contiguous_copy(t):
    return t.detach().resolve_conj().resolve_neg().to(_CPU).clone(
        memory_format=torch.contiguous_format)


def as_numpy(t):
    """The flat NumPy view of a contiguous CPU tensor (zero copy)."""
    if not t.is_contiguous():
        raise ValueError("as_numpy: the tensor is not contiguous (use contiguous())")
    return view(t)


def view(t):
    """as_numpy without the check (the caller knows t is in-place-able)."""
    t = t.detach()
    if t.dtype is _BF16:
        return t.view(_I16).numpy().reshape(-1).view(BFLOAT16)
    return t.numpy().reshape(-1)


def to_tensor(a, dtype=None):
    """A torch tensor sharing a NumPy array's memory (BFLOAT16 -> torch.bfloat16)."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(_BF16)
    return torch.from_numpy(a)


def describe_tensor(t, writable, name="buf"):
    _check_dtype(t, name)
    if in_place_ok(t):
        return _buffers.Buffer(as_numpy(t), "cpu", t)
    staged = _contiguous_copy(t)
    host = as_numpy(staged)
    device = t.device.type

    def back():
        with torch.no_grad():
            t.copy_(staged)
    return _buffers.Buffer(host, device, t, back if writable else None)


def contiguous(t):
    """(tensor commrt can use in place, copy-back or None): t itself when it is
    in-place-able, else a contiguous CPU copy and the function writing it back."""
    if in_place_ok(t):
        return t, None
    staged = _contiguous_copy(t)

    def back():
        with torch.no_grad():
            t.copy_(staged)
    return staged, back


_buffers.register(torch.Tensor, describe_tensor)
