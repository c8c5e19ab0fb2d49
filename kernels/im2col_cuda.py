"""im2col / col2im as Numba CUDA kernels, one thread per output element.

``col2im`` gathers (each thread owns one image pixel and sums the column
entries that came from it), so it needs no atomics and is deterministic.
Host wrappers accept device arrays (anything with
``__cuda_array_interface__``), returning device arrays, or NumPy arrays,
which make a round trip through the device (this is how the tests run under
``NUMBA_ENABLE_CUDASIM=1``).  Same layout as ``im2col.py``.
"""
import numpy as np
from numba import cuda

from commrt.kernels.im2col_numpy import check_col, geometry

THREADS = 128


@cuda.jit
def _im2col_kernel(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, col):
    idx = cuda.grid(1)
    rows, M = col.shape
    if idx >= rows * M:
        return
    r, m = idx // M, idx % M
    c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
    n, ho, wo = m // (Ho * Wo), (m // Wo) % Ho, m % Wo
    h = ho * sh - ph + i * dh
    w = wo * sw - pw + j * dw
    if 0 <= h < x.shape[2] and 0 <= w < x.shape[3]:
        col[r, m] = x[n, c, h, w]
    else:
        col[r, m] = 0


@cuda.jit
def _col2im_kernel(col, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out):
    idx = cuda.grid(1)
    N, C, H, W = out.shape
    if idx >= N * C * H * W:
        return
    n, c, h, w = idx // (C * H * W), (idx // (H * W)) % C, (idx // W) % H, idx % W
    acc = 0.0
    for i in range(kh):
        hn = h + ph - i * dh                      # = ho * sh when tap i reaches row h
        if hn < 0 or hn % sh != 0 or hn // sh >= Ho:
            continue
        ho = hn // sh
        for j in range(kw):
            wn = w + pw - j * dw
            if wn < 0 or wn % sw != 0 or wn // sw >= Wo:
                continue
            acc += col[(c * kh + i) * kw + j, (n * Ho + ho) * Wo + wn // sw]
    out[n, c, h, w] = acc


def _on_device(a):
    """(device array, whether ``a`` was on the host)."""
    if isinstance(a, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(a)), True
    if hasattr(a, "copy_to_host"):                 # already a numba device array
        return a, False
    return cuda.as_cuda_array(a), False             # e.g. a CuPy or PyTorch GPU array


def _launch(kernel, total, *args):
    if total:
        blocks = (total + THREADS - 1) // THREADS
        kernel[blocks, THREADS](*args)


def im2col(x, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x.shape, kernel_size, stride, padding, dilation)
    d_x, on_host = _on_device(x)
    N, C = x.shape[:2]
    col = cuda.device_array((C * kh * kw, N * Ho * Wo), dtype=d_x.dtype)
    _launch(_im2col_kernel, col.size, d_x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, col)
    return col.copy_to_host() if on_host else col


def col2im(col, x_shape, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x_shape, kernel_size, stride, padding, dilation)
    check_col(col, x_shape, kh, kw, Ho, Wo)
    d_col, on_host = _on_device(col)
    out = cuda.device_array(tuple(x_shape), dtype=d_col.dtype)
    _launch(_col2im_kernel, out.size, d_col, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out)
    return out.copy_to_host() if on_host else out
