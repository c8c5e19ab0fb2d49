"""Convolution by im2col + GEMM a chunk of images at a time, forward and
backward, on the CPU and one thread: any kernel size, stride, padding and
dilation.

The whole-batch lowering (``conv.im2col``, then one product) writes a
column matrix kh*kw times the size of the input and reads it back: 5 MB for
LeNet's first layer at batch 64, kept until backward reads it once more for
the weight gradient, and as much again for the input gradient's columns.
That traffic goes through the shared L3 and memory, where two processes on
the two cores of a small machine get in each other's way.  Here the same
arithmetic runs on ``per`` images at a time, so that their columns and
products (``per * Ho*Wo * (C*kh*kw + 1 + Cout)`` numbers, at most
``COMMRT_CONV_CHUNK_BYTES``) stay in the core's L2 cache:

    forward, per chunk:   col = im2col(x[n0:n1]) with a row of ones    (R+1, T)
                          y[:, n0:n1] = [W | b] @ col                  (K, T)
    backward, per chunk:  dM = gy[:, n0:n1]                            (K, T)
                          [dW | db] += dM @ im2col(x[n0:n1]).T          (columns recomputed
                                                                        from x: cheaper than
                                                                        keeping them)
                          dx[n0:n1] = col2im(W.T @ dM)

with R = C*kh*kw, T = (n1-n0)*Ho*Wo, and y and gy (K, N*Ho*Wo): the output
is in CNHW memory order like the whole-batch path's, so the layers above
keep that order and backward reads gy's chunks as slices without a copy.
The row of ones folds the bias into the product, and its gradient into the
weight gradient's product.  Forward keeps nothing but the input.

The column kernels (Numba) first copy the chunk into a padded scratch
image, so that every column row is a run of plain copies with no bounds
logic (LeNet's layers: 0.22 and 0.36 ms for the batch, against 0.28 and
0.33 ms for NumPy's whole-batch stride tricks and several times that for the
whole-batch Numba loop with its per-pixel bounds); col2im adds into a padded
scratch and copies its inside out.  The products are NumPy's (``matmul``
into ``out``: a column slice of a C-contiguous matrix goes to BLAS as is);
the SciPy BLAS that Numba's ``np.dot`` calls measured up to 2x slower at
these shapes, so the chunk loop is Python's (a few calls per chunk).
"""
import numpy as np

from commrt import config
from commrt.kernels._jit import njit
from commrt.kernels.im2col_numpy import geometry


@njit(cache=True, nogil=True)
def _im2col_chunk(x, n0, n1, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, xp, col):
    """col[r, (n-n0)*Ho*Wo + ho*Wo + wo] for images n0..n1-1 (rows r < C*kh*kw
    only; any further rows of col are left alone).  xp: (per, C, Hp, Wp)
    scratch whose border (the padding) is zero and stays zero."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    for n in range(n0, n1):
        for c in range(C):
            for h in range(H):
                s = x[n, c, h]
                d = xp[n - n0, c, h + ph, pw:]
                for w in range(W):
                    d[w] = s[w]
    P = Ho * Wo
    for r in range(C * kh * kw):
        c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
        row = col[r]
        for m in range(n1 - n0):
            plane = xp[m, c]
            for ho in range(Ho):
                src = plane[ho * sh + i * dh, j * dw:]
                dst = row[m * P + ho * Wo:m * P + ho * Wo + Wo]
                if sw == 1:
                    for wo in range(Wo):
                        dst[wo] = src[wo]
                else:
                    for wo in range(Wo):
                        dst[wo] = src[wo * sw]


@njit(cache=True, nogil=True)
def _col2im_chunk(col, n0, n1, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, xp, dx):
    """dx[n0:n1] = col2im of the chunk's columns (rows r < C*kh*kw of col,
    laid out as ``_im2col_chunk`` writes them); xp: (per, C, Hp, Wp) scratch."""
    C, H, W = dx.shape[1], dx.shape[2], dx.shape[3]
    xp[:n1 - n0] = 0
    P = Ho * Wo
    for r in range(C * kh * kw):
        c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
        row = col[r]
        for m in range(n1 - n0):
            plane = xp[m, c]
            for ho in range(Ho):
                dst = plane[ho * sh + i * dh, j * dw:]
                src = row[m * P + ho * Wo:m * P + ho * Wo + Wo]
                if sw == 1:
                    for wo in range(Wo):
                        dst[wo] += src[wo]
                else:
                    for wo in range(Wo):
                        dst[wo * sw] += src[wo]
    for n in range(n0, n1):
        for c in range(C):
            for h in range(H):
                s = xp[n - n0, c, h + ph, pw:]
                d = dx[n, c, h]
                for w in range(W):
                    d[w] = s[w]


# ---- col2im for unit stride and dilation, on "wide" rows --------------------------------
#
# With stride 1 and dilation 1, lay the chunk's output gradient out with rows
# as wide as the padded input (Wp = W + 2*pw instead of Wo; the extra
# columns zero): then kernel tap (i, j) of image m adds column row r = (c,
# i, j) into the padded image plane (m, c) as ONE contiguous run of Ho*Wp
# numbers starting at i*Wp + j, instead of Ho runs of Wo (LeNet's second
# layer: 10 numbers each, where loop overhead, not arithmetic, set the
# time).  The extra columns' products are exact zeros for finite weights,
# and land on the padding or on the next row's start, so adding them
# changes nothing; the scratch has kw numbers of slack past its end.


@njit(cache=True, nogil=True)
def _widen(gy2, c0, count, Ho, Wo, Wp, out):
    """out[k, m*Ho*Wp + ho*Wp + wo] = gy2[k, c0 + m*Ho*Wo + ho*Wo + wo] for
    m < count (the columns wo >= Wo of out are left alone: zero)."""
    K = gy2.shape[0]
    for k in range(K):
        src_row, dst_row = gy2[k], out[k]
        for m in range(count):
            for ho in range(Ho):
                s = src_row[c0 + (m * Ho + ho) * Wo:]
                d = dst_row[(m * Ho + ho) * Wp:]
                for wo in range(Wo):
                    d[wo] = s[wo]


@njit(cache=True, nogil=True)
def _col2im_wide(col, n0, n1, kh, kw, ph, pw, Ho, Hp, Wp, flat, dx):
    """dx[n0:n1] = col2im of wide column rows (stride 1, dilation 1); flat:
    scratch of at least (n1-n0)*C*Hp*Wp + kw numbers."""
    C, H, W = dx.shape[1], dx.shape[2], dx.shape[3]
    L = Ho * Wp
    plane = Hp * Wp
    flat[:(n1 - n0) * C * plane + kw] = 0
    for m in range(n1 - n0):
        for r in range(C * kh * kw):
            c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
            dst = flat[(m * C + c) * plane + i * Wp + j:]
            src = col[r, m * L:(m + 1) * L]
            for t in range(L):
                dst[t] += src[t]
    for n in range(n0, n1):
        for c in range(C):
            for h in range(H):
                s = flat[((n - n0) * C + c) * plane + (h + ph) * Wp + pw:]
                d = dx[n, c, h]
                for w in range(W):
                    d[w] = s[w]


PER = None          # images per chunk, for tests; None: ``per_chunk`` chooses


def per_chunk(N, R, K, P, itemsize):
    """Images per chunk: as many as keep a chunk's columns and products within
    COMMRT_CONV_CHUNK_BYTES, at least one, at most N."""
    if PER is not None:
        return max(1, min(PER, N))
    per = config.get("COMMRT_CONV_CHUNK_BYTES") // max(1, (R + 1 + K) * P * itemsize)
    return int(max(1, min(per, N)))


class _Geometry:
    """Shapes, chunking and scratch of one convolution."""

    def __init__(self, x_shape, w_shape, dtype, stride, padding, dilation):
        (self.kh, self.kw), (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw), \
            (self.Ho, self.Wo) = geometry(x_shape, w_shape[2:], stride, padding, dilation)
        self.N, self.C, H, W = x_shape
        self.K = w_shape[0]
        self.R = self.C * self.kh * self.kw
        self.P = self.Ho * self.Wo
        self.per = per_chunk(self.N, self.R, self.K, self.P, np.dtype(dtype).itemsize)
        self.dtype = dtype
        self.padded = (self.per, self.C, H + 2 * self.ph, W + 2 * self.pw)

    def args(self):
        return (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw, self.dh, self.dw,
                self.Ho, self.Wo)

    def chunks(self):
        for n0 in range(0, self.N, self.per):
            n1 = min(self.N, n0 + self.per)
            yield n0, n1, slice(n0 * self.P, n1 * self.P), (n1 - n0) * self.P

    def columns(self):
        """(R+1, per*Ho*Wo) column scratch whose last row is ones."""
        col = np.empty((self.R + 1, self.per * self.P), self.dtype)
        col[self.R] = 1
        return col


def conv2d(x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """y = conv2d(x, w) + bias for x (N, C, H, W) in any memory order and w
    (K, C, kh, kw): an (N, K, Ho, Wo) view of a CNHW-contiguous array."""
    g = _Geometry(x.shape, w.shape, x.dtype, stride, padding, dilation)
    y = np.empty((g.K, g.N * g.P), x.dtype)
    wb = np.empty((g.K, g.R + 1), x.dtype)
    wb[:, :g.R] = w.reshape(g.K, g.R)
    wb[:, g.R] = 0 if bias is None else bias
    if y.size:
        col, xp = g.columns(), np.zeros(g.padded, x.dtype)
        for n0, n1, cols, T in g.chunks():
            _im2col_chunk(x, n0, n1, *g.args(), xp, col)
            np.matmul(wb, col[:, :T], out=y[:, cols])
    return y.reshape(g.K, g.N, g.Ho, g.Wo).transpose(1, 0, 2, 3)


def conv2d_backward(gy, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                    need_x=True, need_w=True):
    """(dx, dw, db) of ``conv2d`` for the output gradient gy (N, K, Ho, Wo) in
    any memory order (CNHW-contiguous is read without a copy); dx
    (NCHW-contiguous) or dw is None where not needed.  ``x`` is the forward's
    input."""
    g = _Geometry(x.shape, w.shape, gy.dtype, stride, padding, dilation)
    if tuple(gy.shape) != (g.N, g.K, g.Ho, g.Wo):
        raise ValueError(f"conv2d_backward: gradient {tuple(gy.shape)} does not match the "
                         f"output {(g.N, g.K, g.Ho, g.Wo)}")
    gy2 = gy.transpose(1, 0, 2, 3).reshape(g.K, -1)       # free when gy is CNHW-contiguous
    dx = np.empty(x.shape, gy.dtype) if need_x else None
    if gy.size == 0:
        if need_x:
            dx[...] = 0
        dw = np.zeros(w.shape, gy.dtype) if need_w else None
        return dx, dw, np.zeros(g.K, gy.dtype)
    w2 = w.reshape(g.K, g.R)
    wide = need_x and (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1)
    if need_w:
        xp = np.zeros(g.padded, gy.dtype)                # im2col's: its border stays zero
        dwb = np.zeros((g.K, g.R + 1), gy.dtype)
        part = np.empty_like(dwb)
    if need_w or (need_x and not wide):
        col = g.columns()
    if need_x and not wide:
        dxp = np.empty(g.padded, gy.dtype)               # col2im's
    if wide:
        Hp, Wp = g.padded[2:]
        dMw = np.zeros((g.K, g.per * g.Ho * Wp), gy.dtype)
        dcolw = np.empty((g.R, g.per * g.Ho * Wp), gy.dtype)
        flat = np.empty(g.per * g.C * Hp * Wp + g.kw, gy.dtype)
    for n0, n1, cols, T in g.chunks():
        dM = gy2[:, cols]
        if need_w:
            _im2col_chunk(x, n0, n1, *g.args(), xp, col)
            np.matmul(dM, col[:, :T].T, out=part)
            dwb += part
        if wide:
            Tw = (n1 - n0) * g.Ho * Wp
            _widen(gy2, n0 * g.P, n1 - n0, g.Ho, g.Wo, Wp, dMw)
            np.matmul(w2.T, dMw[:, :Tw], out=dcolw[:, :Tw])
            _col2im_wide(dcolw, n0, n1, g.kh, g.kw, g.ph, g.pw, g.Ho, Hp, Wp, flat, dx)
        elif need_x:
            np.matmul(w2.T, dM, out=col[:g.R, :T])
            _col2im_chunk(col, n0, n1, *g.args(), dxp, dx)      # (the row of ones stays)
    if not need_w:
        return dx, None, gy2.sum(axis=1)
    return dx, dwb[:, :g.R].reshape(w.shape), dwb[:, g.R].copy()
