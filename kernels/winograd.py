"""Winograd F(4x4, 3x3): 3x3, stride-1, dilation-1 convolution with 4x fewer
multiplications than im2col, forward and backward, on the CPU with Numba.

The algorithm (Lavin & Gray, "Fast Algorithms for Convolutional Neural
Networks", 2016).  Cut the output into 4x4 tiles; tile ``t`` of image ``n``
reads a 6x6 input tile ``d`` (overlapping its neighbours by 2 pixels).  With
the 6x6 B^T, 6x3 G and 4x6 A^T below, the output tile of channel k is

    A^T [ sum_c (G g_kc G^T) * (B^T d_c B) ] A          (* elementwise, 6x6)

so each of the 36 positions xi of the 6x6 transform is one matrix product
over channels:

    V[xi] = (B^T d B)[xi]      (C, T)    input transform    (T = N * tiles)
    U[xi] = (G g G^T)[xi]      (K, C)    weight transform
    M[xi] = U[xi] @ V[xi]      (K, T)    36 BLAS products, batched
    y     = A^T M A            (N, K, Ho, Wo)

Backward is the adjoint of each step and reuses the forward's V and U:

    dM[xi] = (A dy A^T)[xi]          (K, T)   (and db, the sum of dy, on the way)
    dV[xi] = U[xi]^T @ dM[xi]        (C, T)   -> dx: B dV B^T summed over overlapping tiles
    dU[xi] = dM[xi] @ V[xi]^T        (K, C)   -> dg = G^T dU G

Cost against im2col, per output pixel and pair of channels: 36/16 = 2.25
multiply-adds instead of 9, and the matrices V and M hold 2.25 numbers per
pixel and channel where im2col's column matrix holds 9.  The transforms are
additions and multiplications by constants, linear in N*C*H*W.

Rounding.  The interpolation points are 0, 1, -1, 2, -1/2 (Lavin's are 0,
+-1, +-2): about 3x less float32 error, measured.  In float32 the result is
within about 3e-6 of the largest output (im2col: about 1e-7), in float64
within about 1e-13; F(2x2, 3x3) would be 10x more exact but moves 4 numbers
per pixel and channel, and measured slower here.

Tiles: ``th = ceil(Ho / 4)`` by ``tw = ceil(Wo / 4)`` per image, ``T``
ordered (n, tile row, tile column); input pixels outside the image (the
padding, and beyond it for a last partial tile) read as zero, outputs beyond
(Ho, Wo) are dropped.
"""
import numpy as np

from commrt.kernels._jit import njit, prange

# points 0, 1, -1, 2, -1/2 and infinity
BT = np.array([[1, 3 / 2, -2, -3 / 2, 1, 0], [0, -1, -5 / 2, -1 / 2, 1, 0],
               [0, 1, 1 / 2, -5 / 2, 1, 0], [0, -1 / 2, -1, 1 / 2, 1, 0],
               [0, 2, -1, -2, 1, 0], [0, 1, 3 / 2, -2, -3 / 2, 1]])
G = np.array([[1, 0, 0], [-1 / 3, -1 / 3, -1 / 3], [1 / 3, -1 / 3, 1 / 3],
              [1 / 15, 2 / 15, 4 / 15], [-16 / 15, 8 / 15, -4 / 15], [0, 0, 1]])
AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -1 / 2, 0], [0, 1, 1, 4, 1 / 4, 0],
               [0, 1, -1, 8, -1 / 8, 1]])


def tiles(H, W, padding):
    """(Ho, Wo, th, tw): output size and 4x4 tile grid of a 3x3 stride-1 convolution."""
    ph, pw = padding
    Ho, Wo = H + 2 * ph - 2, W + 2 * pw - 2
    return Ho, Wo, -(-Ho // 4), -(-Wo // 4)


# ---- weight transforms (36*K*C numbers: NumPy) ----------------------------------------

def weight_transform(w):
    """(K, C, 3, 3) -> U (36, K, C) = G g G^T at each of the 36 positions."""
    g = G.astype(w.dtype)
    K, C = w.shape[:2]
    return np.einsum("ri,kcij,sj->rskc", g, w, g, optimize=True).reshape(36, K, C)


def weight_transform_adjoint(dU):
    """(36, K, C) -> (K, C, 3, 3): G^T dU G, the gradient of the weights."""
    g = G.astype(dU.dtype)
    K, C = dU.shape[1:]
    return np.einsum("ri,rskc,sj->kcij", g, dU.reshape(6, 6, K, C), g, optimize=True)


# ---- the Numba kernels -------------------------------------------------------------------
#
# The four 1-D transforms, written out so that zero coefficients cost
# nothing: B^T (6 -> 6), its adjoint B (6 -> 6), A^T (6 -> 4) and A (4 -> 6).
# Each kernel applies them along the rows and then along the columns of every
# tile, in inner loops over the tile columns t that vectorise.
#
# Each kernel runs in parallel over image planes (n, c) or (n, k); a plane owns
# the T-contiguous segment [n*th*tw, (n+1)*th*tw) of each of the 36 rows of V
# or M, so no two threads write the same element.  Inside a plane the columns
# are kept apart by phase (X[j, h, t] is column 4*t + j), so that the inner
# loops run with unit stride; only the copies in and out of a plane touch
# single pixels.  A kernel is a serial function of one plane called from a
# prange loop: compiled inside the parallel loop itself, the same loops ran 2x
# slower.  Indices are unsigned (``_u``): Numba then drops its negative-index
# wrap-around test and LLVM vectorises the inner loops.  Mixing uint64 with
# int64 gives float64, which Numba refuses as an index, so every index below
# is built from ``_u`` values only.

_u = np.uint64


# the coefficients, as an array of the data's dtype (``_consts``) so that float32
# data is never promoted to float64 by a Python float literal
_K = (0.5, 1.5, 2.0, 2.5, 4.0, 8.0, 0.25, 0.125)


@njit(cache=True, inline="always")
def _consts(like):
    k = np.empty(8, like.dtype)
    for i in range(8):
        k[i] = _K[i]
    return k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]


@njit(cache=True, inline="always")
def _bt(k, d0, d1, d2, d3, d4, d5):
    h, h3, two, h5 = k[0], k[1], k[2], k[3]
    return (d0 + h3 * d1 - two * d2 - h3 * d3 + d4,
            -d1 - h5 * d2 - h * d3 + d4,
            d1 + h * d2 - h5 * d3 + d4,
            -h * d1 - d2 + h * d3 + d4,
            two * d1 - d2 - two * d3 + d4,
            d1 + h3 * d2 - two * d3 - h3 * d4 + d5)


@njit(cache=True, inline="always")
def _b(k, o0, o1, o2, o3, o4, o5):
    """The adjoint (transpose) of ``_bt``."""
    h, h3, two, h5 = k[0], k[1], k[2], k[3]
    return (o0,
            h3 * o0 - o1 + o2 - h * o3 + two * o4 + o5,
            -two * o0 - h5 * o1 + h * o2 - o3 - o4 + h3 * o5,
            -h3 * o0 - h * o1 - h5 * o2 + h * o3 - two * o4 - two * o5,
            o0 + o1 + o2 + o3 + o4 - h3 * o5,
            o5)


@njit(cache=True, inline="always")
def _at(k, m0, m1, m2, m3, m4, m5):
    h, two, four, eight, q, e = k[0], k[2], k[4], k[5], k[6], k[7]
    return (m0 + m1 + m2 + m3 + m4,
            m1 - m2 + two * m3 - h * m4,
            m1 + m2 + four * m3 + q * m4,
            m1 - m2 + eight * m3 - e * m4 + m5)


@njit(cache=True, inline="always")
def _a(k, g0, g1, g2, g3):
    """The adjoint (transpose) of ``_at``."""
    h, two, four, eight, q, e = k[0], k[2], k[4], k[5], k[6], k[7]
    return (g0,
            g0 + g1 + g2 + g3,
            g0 - g1 + g2 - g3,
            g0 + two * g1 + four * g2 + eight * g3,
            g0 - h * g1 + q * g2 - e * g3,
            g3)


@njit(cache=True, nogil=True, fastmath=True)
def _input_transform_plane(x, ph, pw, th, tw, V, p):
    N, C, H, W = x.shape
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    Hp, Wh = u4 * th_ + u2, tw_ + u1
    n, c = _u(p // C), _u(p % C)
    cf = _consts(x)
    X = np.zeros((4, Hp, Wh), x.dtype)              # the plane in a zero border, by phase
    line = np.zeros(4 * Wh, x.dtype)                # one padded row
    wn = _u(max(0, min(W, 4 * Wh - pw)))
    for h in range(_u(max(0, min(H, Hp - ph)))):
        hq = h + _u(ph)
        for w in range(wn):
            line[w + _u(pw)] = x[n, c, h, w]
        for t in range(Wh):
            X[u0, hq, t] = line[u4 * t]
            X[u1, hq, t] = line[u4 * t + u1]
            X[u2, hq, t] = line[u4 * t + u2]
            X[u3, hq, t] = line[u4 * t + u3]
    R = np.empty((4, 6, th, Wh), x.dtype)           # B^T along the rows: R[j, r, t1, t]
    for j in range(u4):
        for t1 in range(th_):
            h = u4 * t1
            for t in range(Wh):
                o = _bt(cf, X[j, h, t], X[j, h + u1, t], X[j, h + u2, t], X[j, h + u3, t],
                        X[j, h + u4, t], X[j, h + u5, t])
                R[j, u0, t1, t] = o[0]
                R[j, u1, t1, t] = o[1]
                R[j, u2, t1, t] = o[2]
                R[j, u3, t1, t] = o[3]
                R[j, u4, t1, t] = o[4]
                R[j, u5, t1, t] = o[5]
    for r in range(u6):                             # then B along columns 4t .. 4t+5
        for t1 in range(th_):
            base = n * th_ * tw_ + t1 * tw_
            row = u6 * r
            for t in range(tw_):
                o = _bt(cf, R[u0, r, t1, t], R[u1, r, t1, t], R[u2, r, t1, t], R[u3, r, t1, t],
                        R[u0, r, t1, t + u1], R[u1, r, t1, t + u1])
                V[row, c, base + t] = o[0]
                V[row + u1, c, base + t] = o[1]
                V[row + u2, c, base + t] = o[2]
                V[row + u3, c, base + t] = o[3]
                V[row + u4, c, base + t] = o[4]
                V[row + u5, c, base + t] = o[5]


@njit(parallel=True, cache=True, nogil=True)
def _input_transform(x, ph, pw, th, tw, V):
    N, C = x.shape[:2]
    for p in prange(N * C):
        _input_transform_plane(x, ph, pw, th, tw, V, p)


@njit(cache=True, nogil=True, fastmath=True)
def _input_transform_adjoint_plane(dV, ph, pw, th, tw, dx, p):
    N, C, H, W = dx.shape
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    Hp, Wh = u4 * th_ + u2, tw_ + u1
    n, c = _u(p // C), _u(p % C)
    cf = _consts(dx)
    R = np.empty((4, 6, th, Wh), dx.dtype)          # B along the columns (adjoint)
    for r in range(u6):
        for t1 in range(th_):
            base = n * th_ * tw_ + t1 * tw_
            row = u6 * r
            for t in range(tw_):                    # columns 4t .. 4t+3 of tile t
                d = _b(cf, dV[row, c, base + t], dV[row + u1, c, base + t], dV[row + u2, c, base + t],
                       dV[row + u3, c, base + t], dV[row + u4, c, base + t],
                       dV[row + u5, c, base + t])
                R[u0, r, t1, t] = d[0]
                R[u1, r, t1, t] = d[1]
                R[u2, r, t1, t] = d[2]
                R[u3, r, t1, t] = d[3]
            for j in range(u4):
                R[j, r, t1, tw_] = 0
            for t in range(tw_):                    # columns 4t+4, 4t+5: shared with tile t+1
                d = _b(cf, dV[row, c, base + t], dV[row + u1, c, base + t], dV[row + u2, c, base + t],
                       dV[row + u3, c, base + t], dV[row + u4, c, base + t],
                       dV[row + u5, c, base + t])
                R[u0, r, t1, t + u1] += d[4]
                R[u1, r, t1, t + u1] += d[5]
    X = np.zeros((4, Hp, Wh), dx.dtype)             # B^T along the rows (adjoint)
    for j in range(u4):
        for t1 in range(th_):
            h = u4 * t1
            for t in range(Wh):
                d = _b(cf, R[j, u0, t1, t], R[j, u1, t1, t], R[j, u2, t1, t], R[j, u3, t1, t],
                       R[j, u4, t1, t], R[j, u5, t1, t])
                X[j, h, t] += d[0]
                X[j, h + u1, t] += d[1]
                X[j, h + u2, t] += d[2]
                X[j, h + u3, t] += d[3]
                X[j, h + u4, t] += d[4]
                X[j, h + u5, t] += d[5]
    line = np.zeros(4 * Wh + W + pw, dx.dtype)      # by phase back to pixels; unread ones get 0
    for h in range(_u(H)):
        hq = h + _u(ph)
        if hq < Hp:
            for t in range(Wh):
                line[u4 * t] = X[u0, hq, t]
                line[u4 * t + u1] = X[u1, hq, t]
                line[u4 * t + u2] = X[u2, hq, t]
                line[u4 * t + u3] = X[u3, hq, t]
            for w in range(_u(W)):
                dx[n, c, h, w] = line[w + _u(pw)]
        else:
            for w in range(_u(W)):
                dx[n, c, h, w] = 0


@njit(parallel=True, cache=True, nogil=True)
def _input_transform_adjoint(dV, ph, pw, th, tw, dx):
    N, C = dx.shape[:2]
    for p in prange(N * C):
        _input_transform_adjoint_plane(dV, ph, pw, th, tw, dx, p)


@njit(cache=True, nogil=True, fastmath=True)
def _output_transform_plane(M, b, th, tw, y, p):
    N, K, Ho, Wo = y.shape
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    n, k = _u(p // K), _u(p % K)
    cf = _consts(y)
    bias = b[k]
    Cm = np.empty((4, 6, th, tw), y.dtype)          # A^T along the columns: Cm[j, r, t1, t]
    for r in range(u6):
        for t1 in range(th_):
            base = n * th_ * tw_ + t1 * tw_
            row = u6 * r
            for t in range(tw_):
                o = _at(cf, M[row, k, base + t], M[row + u1, k, base + t], M[row + u2, k, base + t],
                        M[row + u3, k, base + t], M[row + u4, k, base + t],
                        M[row + u5, k, base + t])
                Cm[u0, r, t1, t] = o[0]
                Cm[u1, r, t1, t] = o[1]
                Cm[u2, r, t1, t] = o[2]
                Cm[u3, r, t1, t] = o[3]
    Y = np.empty((4, 4, th, tw), y.dtype)           # then along the rows: pixel (i, j) of each tile
    for j in range(u4):
        for t1 in range(th_):
            for t in range(tw_):
                o = _at(cf, Cm[j, u0, t1, t], Cm[j, u1, t1, t], Cm[j, u2, t1, t], Cm[j, u3, t1, t],
                        Cm[j, u4, t1, t], Cm[j, u5, t1, t])
                Y[u0, j, t1, t] = o[0] + bias
                Y[u1, j, t1, t] = o[1] + bias
                Y[u2, j, t1, t] = o[2] + bias
                Y[u3, j, t1, t] = o[3] + bias
    full = _u(Wo) // u4
    for h in range(_u(Ho)):
        i, t1 = h % u4, h // u4
        for t in range(full):
            y[n, k, h, u4 * t] = Y[i, u0, t1, t]
            y[n, k, h, u4 * t + u1] = Y[i, u1, t1, t]
            y[n, k, h, u4 * t + u2] = Y[i, u2, t1, t]
            y[n, k, h, u4 * t + u3] = Y[i, u3, t1, t]
        for w in range(u4 * full, _u(Wo)):
            y[n, k, h, w] = Y[i, w - u4 * full, t1, full]


@njit(parallel=True, cache=True, nogil=True)
def _output_transform(M, b, th, tw, y):
    N, K = y.shape[:2]
    for p in prange(N * K):
        _output_transform_plane(M, b, th, tw, y, p)


@njit(cache=True, nogil=True, fastmath=True)
def _output_transform_adjoint_plane(gy, th, tw, dM, db, p):
    N, K, Ho, Wo = gy.shape
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    n, k = _u(p // K), _u(p % K)
    cf = _consts(dM)
    Y = np.zeros((4, 4, th, tw), dM.dtype)          # gradient of pixel (i, j) of each tile
    total = cf[0] - cf[0]                          # zero of the data's dtype
    full = _u(Wo) // u4
    for h in range(_u(Ho)):
        i, t1 = h % u4, h // u4
        for t in range(full):
            g0, g1 = gy[n, k, h, u4 * t], gy[n, k, h, u4 * t + u1]
            g2, g3 = gy[n, k, h, u4 * t + u2], gy[n, k, h, u4 * t + u3]
            Y[i, u0, t1, t] = g0
            Y[i, u1, t1, t] = g1
            Y[i, u2, t1, t] = g2
            Y[i, u3, t1, t] = g3
            total += (g0 + g1) + (g2 + g3)
        for w in range(u4 * full, _u(Wo)):
            g = gy[n, k, h, w]
            Y[i, w - u4 * full, t1, full] = g
            total += g
    db[n, k] = total                                # the bias gradient, by plane
    Cm = np.empty((4, 6, th, tw), dM.dtype)         # A along the rows (adjoint)
    for j in range(u4):
        for t1 in range(th_):
            for t in range(tw_):
                o = _a(cf, Y[u0, j, t1, t], Y[u1, j, t1, t], Y[u2, j, t1, t], Y[u3, j, t1, t])
                Cm[j, u0, t1, t] = o[0]
                Cm[j, u1, t1, t] = o[1]
                Cm[j, u2, t1, t] = o[2]
                Cm[j, u3, t1, t] = o[3]
                Cm[j, u4, t1, t] = o[4]
                Cm[j, u5, t1, t] = o[5]
    for r in range(u6):                             # then along the columns
        for t1 in range(th_):
            base = n * th_ * tw_ + t1 * tw_
            row = u6 * r
            for t in range(tw_):
                o = _a(cf, Cm[u0, r, t1, t], Cm[u1, r, t1, t], Cm[u2, r, t1, t], Cm[u3, r, t1, t])
                dM[row, k, base + t] = o[0]
                dM[row + u1, k, base + t] = o[1]
                dM[row + u2, k, base + t] = o[2]
                dM[row + u3, k, base + t] = o[3]
                dM[row + u4, k, base + t] = o[4]
                dM[row + u5, k, base + t] = o[5]


@njit(parallel=True, cache=True, nogil=True)
def _output_transform_adjoint(gy, th, tw, dM, db):
    N, K = gy.shape[:2]
    for p in prange(N * K):
        _output_transform_adjoint_plane(gy, th, tw, dM, db, p)


# ---- the transforms as functions of whole arrays --------------------------------------------

def input_transform(x, padding):
    """(N, C, H, W) -> V (36, C, N*th*tw): B^T d B for every input tile."""
    N, C, H, W = x.shape
    _, _, th, tw = tiles(H, W, padding)
    V = np.empty((36, C, N * th * tw), x.dtype)
    if V.size:
        _input_transform(x, padding[0], padding[1], th, tw, V)
    return V


def input_transform_adjoint(dV, x_shape, padding):
    """(36, C, N*th*tw) -> dx (N, C, H, W): the gradient of ``input_transform``,
    the sum of B dV B^T over the overlapping input tiles."""
    N, C, H, W = x_shape
    _, _, th, tw = tiles(H, W, padding)
    dx = np.empty(x_shape, dV.dtype)
    if dx.size:
        _input_transform_adjoint(dV, padding[0], padding[1], th, tw, dx)
    return dx


def output_transform(M, bias, N, Ho, Wo):
    """(36, K, N*th*tw) -> y (N, K, Ho, Wo) = A^T M A, plus the bias (or None)."""
    K = M.shape[1]
    th, tw = -(-Ho // 4), -(-Wo // 4)
    y = np.empty((N, K, Ho, Wo), M.dtype)
    b = np.zeros(K, M.dtype) if bias is None else np.ascontiguousarray(bias, M.dtype)
    if y.size:
        _output_transform(M, b, th, tw, y)
    return y


def output_transform_adjoint(gy):
    """gy (N, K, Ho, Wo), any memory order -> (dM, db): dM (36, K, N*th*tw) =
    A gy A^T for every output tile, and db (K,) the sum of gy over N, Ho, Wo."""
    N, K, Ho, Wo = gy.shape
    th, tw = -(-Ho // 4), -(-Wo // 4)
    dM = np.empty((36, K, N * th * tw), gy.dtype)
    db = np.zeros((N, K), gy.dtype)
    if dM.size:
        _output_transform_adjoint(gy, th, tw, dM, db)
    return dM, db.sum(axis=0)


# ---- the convolution ----------------------------------------------------------------------

def conv2d(x, w, bias=None, padding=(0, 0)):
    """y = conv2d(x, w) + bias for a 3x3 kernel, stride 1, any padding;
    returns (y, V, U), the transformed input and weights for ``conv2d_backward``."""
    N, C, H, W = x.shape
    Ho, Wo, _, _ = tiles(H, W, padding)
    V = input_transform(x, padding)
    U = weight_transform(w)
    y = output_transform(np.matmul(U, V), bias, N, Ho, Wo)
    return y, V, U


def conv2d_backward(gy, V, U, x_shape, padding, need_x=True, need_w=True):
    """(dx, dw, db) of ``conv2d`` for the output gradient gy; dx or dw is None
    where not needed."""
    dM, db = output_transform_adjoint(gy)
    dx = dw = None
    if need_x:
        dx = input_transform_adjoint(np.matmul(U.transpose(0, 2, 1), dM), x_shape, padding)
    if need_w:
        dw = weight_transform_adjoint(np.matmul(dM, V.transpose(0, 2, 1)))
    return dx, dw, db
