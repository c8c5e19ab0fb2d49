"""Numba CPU reduction kernels: ``dst[i] = dst[i] OP src[i]`` over 1-D arrays.

One small typed loop per operation, written out (not generated) so that
``cache=True`` can store every specialisation next to this file.  All release
the GIL (``nogil=True``): a collective reduces one segment while the transport,
in another thread, moves the next.  The ``_par`` twins split the loop over
Numba's thread count of threads (``run_tasks``); they pay only past the
last-level cache and only when the other cores are idle (measured on 2
cores: a parallel launch costs 65-100 µs, so below ~16 MiB the serial loop
wins, and with the other core busy they lose at every size; see ``python -m
commrt.bench kernels``).  So they run only when asked (``parallel=True``, or
COMMRT_KERNEL_PARALLEL_BYTES).  As ``prange`` loops (until 2026-12-06) they
launched in ~100 µs and ran float32 sums of 16 and 64 MiB as fast (679-795
and 3979-4424 µs, against 749-757 and 3987-4306 on threads, alternated).

Semantics follow NumPy's ufuncs, so the NumPy reference in ``reduce.py`` is the
oracle: integers wrap, MIN/MAX propagate NaN, logical ops give 0/1 in the
array's own dtype.  Float16 is absent: Numba's CPU target has no half type, and
NumPy's own float16 loops already compute each element in float32.
"""
from commrt.kernels._jit import njit, numba, run_tasks


# -- serial --------------------------------------------------------------------
@njit(nogil=True, cache=True)
def sum_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] += src[i]


@njit(nogil=True, cache=True)
def prod_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] *= src[i]


@njit(nogil=True, cache=True)
def min_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        x = dst[i]
        # np.minimum's rule: a NaN on the left wins, else the smaller, and a tie
        # (0.0 and -0.0) gives the right operand -- as the C combine loops do
        if not (x < src[i] or x != x):
            dst[i] = src[i]


@njit(nogil=True, cache=True)
def max_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        x = dst[i]
        if not (x > src[i] or x != x):   # np.maximum's rule (see min_)
            dst[i] = src[i]


@njit(nogil=True, cache=True)
def land_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] = (dst[i] != 0) & (src[i] != 0)


@njit(nogil=True, cache=True)
def lor_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] = (dst[i] != 0) | (src[i] != 0)


@njit(nogil=True, cache=True)
def band_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] &= src[i]


@njit(nogil=True, cache=True)
def bor_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] |= src[i]


@njit(nogil=True, cache=True)
def bxor_(dst, src):
    if src.size != dst.size:
        raise ValueError("reduce_into: dst and src differ in size")
    for i in range(dst.size):
        dst[i] ^= src[i]


# -- parallel (large arrays only) ------------------------------------------------
def _split(serial, name):
    """The parallel twin of a serial kernel: the arrays cut into one contiguous
    share per thread, each share the serial loop's, on ``run_tasks``' threads
    (no ``prange`` loop: its nine twins compiled for 27 s on a cold cache, the
    serial loops they share for 9)."""
    def par(dst, src):
        if src.size != dst.size:
            raise ValueError("reduce_into: dst and src differ in size")
        n = dst.size
        parts = max(1, min(numba.get_num_threads(), n))

        def share(i):
            lo, hi = n * i // parts, n * (i + 1) // parts
            serial(dst[lo:hi], src[lo:hi])
        run_tasks(share, parts)
    par.__name__ = par.__qualname__ = name
    return par


sum_par = _split(sum_, "sum_par")
prod_par = _split(prod_, "prod_par")
min_par = _split(min_, "min_par")
max_par = _split(max_, "max_par")
land_par = _split(land_, "land_par")
lor_par = _split(lor_, "lor_par")
band_par = _split(band_, "band_par")
bor_par = _split(bor_, "bor_par")
bxor_par = _split(bxor_, "bxor_par")


def entry_point(kernel, dtype):
    """The compiled function of ``kernel`` for 1-D C-contiguous ``dtype`` arrays.

    Calling it skips the dispatcher's type resolution (~70 ns, a fifth of a
    4 KiB reduction).  It checks the dtype (TypeError) and the sizes
    (ValueError) but not the layout: the caller passes 1-D contiguous arrays.
    """
    import numba

    arr = numba.from_dtype(dtype)[::1]
    sig = (arr, arr)
    kernel.compile(sig)
    return kernel.overloads[sig].entry_point


SERIAL = {"sum": sum_, "prod": prod_, "min": min_, "max": max_, "land": land_,
          "lor": lor_, "band": band_, "bor": bor_, "bxor": bxor_}
PARALLEL = {"sum": sum_par, "prod": prod_par, "min": min_par, "max": max_par,
            "land": land_par, "lor": lor_par, "band": band_par, "bor": bor_par,
            "bxor": bxor_par}
