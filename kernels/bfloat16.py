"""bfloat16 on NumPy, which has no such type: a 2-byte storage dtype and the two
conversions every bfloat16 kernel is built from.

``BFLOAT16`` is a one-field structured dtype over a little-endian uint16 (the
upper half of a float32): distinct from uint16 (so a collective never sums
bfloat16 bits as integers), the same size and bytes as torch.bfloat16, and
free to view either way (``a.view(np.uint16)``, ``u.view(BFLOAT16)``).
Kernels widen to float32 exactly (``widen``), compute one IEEE float32
operation per element and round back to nearest, ties to even (``narrow_into``),
which is what torch's own bfloat16 arithmetic does on the CPU (c10::BFloat16:
compute in float, ``round_to_nearest_even``, any NaN becomes 0x7FC0).
"""
import numpy as np

BFLOAT16 = np.dtype([("bfloat16", "<u2")])
_U2 = np.dtype("<u2")
NAN_BITS = 0x7FC0


def is_bfloat16(dtype):
    return dtype == BFLOAT16


def bits(a):
    """The uint16 view of a bfloat16 array."""
    return a.view(_U2)


def widen(a, out=None):
    """float32 copy of a bfloat16 (or its uint16 bits) array: exact."""
    u = a.view(_U2).reshape(-1)
    w = np.left_shift(u, 16, dtype=np.uint32, out=None if out is None else out.view(np.uint32))
    return w.view(np.float32)


def narrow_into(dst, f):
    """dst (bfloat16) = f (float32) rounded to nearest, ties to even; NaN -> 0x7FC0."""
    u = np.ascontiguousarray(f, dtype=np.float32).reshape(-1).view(np.uint32)
    r = (u >> 16) & 1
    r += 0x7FFF
    r += u
    r >>= 16
    d = dst.view(_U2).reshape(-1)
    d[...] = r
    nan = f.reshape(-1) != f.reshape(-1)
    if nan.any():
        d[nan] = NAN_BITS
    return dst


def from_float32(f):
    """A new bfloat16 array holding f rounded to nearest even."""
    f = np.asarray(f, dtype=np.float32)
    out = np.empty(f.shape, BFLOAT16)
    narrow_into(out, f)
    return out
