"""im2col / col2im on the CPU with Numba, parallel over rows (im2col) and
over image planes (col2im) so that no two threads write the same element.
Same layout and geometry as the NumPy reference in ``im2col.py``."""
import numpy as np

from commrt.kernels._jit import njit, prange
from commrt.kernels.im2col import check_col, geometry


@njit(parallel=True, cache=True, nogil=True)
def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, col):
    N, C, H, W = x.shape
    for r in prange(C * kh * kw):
        c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
        for n in range(N):
            for ho in range(Ho):
                h = ho * sh - ph + i * dh
                base = (n * Ho + ho) * Wo
                if h < 0 or h >= H:
                    for wo in range(Wo):
                        col[r, base + wo] = 0
                    continue
                for wo in range(Wo):
                    w = wo * sw - pw + j * dw
                    col[r, base + wo] = x[n, c, h, w] if 0 <= w < W else 0


@njit(parallel=True, cache=True, nogil=True)
def _col2im(col, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out):
    N, C, H, W = out.shape
    for p in prange(N * C):
        n, c = p // C, p % C
        out[n, c] = 0
        for i in range(kh):
            for j in range(kw):
                r = (c * kh + i) * kw + j
                for ho in range(Ho):
                    h = ho * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    base = (n * Ho + ho) * Wo
                    for wo in range(Wo):
                        w = wo * sw - pw + j * dw
                        if 0 <= w < W:
                            out[n, c, h, w] += col[r, base + wo]


def im2col(x, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x.shape, kernel_size, stride, padding, dilation)
    N, C = x.shape[:2]
    col = np.empty((C * kh * kw, N * Ho * Wo), dtype=x.dtype)
    if col.size:
        _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, col)
    return col


def col2im(col, x_shape, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x_shape, kernel_size, stride, padding, dilation)
    check_col(col, x_shape, kh, kw, Ho, Wo)
    out = np.empty(x_shape, dtype=col.dtype)
    if out.size:
        _col2im(np.ascontiguousarray(col), kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out)
    return out
