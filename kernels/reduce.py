"""Element-wise reductions, in place: ``reduce_into(dst, src, op)`` is ``dst = dst OP src``.

The collectives call these to combine a received segment with local data;
they know nothing of communication.  Three twins sit behind one dispatcher,
chosen by the array's type:

  numpy.ndarray           Numba CPU loops (``reduce_numba``), serial, or
                          parallel from ``COMMRT_KERNEL_PARALLEL_BYTES`` up;
                          NumPy ufuncs where Numba has no kernel (float16,
                          mixed dtypes, non-contiguous arrays)
  cupy.ndarray            CuPy elementwise kernels (``reduce_cupy``)
  Numba device array      Numba CUDA kernels built per (op, dtype) (``reduce_cuda``)

``reference_reduce_into`` is the NumPy reference every twin is tested against.

Operations are named by string: sum, prod, min, max, land, lor, band, bor,
bxor (any object whose ``name`` is one of these, upper or lower case, works
too, e.g. ``commrt.ReduceOp.SUM``).  AVG is not an element-wise operation: a
collective reduces with sum and finishes with ``scale_into(buf, n)``.

Semantics are NumPy's: integers wrap; MIN/MAX propagate NaN; logical ops
store 0/1 in the array's dtype; on bool, sum is ``or`` and prod is ``and``;
bitwise ops reject floats.  Float16 is combined in float32 and rounded once
per step; ``reduce_into_many`` keeps a float32 accumulator across all its
sources and rounds once at the end.  bfloat16 (``kernels.bfloat16.BFLOAT16``,
NumPy has no such type) follows the same rules: float32 arithmetic rounded to
nearest even (the C combine loops; ``reference_reduce_into`` is NumPy).

Arrays must be the same size; ``dst`` and ``src`` must not partly overlap.
"""
import numpy as np

from commrt.kernels.bfloat16 import BFLOAT16, narrow_into, widen

OPS = ("sum", "prod", "min", "max", "land", "lor", "band", "bor", "bxor")

UFUNCS = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "land": np.logical_and, "lor": np.logical_or,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}

# On bool arrays the arithmetic operations are their logical twins (NumPy's rule).
_BOOL_ALIAS = {"sum": "lor", "prod": "land", "min": "land", "max": "lor"}
_FLOAT_OK = frozenset(("sum", "prod", "min", "max", "land", "lor"))
_COMPLEX_OK = frozenset(("sum", "prod", "land", "lor"))

_ndarray = np.ndarray
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)

# op spelling -> canonical name; filled on first sight of each spelling.
_CANON = {name: name for name in OPS}


def canonical_op(op):
    """The canonical kernel name of ``op`` (a string or an object with ``.name``)."""
    name = _CANON.get(op)
    if name is not None:
        return name
    text = getattr(op, "name", op)
    if not isinstance(text, str) or text.lower() not in OPS:
        if isinstance(text, str) and text.lower() == "avg":
            raise ValueError("avg is not element-wise: reduce with 'sum', then scale_into(buf, n)")
        raise ValueError(f"unknown reduction {op!r}; expected one of {', '.join(OPS)}")
    _CANON[op] = text.lower()
    return _CANON[op]


def check_op_dtype(op, dtype):
    """The kernel op to apply to ``dtype`` for ``op``; TypeError where it has no meaning."""
    name = canonical_op(op)
    dt = np.dtype(dtype)
    kind = "f" if dt == BFLOAT16 else dt.kind
    if kind == "b":
        return _BOOL_ALIAS.get(name, name)
    if kind in "iu":
        return name
    if kind == "f":
        if name in _FLOAT_OK:
            return name
    elif kind == "c":
        if name in _COMPLEX_OK:
            return name
    raise TypeError(f"reduction {name!r} is not defined for dtype {dt}")


# -- NumPy reference -------------------------------------------------------------
def reference_reduce_into(dst, src, op="sum"):
    """The oracle: ``dst = dst OP src`` with NumPy ufuncs (float16 computed in float32)."""
    name = check_op_dtype(op, dst.dtype)
    ufunc = UFUNCS[name]
    if dst.dtype == BFLOAT16:
        return _bf16_reference(dst, src, name)
    if dst.dtype == _F16 and name in ("sum", "prod"):
        acc = dst.astype(np.float32)
        ufunc(acc, src, out=acc)
        dst[...] = acc
    else:
        ufunc(dst, src, out=dst, casting="unsafe")
    return dst


def _bf16_reference(dst, src, name):
    a, b = widen(dst), widen(src)
    if name in ("min", "max"):      # one operand's bits, chosen as np.minimum/maximum would
        left = (a < b if name == "min" else a > b) | (a != a)
        d = dst.view(np.uint16).reshape(-1)
        d[...] = np.where(left, d, src.view(np.uint16).reshape(-1))
        return dst
    narrow_into(dst, UFUNCS[name](a, b, dtype=np.float32))
    return dst


def _bf16_reduce_into(dst, src, name):
    from commrt.kernels._combine import combine_into

    if src.dtype != BFLOAT16:
        raise TypeError(f"reduce_into: dst is bfloat16, src is {src.dtype}")
    if src.size != dst.size:
        raise ValueError(f"reduce_into: dst has {dst.size} elements, src has {src.size}")
    if name in ("land", "lor") or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        return _bf16_reference(dst, src, name)
    combine_into(dst.reshape(-1), src.reshape(-1), name)
    return dst


# -- CPU dispatch ------------------------------------------------------------------
# Two tables:
#   _FAST[op as spelled by the caller][dtype]: (serial entry point, kernel for
#          large arrays, its threshold in elements, parallel kernel) for
#          dtypes with Numba kernels; the hot path of reduce_into (two dict
#          lookups, no tuple).  Large arrays go to several threads when
#          COMMRT_KERNEL_PARALLEL_BYTES asks, else (sum, prod) to NumPy's loop.
#   _SLOW[(op, dtype)]: (canonical op, ufunc) for everything, off the hot path.
_FAST = {}
_SLOW = {}
_par_min = None      # bytes from which the parallel kernels run


def _parallel_min_bytes():
    global _par_min
    if _par_min is None:
        from commrt import config
        from commrt.kernels._jit import numba

        threads = numba.config.NUMBA_NUM_THREADS
        limit = config.get("COMMRT_KERNEL_PARALLEL_BYTES")
        _par_min = limit if threads > 1 and limit > 0 else _NEVER
    return _par_min


def _has_numba_kernel(dtype):
    # Complex too: NumPy's complex product rounds differently from loop to loop
    # (SIMD with FMA or not, by alignment), so a*b and b*a on two ranks could
    # differ in the last bit; Numba's one loop is commutative bit for bit.
    return dtype != _F16 and dtype.kind in "biufc" and dtype.isnative


def _slow_plan(op, dtype):
    plan = _SLOW.get((op, dtype))
    if plan is None:
        name = check_op_dtype(op, dtype)
        plan = _SLOW[(op, dtype)] = (name, UFUNCS[name])
        if _has_numba_kernel(dtype):
            from commrt.kernels import reduce_numba as nb

            par_min = _parallel_min_bytes()
            if par_min < _NEVER:
                large, start = nb.PARALLEL[name], par_min
            elif name in _NUMPY_LARGE:
                # Past the caches NumPy's SIMD loop for add/multiply streams as fast or
                # faster than Numba's (measured 0.92-1.4x); both release the GIL.
                large, start = _numpy_in_place(UFUNCS[name]), _NUMPY_LARGE_BYTES
            else:
                large, start = nb.SERIAL[name], _NEVER
            _FAST.setdefault(op, {})[dtype] = (nb.entry_point(nb.SERIAL[name], dtype), large,
                                               max(1, start // dtype.itemsize),
                                               nb.PARALLEL[name])
    return plan


_NEVER = 1 << 62
_NUMPY_LARGE = frozenset(("sum", "prod"))
_NUMPY_LARGE_BYTES = 8 << 20


def _numpy_in_place(ufunc):
    def large(dst, src):
        if src.size != dst.size:
            raise ValueError("reduce_into: dst and src differ in size")
        ufunc(dst, src, out=dst)
    return large


def _cpu_reduce_into(dst, src, op, parallel):
    """Every case the fast path in reduce_into declines: first use of an (op,
    dtype), float16, mixed dtypes, n-D or strided arrays, subclasses."""
    name, ufunc = _slow_plan(op, dst.dtype)
    if not isinstance(src, _ndarray):
        raise TypeError(f"reduce_into: dst is a numpy array, src is {type(src).__name__}")
    if dst.dtype == BFLOAT16:
        return _bf16_reduce_into(dst, src, name)
    if src.size != dst.size:
        raise ValueError(f"reduce_into: dst has {dst.size} elements, src has {src.size}")
    if dst.dtype == _F16 and src.dtype == _F16 and name in _F16_C_OPS \
            and dst.flags.c_contiguous and src.flags.c_contiguous and _f16_loops():
        # the C loops (combine.h): NumPy's float16 results, F16C's speed (~70x)
        from commrt.kernels._combine import combine_into

        combine_into(dst.reshape(-1), src.reshape(-1), name)
        return dst
    fast = _FAST.get(op, {}).get(dst.dtype)
    if fast is None or src.dtype != dst.dtype:
        # NumPy's loops; float16 sum/prod compute each element in float32 and round once.
        ufunc(dst, src, out=dst, casting="unsafe")
        return dst
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        d, s = dst.reshape(-1), src.reshape(-1)
        if parallel:
            fast[3](d, s)
        elif parallel is None and d.size >= fast[2]:
            fast[1](d, s)
        else:
            fast[0](d, s)
        return dst
    ufunc(dst, src, out=dst, casting="unsafe")
    return dst


# -- public API --------------------------------------------------------------------
def _device_module(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        from commrt.kernels import reduce_cupy

        return reduce_cupy
    if mod.startswith("numba"):
        from commrt.kernels import reduce_cuda

        return reduce_cuda
    raise TypeError(f"reduce kernels take numpy, cupy or numba device arrays, not {type(a).__name__}")


def reduce_into(dst, src, op="sum", *, parallel=None):
    """``dst = dst OP src`` element-wise, in place; returns ``dst``.

    ``parallel``: None picks by size (``COMMRT_KERNEL_PARALLEL_BYTES``); False
    forces the serial loop (a collective whose ranks already fill the cores);
    True forces the parallel kernels (Numba's thread count of threads).
    """
    if type(dst) is _ndarray:
        table = _FAST.get(op)
        fast = table.get(dst.dtype) if table is not None else None
        if fast is not None:
            try:
                if dst.ndim == 1 == src.ndim and dst.flags.c_contiguous and src.flags.c_contiguous:
                    if parallel is None:
                        (fast[0] if dst.size < fast[2] else fast[1])(dst, src)
                    elif parallel:
                        fast[3](dst, src)
                    else:
                        fast[0](dst, src)  # checks dtype (TypeError) and size (ValueError)
                    return dst
            except (TypeError, AttributeError):  # src of another dtype or not an array
                pass
        return _cpu_reduce_into(dst, src, op, parallel)
    if isinstance(dst, _ndarray):  # subclasses
        _cpu_reduce_into(dst.view(_ndarray), np.asarray(src), op, parallel)
        return dst
    mod = _device_module(dst)
    mod.reduce_into(dst, src, check_op_dtype(op, dst.dtype))
    return dst


_BLOCK_BYTES = 128 << 10  # per-source block of reduce_into_many: dst block stays in L2


def reduce_into_many(dst, srcs, op="sum", *, parallel=None):
    """``dst = dst OP srcs[0] OP srcs[1] ...``, in place; returns ``dst``.

    Works block by block so each block of ``dst`` is read and written once
    however many sources there are.  Float16 sum and prod keep a float32
    accumulator across all the sources and round once at the end.
    """
    srcs = list(srcs)
    if not srcs:
        return dst
    for s in srcs:
        if s.size != dst.size:
            raise ValueError(f"reduce_into_many: dst has {dst.size} elements, a source has {s.size}")
    if type(dst) is not _ndarray and not isinstance(dst, _ndarray):
        mod = _device_module(dst)
        name = check_op_dtype(op, dst.dtype)
        if dst.dtype == _F16 and name in ("sum", "prod"):
            acc, tmp = mod.empty(dst.size, np.float32), mod.empty(dst.size, np.float32)
            mod.cast_into(acc, dst)
            for s in srcs:
                mod.cast_into(tmp, s)
                mod.reduce_into(acc, tmp, name)
            mod.cast_into(dst, acc)
        else:
            for s in srcs:
                mod.reduce_into(dst, s, name)
        return dst
    name = check_op_dtype(op, dst.dtype)
    d = dst.reshape(-1)
    ss = [s.reshape(-1) for s in srcs]
    n = d.size
    if d.dtype in (_F16, BFLOAT16) and name in ("sum", "prod"):
        ufunc = UFUNCS[name]
        step = _BLOCK_BYTES // 4
        acc = np.empty(min(step, n), np.float32)
        tmp = np.empty(min(step, n), np.float32)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            a = acc[: hi - lo]
            _to_f32(a, d[lo:hi], tmp)
            for s in ss:
                ufunc(a, _to_f32(tmp[: hi - lo], s[lo:hi]), out=a)
            if d.dtype == BFLOAT16:
                narrow_into(d[lo:hi], a)
            else:
                d[lo:hi] = a
        return dst
    step = max(1, _BLOCK_BYTES // d.itemsize)
    if n <= step or (parallel is not False and d.nbytes >= _parallel_min_bytes()):
        for s in ss:
            reduce_into(d, s, name, parallel=parallel)
        return dst
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        blk = d[lo:hi]
        for s in ss:
            reduce_into(blk, s[lo:hi], name, parallel=False)
    return dst


_F16_C_OPS = frozenset(("sum", "prod", "min", "max"))
_HAVE_F16 = []


def _f16_loops():
    """Whether the C combine module has float16 loops (see combine.h)."""
    if not _HAVE_F16:
        from commrt.kernels._combine import HAVE_FLOAT16

        _HAVE_F16.append(HAVE_FLOAT16)
    return _HAVE_F16[0]


def _to_f32(out, x, _=None):
    """out (float32) = x (float16 or bfloat16); returns out."""
    if x.dtype == BFLOAT16:
        widen(x, out)
    else:
        out[...] = x
    return out


def scale_into(buf, n):
    """Finish an average: ``buf /= n`` in place (floor division for integers)."""
    if buf.dtype == BFLOAT16:
        if n != 1:
            narrow_into(buf, widen(buf) / np.float32(n))
        return buf
    kind = np.dtype(buf.dtype).kind
    if kind == "b":
        raise TypeError("avg is not defined for bool")
    if kind not in "iufc":
        raise TypeError(f"avg is not defined for dtype {buf.dtype}")
    if n == 1:
        return buf
    if isinstance(buf, _ndarray):
        if buf.dtype == _F16 and buf.flags.c_contiguous and _f16_loops():
            from commrt.kernels._combine import f16_scale

            f16_scale(buf, n, True)        # NumPy's float16 division, ~60x faster
        elif kind in "iu":
            np.floor_divide(buf, n, out=buf)
        else:
            np.true_divide(buf, n, out=buf)
        return buf
    _device_module(buf).scale_into(buf, n)
    return buf


def cast_into(dst, src):
    """Copy ``src`` into ``dst`` converting the dtype (e.g. a float32 accumulator to float16)."""
    if dst.size != src.size:
        raise ValueError(f"cast_into: dst has {dst.size} elements, src has {src.size}")
    if isinstance(dst, _ndarray):
        s = np.asarray(src).reshape(-1)
        if s.dtype == BFLOAT16:
            s = widen(s)
        if dst.dtype == BFLOAT16:
            narrow_into(dst, s.astype(np.float32, copy=False))
        else:
            np.copyto(dst.reshape(-1), s, casting="unsafe")
        return dst
    _device_module(dst).cast_into(dst, src)
    return dst


def binary_ufunc(op, dtype):
    """The NumPy ufunc ``f`` with ``f(a, b, out=dst)`` == ``dst = a OP b`` for ``dtype``
    with the same result as ``reduce_into``, or None where that takes more than one
    plain ufunc call (bool aliases, logical ops, complex, bitwise ops on floats).

    For tiny buffers one ufunc call is the cheapest reduction there is; the
    collectives' small-message path uses it, with either operand first.  (NumPy
    computes float16 in float32 and rounds once, as ``reduce_into`` does.)"""
    name = canonical_op(op)
    kind = np.dtype(dtype).kind
    if kind in "iu" and name not in ("land", "lor"):
        return UFUNCS[name]
    if kind == "f" and name in ("sum", "prod", "min", "max"):
        return UFUNCS[name]
    return None
