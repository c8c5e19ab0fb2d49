"""im2col / col2im NumPy reference, and the geometry every twin shares.

See ``im2col.py`` for the layout.  Stride tricks build the column matrix in
one copy; the only Python loop runs over the kh*kw kernel taps, never over
pixels.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided


def _pair(v, what):
    v = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(v) != 2:
        raise ValueError(f"im2col: {what} must be an int or a pair, got {v}")
    return int(v[0]), int(v[1])


def conv_output_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def geometry(x_shape, kernel_size, stride=1, padding=0, dilation=1):
    """Validated ((kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo))."""
    if len(x_shape) != 4:
        raise ValueError(f"im2col: expected an (N, C, H, W) input, got shape {tuple(x_shape)}")
    k, s = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
    p, d = _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ValueError(f"im2col: kernel {k}, stride {s}, dilation {d} must be >= 1 "
                         f"and padding {p} >= 0")
    H, W = x_shape[2:]
    out = (conv_output_size(H, k[0], s[0], p[0], d[0]), conv_output_size(W, k[1], s[1], p[1], d[1]))
    if min(out) < 1:
        raise ValueError(f"im2col: a {k[0]}x{k[1]} kernel (dilation {d}, padding {p}) does not fit "
                         f"an input of shape {tuple(x_shape)}")
    return k, s, p, d, out


# ---- NumPy reference -----------------------------------------------------------------

def im2col_numpy(x, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x.shape, kernel_size, stride, padding, dilation)
    N, C = x.shape[:2]
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    sN, sC, sH, sW = x.strides
    windows = as_strided(x, (C, kh, kw, N, Ho, Wo), (sC, sH * dh, sW * dw, sN, sH * sh, sW * sw),
                         writeable=False)
    return np.ascontiguousarray(windows).reshape(C * kh * kw, N * Ho * Wo)


def check_col(col, x_shape, kh, kw, Ho, Wo):
    expected = (x_shape[1] * kh * kw, x_shape[0] * Ho * Wo)
    if tuple(col.shape) != expected:
        raise ValueError(f"col2im: column matrix {tuple(col.shape)} does not match {expected} "
                         f"for an input of shape {tuple(x_shape)}")


def col2im_numpy(col, x_shape, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x_shape, kernel_size, stride, padding, dilation)
    check_col(col, x_shape, kh, kw, Ho, Wo)
    N, C, H, W = x_shape
    taps = col.reshape(C, kh, kw, N, Ho, Wo)
    out = np.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=col.dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (Ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (Wo - 1) + 1, sw)
            out[:, :, rows, cols] += taps[:, i, j].transpose(1, 0, 2, 3)
    if ph or pw:
        out = np.ascontiguousarray(out[:, :, ph:ph + H, pw:pw + W])
    return out
