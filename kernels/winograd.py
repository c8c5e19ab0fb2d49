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
    M[xi] = U[xi] @ V[xi]      (K, T)    36 BLAS products
    y     = A^T M A            (N, K, Ho, Wo)

Backward is the adjoint of each step; it reuses the forward's U and
recomputes V from x:

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
import scipy.linalg.cython_blas  # noqa: F401  (np.dot in Numba calls BLAS through it)

from commrt.kernels._jit import njit, numba, run_tasks

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
    U = np.einsum("ri,kcij,sj->rskc", g, w, g, optimize=True).reshape(36, K, C)
    return np.ascontiguousarray(U)


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
# Each kernel transforms one image plane (n, c) or (n, k) into, or out of,
# the segment [base, base + th*tw) of each of the 36 rows of V or M, so that
# no two threads that take different planes write the same element.  Inside a
# plane the columns are kept apart by phase (X[j, ., t] is column 4*t + j),
# so that the inner loops run with unit stride, and where the layout allows,
# one inner loop runs over all th*tw tiles of the plane (LLVM vectorises with
# 16 floats, so a loop over the tw tiles of one row, 8 in the benchmark, stays
# scalar); only the copies in and out of a plane touch single pixels.  A
# kernel is a serial function of one plane, called a chunk of images at a
# time (below): compiled inside a parallel loop itself, the same loops ran 2x
# slower.
# Indices are unsigned (``_u``): Numba then drops its negative-index
# wrap-around test and LLVM vectorises the inner loops.  Mixing uint64 with
# int64 gives float64 (loops that then ran 1.5x slower), so every index below
# is built from ``_u`` values only: the plane functions convert their integer
# arguments first.

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
def _input_transform_plane(x, n, c, ph, pw, th, tw, V, base):
    """V[:, c, base:base + th*tw] = B^T d B for every tile d of plane x[n, c]."""
    n, c, base = _u(n), _u(c), _u(base)
    H, W = x.shape[2:]
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    Wh = tw_ + u1
    cf = _consts(x)
    # the plane in a zero border, by phase: padded pixel (4q + i, 4s + j) is X[j, i, q*Wh + s]
    X = np.zeros((4, 4, (th_ + u1) * Wh), x.dtype)
    line = np.zeros(4 * Wh, x.dtype)                # one padded row
    wn = _u(max(0, min(W, 4 * (tw + 1) - pw)))
    for h in range(_u(max(0, min(H, 4 * th + 2 - ph)))):
        hq = h + _u(ph)
        i, z = hq % u4, (hq // u4) * Wh
        for w in range(wn):
            line[w + _u(pw)] = x[n, c, h, w]
        for t in range(Wh):
            X[u0, i, z + t] = line[u4 * t]
            X[u1, i, z + t] = line[u4 * t + u1]
            X[u2, i, z + t] = line[u4 * t + u2]
            X[u3, i, z + t] = line[u4 * t + u3]
    # B^T down the columns, all tiles at once: rows 4t1 .. 4t1+5 are X[j, 0..3, p], X[j, 0..1, p + Wh]
    R = np.empty((4, 6, th_ * Wh), x.dtype)         # R[j, r, t1*Wh + t]
    for j in range(u4):
        for t in range(th_ * Wh):
            o = _bt(cf, X[j, u0, t], X[j, u1, t], X[j, u2, t], X[j, u3, t], X[j, u0, t + Wh],
                    X[j, u1, t + Wh])
            R[j, u0, t] = o[0]
            R[j, u1, t] = o[1]
            R[j, u2, t] = o[2]
            R[j, u3, t] = o[3]
            R[j, u4, t] = o[4]
            R[j, u5, t] = o[5]
    for r in range(u6):                             # then along the rows: columns 4t .. 4t+5
        row = u6 * r
        for t1 in range(th_):
            z, out = t1 * Wh, base + t1 * tw_
            for t in range(tw_):
                o = _bt(cf, R[u0, r, z + t], R[u1, r, z + t], R[u2, r, z + t], R[u3, r, z + t],
                        R[u0, r, z + t + u1], R[u1, r, z + t + u1])
                V[row, c, out + t] = o[0]
                V[row + u1, c, out + t] = o[1]
                V[row + u2, c, out + t] = o[2]
                V[row + u3, c, out + t] = o[3]
                V[row + u4, c, out + t] = o[4]
                V[row + u5, c, out + t] = o[5]


@njit(cache=True, nogil=True, fastmath=True)
def _input_transform_adjoint_plane(dV, n, c, ph, pw, th, tw, dx, base):
    """dx[n, c] = the sum of B dV B^T over the overlapping tiles of the plane."""
    n, c, base = _u(n), _u(c), _u(base)
    H, W = dx.shape[2:]
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    th_, tw_ = _u(th), _u(tw)
    Hp, Wh = u4 * th_ + u2, tw_ + u1
    cf = _consts(dx)
    R = np.empty((4, 6, th_ * Wh), dx.dtype)        # B along the rows (adjoint)
    for r in range(u6):
        row = u6 * r
        for t1 in range(th_):
            z, out = t1 * Wh, base + t1 * tw_
            for t in range(tw_):                    # columns 4t .. 4t+3 of tile t
                d = _b(cf, dV[row, c, out + t], dV[row + u1, c, out + t], dV[row + u2, c, out + t],
                       dV[row + u3, c, out + t], dV[row + u4, c, out + t],
                       dV[row + u5, c, out + t])
                R[u0, r, z + t] = d[0]
                R[u1, r, z + t] = d[1]
                R[u2, r, z + t] = d[2]
                R[u3, r, z + t] = d[3]
            for j in range(u4):
                R[j, r, z + tw_] = 0
            for t in range(tw_):                    # columns 4t+4, 4t+5: shared with tile t+1
                d = _b(cf, dV[row, c, out + t], dV[row + u1, c, out + t], dV[row + u2, c, out + t],
                       dV[row + u3, c, out + t], dV[row + u4, c, out + t],
                       dV[row + u5, c, out + t])
                R[u0, r, z + t + u1] += d[4]
                R[u1, r, z + t + u1] += d[5]
    X = np.empty((4, 4, (th_ + u1) * Wh), dx.dtype)  # B^T down the columns (adjoint), by phase
    E = np.empty((2, th_ * Wh), dx.dtype)           # rows 4t1+4, 4t1+5: shared with tile row t1+1
    for j in range(u4):
        for t in range(th_ * Wh):
            d = _b(cf, R[j, u0, t], R[j, u1, t], R[j, u2, t], R[j, u3, t], R[j, u4, t], R[j, u5, t])
            X[j, u0, t] = d[0]
            X[j, u1, t] = d[1]
            X[j, u2, t] = d[2]
            X[j, u3, t] = d[3]
            E[u0, t] = d[4]
            E[u1, t] = d[5]
        for i in range(u4):
            for t in range(th_ * Wh, (th_ + u1) * Wh):
                X[j, i, t] = 0
        for t in range(th_ * Wh):
            X[j, u0, t + Wh] += E[u0, t]
            X[j, u1, t + Wh] += E[u1, t]
    line = np.zeros(4 * Wh + W + pw, dx.dtype)      # by phase back to pixels; unread ones get 0
    for h in range(_u(H)):
        hq = h + _u(ph)
        if hq < Hp:
            i, z = hq % u4, (hq // u4) * Wh
            for t in range(Wh):
                line[u4 * t] = X[u0, i, z + t]
                line[u4 * t + u1] = X[u1, i, z + t]
                line[u4 * t + u2] = X[u2, i, z + t]
                line[u4 * t + u3] = X[u3, i, z + t]
            for w in range(_u(W)):
                dx[n, c, h, w] = line[w + _u(pw)]
        else:
            for w in range(_u(W)):
                dx[n, c, h, w] = 0


@njit(cache=True, nogil=True, fastmath=True)
def _output_transform_plane(M, base, b, th, tw, y, n, k):
    """y[n, k] = A^T M A + b[k] for the tiles M[:, k, base:base + th*tw]."""
    n, k, base = _u(n), _u(k), _u(base)
    Ho, Wo = y.shape[2:]
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    P = _u(th) * _u(tw)
    cf = _consts(y)
    bias = b[k]
    Cm = np.empty((4, 6, P), y.dtype)               # A^T along the columns: Cm[j, r, tile]
    for r in range(u6):
        row = u6 * r
        for t in range(P):
            o = _at(cf, M[row, k, base + t], M[row + u1, k, base + t], M[row + u2, k, base + t],
                    M[row + u3, k, base + t], M[row + u4, k, base + t], M[row + u5, k, base + t])
            Cm[u0, r, t] = o[0]
            Cm[u1, r, t] = o[1]
            Cm[u2, r, t] = o[2]
            Cm[u3, r, t] = o[3]
    Y = np.empty((4, 4, P), y.dtype)                # then along the rows: pixel (i, j) of each tile
    for j in range(u4):
        for t in range(P):
            o = _at(cf, Cm[j, u0, t], Cm[j, u1, t], Cm[j, u2, t], Cm[j, u3, t], Cm[j, u4, t],
                    Cm[j, u5, t])
            Y[u0, j, t] = o[0] + bias
            Y[u1, j, t] = o[1] + bias
            Y[u2, j, t] = o[2] + bias
            Y[u3, j, t] = o[3] + bias
    full = _u(Wo) // u4
    for h in range(_u(Ho)):
        i, first = h % u4, (h // u4) * _u(tw)
        for t in range(full):
            y[n, k, h, u4 * t] = Y[i, u0, first + t]
            y[n, k, h, u4 * t + u1] = Y[i, u1, first + t]
            y[n, k, h, u4 * t + u2] = Y[i, u2, first + t]
            y[n, k, h, u4 * t + u3] = Y[i, u3, first + t]
        for w in range(u4 * full, _u(Wo)):
            y[n, k, h, w] = Y[i, w - u4 * full, first + full]


@njit(cache=True, nogil=True, fastmath=True)
def _output_transform_adjoint_plane(gy, n, k, th, tw, dM, base):
    """dM[:, k, base:base + th*tw] = A gy A^T for the tiles of gy[n, k];
    returns the sum of gy[n, k] (the plane's share of the bias gradient)."""
    n, k, base = _u(n), _u(k), _u(base)
    Ho, Wo = gy.shape[2:]
    u0, u1, u2, u3, u4, u5, u6 = _u(0), _u(1), _u(2), _u(3), _u(4), _u(5), _u(6)
    P = _u(th) * _u(tw)
    cf = _consts(dM)
    Y = np.zeros((4, 4, P), dM.dtype)               # gradient of pixel (i, j) of each tile
    total = cf[0] - cf[0]                          # zero of the data's dtype
    full = _u(Wo) // u4
    for h in range(_u(Ho)):
        i, first = h % u4, (h // u4) * _u(tw)
        for t in range(full):
            g0, g1 = gy[n, k, h, u4 * t], gy[n, k, h, u4 * t + u1]
            g2, g3 = gy[n, k, h, u4 * t + u2], gy[n, k, h, u4 * t + u3]
            Y[i, u0, first + t] = g0
            Y[i, u1, first + t] = g1
            Y[i, u2, first + t] = g2
            Y[i, u3, first + t] = g3
            total += (g0 + g1) + (g2 + g3)
        for w in range(u4 * full, _u(Wo)):
            g = gy[n, k, h, w]
            Y[i, w - u4 * full, first + full] = g
            total += g
    Cm = np.empty((4, 6, P), dM.dtype)              # A along the rows (adjoint)
    for j in range(u4):
        for t in range(P):
            o = _a(cf, Y[u0, j, t], Y[u1, j, t], Y[u2, j, t], Y[u3, j, t])
            Cm[j, u0, t] = o[0]
            Cm[j, u1, t] = o[1]
            Cm[j, u2, t] = o[2]
            Cm[j, u3, t] = o[3]
            Cm[j, u4, t] = o[4]
            Cm[j, u5, t] = o[5]
    for r in range(u6):                             # then along the columns
        row = u6 * r
        for t in range(P):
            o = _a(cf, Cm[u0, r, t], Cm[u1, r, t], Cm[u2, r, t], Cm[u3, r, t])
            dM[row, k, base + t] = o[0]
            dM[row + u1, k, base + t] = o[1]
            dM[row + u2, k, base + t] = o[2]
            dM[row + u3, k, base + t] = o[3]
            dM[row + u4, k, base + t] = o[4]
            dM[row + u5, k, base + t] = o[5]
    return total


# ---- the transforms as functions of whole arrays (V, M: 36 x channels x N*th*tw) ----------------
#
# For the tests of the transforms (the convolution fuses them a chunk at a time,
# below): one plane after another, from Python, so that nothing compiles
# beyond the plane kernels the convolution uses too.

def _input_transform(x, ph, pw, th, tw, V):
    N, C = x.shape[:2]
    for n in range(N):
        for c in range(C):
            _input_transform_plane(x, n, c, ph, pw, th, tw, V, n * th * tw)


def _input_transform_adjoint(dV, ph, pw, th, tw, dx):
    N, C = dx.shape[:2]
    for n in range(N):
        for c in range(C):
            _input_transform_adjoint_plane(dV, n, c, ph, pw, th, tw, dx, n * th * tw)


def _output_transform(M, b, th, tw, y):
    N, K = y.shape[:2]
    for n in range(N):
        for k in range(K):
            _output_transform_plane(M, n * th * tw, b, th, tw, y, n, k)


def _output_transform_adjoint(gy, th, tw, dM, db):
    N, K = gy.shape[:2]
    for n in range(N):
        for k in range(K):
            db[n, k] = _output_transform_adjoint_plane(gy, n, k, th, tw, dM, n * th * tw)


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


# ---- the convolution, fused a chunk of images at a time ------------------------------------------
#
# The whole-array functions above stream V and M (2.25x and 4.5x the input's
# size per channel pair) through memory, and every batched BLAS product woke
# OpenBLAS's thread pool, whose spinning worker then took the core that the
# next transform needed.  The convolution itself therefore runs a chunk of
# ``per`` images at a time in one Numba function (``_forward_chunk``): its
# thread transforms the chunk's tiles into its own V and M (36 x C x T and
# 36 x K x T, T = per*th*tw tiles, about 1 MiB together: in cache),
# multiplies them with 36 BLAS products called from Numba (``np.dot`` into
# ``out``: SciPy's OpenBLAS, which runs a product below 4 * 65536
# multiply-adds on the calling thread, i.e. every product of the benchmark),
# and transforms back.  Backward does the same with dM, recomputing V from x
# instead of keeping it (cheaper than writing it out and reading it back);
# each worker sums its images' weight gradients in its own dU, and the few
# partial sums are added at the end.  The chunks run on Python threads
# (``run_tasks``; the functions release the GIL), not in a ``prange`` loop,
# which compiled for 5 and 10 s longer on a cold cache and ran no faster
# (2026-12-06, 2 cores: 2.6 against 3.2 ms for forward and backward of 64
# images of 6 -> 16 channels, 14x14; 5.7 against 5.6 ms at 32 x 16 -> 16,
# 32x32; one thread alike within noise).


@njit(cache=True, nogil=True)
def _forward_chunk(x, U, b, ph, pw, th, tw, y, per, j):
    """Chunk j of the forward: images [j*per, (j+1)*per) transformed, multiplied
    and transformed back by the calling thread."""
    N, C = x.shape[:2]
    K, P = U.shape[1], th * tw
    n0, n1 = j * per, min(N, (j + 1) * per)
    V = np.empty((36, C, (n1 - n0) * P), x.dtype)
    M = np.empty((36, K, (n1 - n0) * P), x.dtype)
    for n in range(n0, n1):
        for c in range(C):
            _input_transform_plane(x, n, c, ph, pw, th, tw, V, (n - n0) * P)
    for xi in range(36):
        np.dot(U[xi], V[xi], M[xi])
    for n in range(n0, n1):
        for k in range(K):
            _output_transform_plane(M, (n - n0) * P, b, th, tw, y, n, k)


def _forward(x, U, b, ph, pw, th, tw, y, per):
    run_tasks(_forward_chunk, (x.shape[0] + per - 1) // per, x, U, b, ph, pw, th, tw, y, per)


@njit(cache=True, nogil=True)
def _backward_worker(gy, x, U, ph, pw, th, tw, dx, dUs, db, need_x, need_w, per, w):
    """Worker w's share of the backward: its images' gradients, a chunk at a time,
    and their weight gradient summed in dUs[w]."""
    N, K = gy.shape[:2]
    C, P = x.shape[1], th * tw
    workers = dUs.shape[0]
    part = np.empty((K, C), gy.dtype)
    dU = dUs[w]
    dU[:] = 0
    last = (w + 1) * N // workers
    for n0 in range(w * N // workers, last, per):
        n1 = min(last, n0 + per)
        T = (n1 - n0) * P
        dM = np.empty((36, K, T), gy.dtype)
        for n in range(n0, n1):
            for k in range(K):
                db[n, k] = _output_transform_adjoint_plane(gy, n, k, th, tw, dM, (n - n0) * P)
        if need_w:
            V = np.empty((36, C, T), gy.dtype)
            for n in range(n0, n1):
                for c in range(C):
                    _input_transform_plane(x, n, c, ph, pw, th, tw, V, (n - n0) * P)
            for xi in range(36):
                np.dot(dM[xi], V[xi].T, part)
                # element by element: an array assigned to a slice compiles Numba's
                # shape-mismatch message (3.4 s on a cold cache)
                for k in range(K):
                    for c in range(C):
                        dU[xi, k, c] += part[k, c]
        if need_x:
            dV = np.empty((36, C, T), gy.dtype)
            for xi in range(36):
                np.dot(U[xi].T, dM[xi], dV[xi])
            for n in range(n0, n1):
                for c in range(C):
                    _input_transform_adjoint_plane(dV, n, c, ph, pw, th, tw, dx, (n - n0) * P)


def _backward(gy, x, U, ph, pw, th, tw, dx, dUs, db, need_x, need_w, per):
    run_tasks(_backward_worker, dUs.shape[0], gy, x, U, ph, pw, th, tw, dx, dUs, db, need_x,
              need_w, per)


PER = None          # images per chunk, for tests; None: ``_per`` chooses


def _per(N, C, K, P, itemsize):
    """Images per chunk: as many as fit in about 1 MiB of V and M (P tiles an
    image), but no fewer chunks than threads."""
    if PER is not None:
        return PER
    per = (1 << 20) // max(1, 36 * (C + K) * P * itemsize)
    return int(max(1, min(per, -(-N // numba.get_num_threads()))))


def conv2d(x, w, bias=None, padding=(0, 0)):
    """y = conv2d(x, w) + bias for a 3x3 kernel, stride 1, any padding;
    returns (y, U), U the transformed weights for ``conv2d_backward``."""
    N, C, H, W = x.shape
    Ho, Wo, th, tw = tiles(H, W, padding)
    U = weight_transform(w)
    K = U.shape[1]
    y = np.empty((N, K, Ho, Wo), x.dtype)
    b = np.zeros(K, x.dtype) if bias is None else np.ascontiguousarray(bias, x.dtype)
    if y.size:
        _forward(x, U, b, padding[0], padding[1], th, tw, y, _per(N, C, K, th * tw, x.itemsize))
    return y, U


def conv2d_backward(gy, x, U, x_shape, padding, need_x=True, need_w=True):
    """(dx, dw, db) of ``conv2d`` for the output gradient gy (any memory
    order); dx or dw is None where not needed.  ``x`` is the forward's input,
    read for dw only (None will do when ``need_w`` is false), and U the
    forward's transformed weights (None will do when ``need_x`` is false)."""
    N, C, H, W = x_shape
    K = gy.shape[1]
    _, _, th, tw = tiles(H, W, padding)
    if not need_w:
        x = np.empty((N, C, 0, 0), gy.dtype)
    if not need_x:
        U = np.empty((36, 0, 0), gy.dtype)
    workers = max(1, min(N, numba.get_num_threads()))
    dx = np.empty(x_shape, gy.dtype) if need_x else np.empty((N, C, 0, 0), gy.dtype)
    dUs = np.zeros((workers, 36, K, C), gy.dtype)
    db = np.zeros((N, K), gy.dtype)
    if gy.size:
        _backward(gy, x, U, padding[0], padding[1], th, tw, dx, dUs, db, need_x, need_w,
                  _per(N, C, K, th * tw, gy.itemsize))
    elif dx.size:
        dx[...] = 0
    dw = weight_transform_adjoint(dUs.sum(axis=0)) if need_w else None
    return (dx if need_x else None), dw, db.sum(axis=0)
