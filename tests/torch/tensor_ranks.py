"""Rank functions for the tensor adapter tests: torch tensors through commrt's own
point-to-point and collectives (no torch.distributed)."""
import numpy as np
import torch

import commrt.torch  # noqa: F401  (registers the adapter)
from commrt.kernels.bfloat16 import BFLOAT16

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "complex64", "complex128"]


def value(rank, n, dtype):
    dt = getattr(torch, dtype)
    base = torch.arange(n, dtype=torch.float64) % 7 + rank + 1
    if dt is torch.bool:
        return (base.to(torch.int64) % 2 == rank % 2)
    if dt.is_complex:
        return torch.complex(base, -base).to(dt)
    return base.to(dt)


def all_reduce_dtypes(comm, n):
    out = {}
    for dtype in DTYPES:
        t = value(comm.rank, n, dtype)
        ptr = t.data_ptr()
        res = comm.all_reduce(t)
        want = value(0, n, dtype)
        for q in range(1, comm.size):
            want = want | value(q, n, dtype) if want.dtype is torch.bool else want + value(q, n, dtype)
        out[dtype] = (res is t, t.data_ptr() == ptr, bool(torch.equal(t, want)))
    return out


def bfloat16_bits(comm):
    """Every rank's bfloat16 all-reduce equals the sum torch computes, pairwise in rank
    order for N=2; identical bits on every rank whatever N."""
    g = torch.Generator().manual_seed(comm.rank)
    t = (torch.randn(10_001, generator=g) * 100).to(torch.bfloat16)
    mine = t.clone()
    comm.all_reduce(t)
    bits = t.view(torch.int16).numpy().tobytes()
    allbits = comm.all_gather_obj(bits)
    ref = None
    if comm.size == 2:
        others = comm.all_gather_obj(mine)
        ref = bool(torch.equal((others[0] + others[1]), t))
    return len(set(allbits)) == 1, ref


def non_contiguous(comm):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (comm.rank + 1)
    view = base.t()                                        # not contiguous
    comm.all_reduce(view)
    s = comm.size * (comm.size + 1) // 2
    ok_ar = torch.equal(base, torch.arange(24, dtype=torch.float32).reshape(4, 6) * s)
    out = torch.zeros(comm.size, 3, dtype=torch.bfloat16)
    comm.all_gather(out, torch.full((3,), comm.rank, dtype=torch.bfloat16))
    ok_ag = torch.equal(out, torch.arange(comm.size, dtype=torch.bfloat16)[:, None].expand(-1, 3))
    return bool(ok_ar), bool(ok_ag)


def zero_elements(comm):
    t = torch.zeros(0, dtype=torch.bfloat16)
    comm.all_reduce(t)
    comm.broadcast(torch.zeros(0, 5), 0)
    return t.numel()


def p2p(comm):
    """bfloat16, a non-contiguous receive target and a tensor that requires grad."""
    if comm.rank == 0:
        comm.send(torch.arange(8, dtype=torch.bfloat16), 1)
        comm.send(torch.arange(12, dtype=torch.float32), 1, tag=3)
        comm.send(torch.ones(4, requires_grad=True), 1, tag=4)
        return None
    if comm.rank == 1:
        a = torch.zeros(8, dtype=torch.bfloat16)
        st = comm.recv(a, 0)
        b = torch.zeros(4, 3).t()                          # (3, 4) view, not contiguous
        comm.recv(b, 0, 3)
        c = torch.zeros(4)
        comm.recv(c, 0, 4)
        return (st.nbytes, torch.equal(a, torch.arange(8, dtype=torch.bfloat16)),
                torch.equal(b, torch.arange(12, dtype=torch.float32).reshape(3, 4)),
                torch.equal(c, torch.ones(4)))
    return None


def bf16_numpy(comm):
    """A NumPy BFLOAT16 array (no torch on the wire) gives the torch answer."""
    t = torch.full((5,), 1.5 + comm.rank, dtype=torch.bfloat16)
    a = t.view(torch.int16).numpy().view(np.uint16).view(BFLOAT16)
    comm.all_reduce(a, op="max")
    return float(t[0])


def unsupported(comm):
    try:
        comm.all_reduce(torch.zeros(3, dtype=torch.float8_e4m3fn))
    except TypeError as exc:
        return str(exc)
    return None
