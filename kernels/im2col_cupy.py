"""im2col / col2im for CuPy arrays as ElementwiseKernels (one GPU thread per
output element; col2im gathers, so no atomics).  Same layout as ``im2col.py``."""
import cupy

from commrt.kernels.im2col_numpy import check_col, geometry

_PARAMS = ("int32 C, int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw, "
           "int32 sh, int32 sw, int32 ph, int32 pw, int32 dh, int32 dw")

_im2col_kernel = cupy.ElementwiseKernel(
    "raw T x, int64 M, " + _PARAMS,
    "T col",
    """
    long long r = i / M, m = i % M;
    int c = r / (kh * kw), ki = (r / kw) % kh, kj = r % kw;
    long long n = m / ((long long)Ho * Wo);
    int ho = (m / Wo) % Ho, wo = m % Wo;
    int h = ho * sh - ph + ki * dh, w = wo * sw - pw + kj * dw;
    col = (h >= 0 && h < H && w >= 0 && w < W) ? x[((n * C + c) * H + h) * W + w] : (T)0;
    """,
    "commrt_im2col")

_col2im_kernel = cupy.ElementwiseKernel(
    "raw T col, int64 M, " + _PARAMS,
    "T x",
    """
    int w = i % W, h = (i / W) % H, c = (i / ((long long)W * H)) % C;
    long long n = i / ((long long)W * H * C);
    T acc = 0;
    for (int ki = 0; ki < kh; ++ki) {
        int hn = h + ph - ki * dh;
        if (hn < 0 || hn % sh != 0 || hn / sh >= Ho) continue;
        int ho = hn / sh;
        for (int kj = 0; kj < kw; ++kj) {
            int wn = w + pw - kj * dw;
            if (wn < 0 || wn % sw != 0 || wn / sw >= Wo) continue;
            acc += col[((long long)(c * kh + ki) * kw + kj) * M + (n * Ho + ho) * Wo + wn / sw];
        }
    }
    x = acc;
    """,
    "commrt_col2im")


def im2col(x, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x.shape, kernel_size, stride, padding, dilation)
    N, C, H, W = x.shape
    M = N * Ho * Wo
    col = cupy.empty((C * kh * kw, M), dtype=x.dtype)
    if col.size:
        _im2col_kernel(cupy.ascontiguousarray(x), M, C, H, W, Ho, Wo, kh, kw,
                       sh, sw, ph, pw, dh, dw, col)
    return col


def col2im(col, x_shape, kernel_size, stride=1, padding=0, dilation=1):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = geometry(
        x_shape, kernel_size, stride, padding, dilation)
    check_col(col, x_shape, kh, kw, Ho, Wo)
    N, C, H, W = x_shape
    out = cupy.empty(tuple(x_shape), dtype=col.dtype)
    if out.size:
        _col2im_kernel(cupy.ascontiguousarray(col), N * Ho * Wo, C, H, W, Ho, Wo, kh, kw,
                       sh, sw, ph, pw, dh, dw, out)
    return out
