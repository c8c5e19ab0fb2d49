"""CuPy reduction kernels for device arrays, one ElementwiseKernel per (op, dtype).

``dst = combine(dst, src)`` in place on the array's current stream.  Float16
sum and prod are computed in float32 and rounded once; MIN/MAX propagate NaN
like NumPy; logical ops store 0/1 in the array's dtype.
"""
import functools

import cupy
import numpy as np

# C expressions over the two operands ``d`` (dst element) and ``s`` (src element).
_EXPR = {
    "sum": "d + s",
    "prod": "d * s",
    "min": "(s < d || s != s) ? s : d",
    "max": "(s > d || s != s) ? s : d",
    "land": "(d != 0) && (s != 0)",
    "lor": "(d != 0) || (s != 0)",
    "band": "d & s",
    "bor": "d | s",
    "bxor": "d ^ s",
}


@functools.lru_cache(maxsize=None)
def reduce_kernel(op, dtype):
    """The elementwise kernel for ``op`` on ``dtype`` (a dtype string), built once."""
    expr = _EXPR[op]
    if np.dtype(dtype) == np.float16 and op in ("sum", "prod"):
        expr = expr.replace("d", "(float)d").replace("s", "(float)s")
    body = f"d = (T)({expr})"
    return cupy.ElementwiseKernel("T s", "T d", body, f"commrt_reduce_{op}_{np.dtype(dtype).name}")


@functools.lru_cache(maxsize=None)
def scale_kernel(dtype):
    if np.dtype(dtype).kind in "iu":
        body = "b = (T)(b >= 0 ? b / n : -((-b + n - 1) / n))"  # floor division
    elif np.dtype(dtype) == np.float16:
        body = "b = (T)((float)b / (float)n)"
    else:
        body = "b = (T)(b / n)"
    return cupy.ElementwiseKernel("int64 n", "T b", body, f"commrt_scale_{np.dtype(dtype).name}")


def reduce_into(dst, src, op):
    if dst.size:
        reduce_kernel(op, dst.dtype.str)(src, dst)
    return dst


def scale_into(buf, n):
    if buf.size:
        scale_kernel(buf.dtype.str)(n, buf)
    return buf


def empty(n, dtype):
    return cupy.empty(n, dtype)


def cast_into(dst, src):
    cupy.copyto(dst.reshape(-1), cupy.asarray(src).reshape(-1), casting="unsafe")
    return dst
