"""im2col / col2im on the CPU with Numba, parallel over rows (im2col) and
over image planes (col2im) so that no two threads write the same element.
Same layout and geometry as the NumPy reference.

The innermost loops run over sub-views from index 0: Numba then knows the
index is never negative, drops its wrap-around check and vectorises (twice
as fast as indexing the whole row with an offset)."""
import numpy as np

from commrt.kernels._jit import njit, prange
from commrt.kernels.im2col_numpy import check_col, geometry


@njit(cache=True, inline="always")
def _valid(n_out, size, stride, offset):
    """Range [lo, hi) of output indices o with 0 <= o*stride + offset < size."""
    lo = 0 if offset >= 0 else (-offset + stride - 1) // stride
    hi = 0 if size - offset <= 0 else min(n_out, (size - 1 - offset) // stride + 1)
    return lo, max(lo, hi)


@njit(cache=True, inline="always")
def _fill(a, lo, hi):
    """Zero a[lo:hi]."""
    v = a[lo:hi]
    for q in range(v.shape[0]):
        v[q] = 0


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, col):
    N, C, H, W = x.shape
    for r in prange(C * kh * kw):
        c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
        h_lo, h_hi = _valid(Ho, H, sh, i * dh - ph)
        w_lo, w_hi = _valid(Wo, W, sw, j * dw - pw)
        offw = j * dw - pw
        cnt = w_hi - w_lo
        row = col[r]
        for n in range(N):
            base = n * Ho * Wo
            _fill(row, base, base + h_lo * Wo)
            for ho in range(h_lo, h_hi):
                out = base + ho * Wo
                _fill(row, out, out + w_lo)
                src = x[n, c, ho * sh - ph + i * dh]
                dv = row[out + w_lo:out + w_hi]
                start = w_lo * sw + offw
                if sw == 1:
                    sv = src[start:start + cnt]
                    for q in range(cnt):
                        dv[q] = sv[q]
                else:
                    sv = src[start:]
                    for q in range(cnt):
                        dv[q] = sv[q * sw]
                _fill(row, out + w_hi, out + Wo)
            _fill(row, base + h_hi * Wo, base + Ho * Wo)


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def _col2im(col, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out):
    N, C, H, W = out.shape
    for p in prange(N * C):
        n, c = p // C, p % C
        plane = out[n, c]
        for h in range(H):
            _fill(plane[h], 0, W)
        for i in range(kh):
            h_lo, h_hi = _valid(Ho, H, sh, i * dh - ph)
            for j in range(kw):
                offw = j * dw - pw
                w_lo, w_hi = _valid(Wo, W, sw, offw)
                cnt = w_hi - w_lo
                row = col[(c * kh + i) * kw + j]
                for ho in range(h_lo, h_hi):
                    base = (n * Ho + ho) * Wo + w_lo
                    s = row[base:base + cnt]
                    d = plane[ho * sh - ph + i * dh]
                    start = w_lo * sw + offw
                    if sw == 1:
                        dv = d[start:start + cnt]
                        for q in range(cnt):
                            dv[q] += s[q]
                    else:
                        dv = d[start:]
                        for q in range(cnt):
                            dv[q * sw] += s[q]


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
