# cython: language_level=3
"""Element-wise combine loops with a C entry point, for callers that reduce
from C (the small all-reduce's persistent exchange chain).

``combine_address(op, dtype, src_first=False)`` is the address of a C
function ``void f(void *dst, const void *src, int64_t n)`` computing
``dst[i] = dst[i] OP src[i]`` (``src_first``: ``src[i] OP dst[i]``), or 0
where there is none: bool, complex, logical ops and bitwise ops on floats stay
with ``reduce.py`` (bfloat16 and float16 have loops: float32 arithmetic rounded
to nearest even; float16 only where the compiler has _Float16, see
``HAVE_FLOAT16``).  ``f16_scale`` multiplies or divides a float16 array in
place the same way (an average's last step).  ``combine_into`` runs the same function from
Python (the tests hold it against NumPy; the small path uses it when it
finishes a call in Python, so both ways give the same bits).

Semantics are NumPy's ufuncs' bit for bit (those the small path used before
and ``binary_ufunc`` still gives for float16): integers wrap, MIN/MAX let a NaN
win, and a tie of 0.0 and -0.0 gives the right operand.  The loops are in ``combine.h``; they know nothing of communication.
"""
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t

import numpy as np

cdef extern from "combine.h":
    ctypedef void (*cmrt_combine_fn)(void *dst, const void *src, int64_t n) noexcept nogil
    cmrt_combine_fn cmrt_combine_lookup(int op, int type, int src_first) noexcept nogil
    void cmrt_f16_scale(void *d, int64_t n, float f, int divide) noexcept nogil
    int CMRT_HAVE_F16

OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor")
_OP_INDEX = {name: i for i, name in enumerate(OPS)}
from commrt.kernels.bfloat16 import BFLOAT16

_TYPES = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                np.uint32, np.uint64, np.float32, np.float64, BFLOAT16,
                                np.float16)]
_TYPE_INDEX = {dt: i for i, dt in enumerate(_TYPES)}
HAVE_FLOAT16 = bool(CMRT_HAVE_F16)     # float16 loops and f16_scale are built


cdef cmrt_combine_fn _lookup(op, dtype, bint src_first):
    i = _OP_INDEX.get(op)
    t = _TYPE_INDEX.get(np.dtype(dtype))
    if i is None or t is None:
        return NULL
    return cmrt_combine_lookup(i, t, src_first)


def combine_address(op, dtype, bint src_first=False):
    """The address of the C loop for (op, dtype) as an int, or 0 where there is none.

    op: a kernel name (sum, prod, min, max, band, bor, bxor)."""
    return <size_t>_lookup(op, dtype, src_first)


def combine_into(dst, src, op, bint src_first=False):
    """``dst = dst OP src`` (``src_first``: ``dst = src OP dst``) with the C loop;
    returns dst.  Both C-contiguous of one dtype and size; TypeError where
    (op, dtype) has no C loop (see combine_address)."""
    cdef Py_buffer d, s
    cdef cmrt_combine_fn f
    cdef int64_t n = dst.size
    if not isinstance(dst, np.ndarray) or not isinstance(src, np.ndarray):
        raise TypeError("combine_into: dst and src must be NumPy arrays")
    if dst.dtype != src.dtype or dst.size != src.size:
        raise ValueError(f"combine_into: dst is {dst.size} x {dst.dtype}, src is "
                         f"{src.size} x {src.dtype}")
    f = _lookup(op, dst.dtype, src_first)
    if f == NULL:
        raise TypeError(f"combine_into: no C loop for {op!r} on {dst.dtype}")
    PyObject_GetBuffer(dst, &d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        PyObject_GetBuffer(src, &s, PyBUF_C_CONTIGUOUS)
        try:
            with nogil:
                f(d.buf, s.buf, n)
        finally:
            PyBuffer_Release(&s)
    finally:
        PyBuffer_Release(&d)
    return dst


def f16_scale(buf, factor, bint divide=False):
    """``buf *= np.float16(factor)`` (``divide``: ``buf /= np.float16(factor)``) in
    place on a C-contiguous float16 array, with NumPy's result bit for bit
    (float32 arithmetic, rounded to nearest even) at F16C's speed; returns buf.
    TypeError where the loops are not built (HAVE_FLOAT16 False) or buf is not
    float16."""
    cdef Py_buffer d
    cdef float f = <float>float(np.float16(factor))
    cdef int64_t n
    if not CMRT_HAVE_F16:
        raise TypeError("f16_scale: this build has no float16 loops")
    if not isinstance(buf, np.ndarray) or buf.dtype != np.float16:
        raise TypeError(f"f16_scale: buf must be a float16 NumPy array, got "
                        f"{getattr(buf, 'dtype', type(buf).__name__)}")
    n = buf.size
    PyObject_GetBuffer(buf, &d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        with nogil:
            cmrt_f16_scale(d.buf, n, f, divide)
    finally:
        PyBuffer_Release(&d)
    return buf
