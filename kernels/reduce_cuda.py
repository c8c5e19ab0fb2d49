"""Numba CUDA reduction kernels, built by a factory and cached per (op, dtype).

Each kernel is a grid-stride loop ``dst[i] = combine(dst[i], src[i])``; the host
wrappers handle empty arrays, partial blocks (the stride loop covers any
size) and streams.  Float16 is combined in float32 and rounded once.

Tested without a GPU under ``NUMBA_ENABLE_CUDASIM=1`` on tiny arrays
(tests/kernels/test_reduce_cuda.py); the simulator runs the same Python
bodies one thread at a time.
"""
import functools

import numpy as np

import commrt.kernels._jit  # noqa: F401  (threading layer before any Numba use)
from numba import cuda

THREADS = 256
MAX_BLOCKS = 4096


# -- combine functions (device) ---------------------------------------------------
@cuda.jit(device=True)
def _sum(a, b):
    return a + b


@cuda.jit(device=True)
def _prod(a, b):
    return a * b


@cuda.jit(device=True)
def _min(a, b):
    return a if (a < b or a != a) else b    # np.minimum: left NaN wins, a tie gives b


@cuda.jit(device=True)
def _max(a, b):
    return a if (a > b or a != a) else b


@cuda.jit(device=True)
def _land(a, b):
    return (a != 0) and (b != 0)


@cuda.jit(device=True)
def _lor(a, b):
    return (a != 0) or (b != 0)


@cuda.jit(device=True)
def _band(a, b):
    return a & b


@cuda.jit(device=True)
def _bor(a, b):
    return a | b


@cuda.jit(device=True)
def _bxor(a, b):
    return a ^ b


COMBINE = {"sum": _sum, "prod": _prod, "min": _min, "max": _max, "land": _land,
           "lor": _lor, "band": _band, "bor": _bor, "bxor": _bxor}


# -- factories -------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def reduce_kernel(op, dtype):
    """The CUDA kernel ``(dst, src)`` for ``op`` on ``dtype`` (a dtype string), built once."""
    combine = COMBINE[op]
    if np.dtype(dtype) == np.float16 and op in ("sum", "prod"):
        @cuda.jit
        def kernel(dst, src):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < dst.size:
                dst[i] = combine(np.float32(dst[i]), np.float32(src[i]))
                i += stride
    else:
        @cuda.jit
        def kernel(dst, src):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < dst.size:
                dst[i] = combine(dst[i], src[i])
                i += stride
    return kernel


@functools.lru_cache(maxsize=None)
def scale_kernel(dtype):
    """``buf[i] /= n`` (floor division for integers), built once per dtype."""
    if np.dtype(dtype).kind in "iu":
        @cuda.jit
        def kernel(buf, n):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < buf.size:
                buf[i] = buf[i] // n
                i += stride
    elif np.dtype(dtype) == np.float16:
        @cuda.jit
        def kernel(buf, n):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < buf.size:
                buf[i] = np.float32(buf[i]) / np.float32(n)
                i += stride
    else:
        @cuda.jit
        def kernel(buf, n):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < buf.size:
                buf[i] = buf[i] / n
                i += stride
    return kernel


@functools.lru_cache(maxsize=None)
def cast_kernel(dst_dtype, src_dtype):
    """``dst[i] = src[i]`` converting the dtype, built once per pair."""
    @cuda.jit
    def kernel(dst, src):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = src[i]
            i += stride
    return kernel


def _grid(n):
    return min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)


def _flat(a):
    return a.ravel() if a.ndim != 1 else a


# -- host wrappers ---------------------------------------------------------------------
def reduce_into(dst, src, op, stream=0):
    """``dst = dst OP src`` on the device; ``op`` is a canonical kernel name."""
    n = dst.size
    if n == 0:
        return dst
    kernel = reduce_kernel(op, dst.dtype.str)
    kernel[_grid(n), THREADS, stream](_flat(dst), _flat(src))
    return dst


def scale_into(buf, n, stream=0):
    if buf.size:
        scale_kernel(buf.dtype.str)[_grid(buf.size), THREADS, stream](_flat(buf), n)
    return buf


def empty(n, dtype):
    return cuda.device_array(n, dtype)


def cast_into(dst, src, stream=0):
    if dst.size:
        cast_kernel(dst.dtype.str, src.dtype.str)[_grid(dst.size), THREADS, stream](_flat(dst), _flat(src))
    return dst
