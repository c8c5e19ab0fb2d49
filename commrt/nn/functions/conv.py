"""Linear, 2-D convolution (im2col + one BLAS product) and pooling.

Convolution keeps its output in CNHW memory order behind an NCHW view: the
product ``W @ col`` yields (Cout, N*Ho*Wo), and transposing the view costs
nothing.  Elementwise layers keep that order, so the gradient that comes
back is usually CNHW-contiguous too and backward reshapes it without a copy.
"""
from commrt.kernels.conv import chunked, col2im, im2col, winograd
from commrt.kernels.im2col_numpy import geometry
from commrt.nn.backend import get_array_module
from commrt.nn.functions._util import as_tensor, pair, require_float, require_same_dtype
from commrt.nn.tensor import Function


class Linear(Function):
    """y = x @ W.T + b with W of shape (out, in)."""

    def forward(self, x, w, b=None):
        self.x, self.w = x, w
        y = x @ w.T
        if b is not None:
            y += b
        return y

    def backward(self, gy):
        need = self.needs_input_grad
        x2 = self.x.reshape(-1, self.x.shape[-1])
        gy2 = gy.reshape(-1, gy.shape[-1])
        gx = (gy @ self.w) if need[0] else None
        gw = (gy2.T @ x2) if need[1] else None
        grads = (gx, gw)
        if len(need) == 3:
            grads += (gy2.sum(axis=0) if need[2] else None,)
        return grads


def linear(x, weight, bias=None):
    x = as_tensor(x)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    require_float("linear", x)
    require_same_dtype("linear", *tensors)
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} does not match weight "
                         f"{tuple(weight.shape)} (expected last axis {weight.shape[1]})")
    return Linear.apply(*tensors)


class Conv2d(Function):
    """3x3 stride-1 layers on the CPU go through Winograd F(4x4, 3x3)
    (``commrt.kernels.winograd``: 4x fewer multiplications, output NCHW),
    other CPU layers through im2col + GEMM a chunk of images at a time
    (``commrt.kernels.conv_chunked``: the columns stay in cache); the rest
    (GPU arrays, or no Numba) through im2col of the whole batch and one
    product.  Both of these give the output in CNHW order (see above)."""

    def forward(self, x, w, b=None):
        k = w.shape[2:]
        _, s, p, d, (Ho, Wo) = geometry(x.shape, k, self.stride, self.padding, self.dilation)
        self.geom = (k, s, p, d)
        self.x_shape = x.shape
        self.winograd = winograd(x, k, s, d)
        if self.winograd is not None:
            y, U = self.winograd.conv2d(x, w, b, p)
            self.x = x if self.needs_input_grad[1] else None
            self.U = U if self.needs_input_grad[0] else None
            return y
        self.chunked = chunked(x)
        if self.chunked is not None:
            self.x, self.w = x, w                      # held by their tensors anyway
            return self.chunked.conv2d(x, w, b, s, p, d)
        cout = w.shape[0]
        w2 = w.reshape(cout, -1)
        col = im2col(x, k, s, p, d)
        y = w2 @ col                                   # (Cout, N*Ho*Wo)
        if b is not None:
            y += b[:, None]
        if self.needs_input_grad[1]:
            self.col = col
        if self.needs_input_grad[0]:
            self.w2 = w2
        return y.reshape(cout, x.shape[0], Ho, Wo).transpose(1, 0, 2, 3)

    def backward(self, gy):
        need = self.needs_input_grad
        if self.winograd is not None:
            gx, gw, gb = self.winograd.conv2d_backward(gy, self.x, self.U, self.x_shape,
                                                       self.geom[2], need[0], need[1])
            return (gx, gw) if len(need) == 2 else (gx, gw, gb if need[2] else None)
        if self.chunked is not None:
            _, s, p, d = self.geom
            gx, gw, gb = self.chunked.conv2d_backward(gy, self.x, self.w, s, p, d, need[0], need[1])
            return (gx, gw) if len(need) == 2 else (gx, gw, gb if need[2] else None)
        cout = gy.shape[1]
        gy2 = gy.transpose(1, 0, 2, 3).reshape(cout, -1)   # free when gy is CNHW-contiguous
        gx = gw = gb = None
        if need[0]:
            gx = col2im(self.w2.T @ gy2, self.x_shape, *self.geom)
        if need[1]:
            # col @ gy2.T runs the long N*Ho*Wo axis as BLAS's inner dimension the
            # way OpenBLAS prefers (1.5 ms against 2.1 ms for gy2 @ col.T here)
            gw = (self.col @ gy2.T).T.reshape(cout, self.x_shape[1], *self.geom[0])
        if len(need) == 3 and need[2]:
            gb = gy2.sum(axis=1)
        return (gx, gw) if len(need) == 2 else (gx, gw, gb)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """2-D cross-correlation of x (N, Cin, H, W) with weight (Cout, Cin, kh, kw)."""
    x = as_tensor(x)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    require_float("conv2d", x)
    require_same_dtype("conv2d", *tensors)
    if x.ndim != 4 or weight.ndim != 4 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"conv2d: input {tuple(x.shape)} does not match weight "
                         f"{tuple(weight.shape)}: expected (N, {weight.shape[1]}, H, W)")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"conv2d: bias {tuple(bias.shape)} does not match weight "
                         f"{tuple(weight.shape)}")
    return Conv2d.apply(*tensors, stride=pair(stride, "stride"), padding=pair(padding, "padding"),
                        dilation=pair(dilation, "dilation"))


def _taps(shape, kernel_size, stride):
    """For each kernel tap (i, j), the slices of the padded input that it
    reads for every output pixel: pooling loops over the kh*kw taps, and
    every pixel of a tap is one strided view, never a Python loop."""
    (kh, kw), (sh, sw) = kernel_size, stride
    _, _, _, _, (Ho, Wo) = geometry(shape, kernel_size, stride, 0, 1)
    return [(slice(None), slice(None), slice(i, i + sh * (Ho - 1) + 1, sh),
             slice(j, j + sw * (Wo - 1) + 1, sw)) for i in range(kh) for j in range(kw)]


def _pad(x, padding, value):
    ph, pw = padding
    if not (ph or pw):
        return x
    xp = get_array_module(x)
    return xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _unpad(g, padding):
    ph, pw = padding
    return g[:, :, ph:g.shape[2] - ph, pw:g.shape[3] - pw] if (ph or pw) else g


class MaxPool2d(Function):
    """Maximum over each window; the gradient goes to the first maximum of the
    window (taps in row-major order), found again in backward by comparing
    each tap with the output, so forward is only kh*kw elementwise maxima."""

    def forward(self, x):
        xp = get_array_module(x)
        padded = _pad(x, self.padding, -xp.inf)      # padding never wins
        taps = _taps(padded.shape, self.kernel_size, self.stride)
        y = padded[taps[0]].copy()
        for tap in taps[1:]:
            xp.maximum(y, padded[tap], out=y)
        self.padded, self.y = padded, y
        return y

    def backward(self, gy):
        xp = get_array_module(gy)
        padded, y = self.padded, self.y
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        disjoint = sh >= kh and sw >= kw
        # windows that tile the input exactly (LeNet's 2x2 pools): every
        # element is written once below, so the gradient needs no zeroing
        tiled = (sh, sw) == (kh, kw) and padded.shape[2:] == (y.shape[2] * kh, y.shape[3] * kw)
        # in the input's memory order (CNHW below a convolution): the ReLU and
        # convolution under this layer then read it without a copy
        gx = (xp.empty_like if tiled else xp.zeros_like)(padded, dtype=gy.dtype)
        taps = _taps(padded.shape, self.kernel_size, self.stride)
        taken = None
        for k, tap in enumerate(taps):
            hit = padded[tap] == y
            if taken is None:
                taken = hit
            else:
                xp.greater(hit, taken, out=hit)      # hit and not yet taken
                if k + 1 < len(taps):
                    taken |= hit
            if disjoint:                             # windows do not overlap: write in place
                xp.multiply(gy, hit, out=gx[tap])
            else:
                gx[tap] += gy * hit
        return (_unpad(gx, self.padding),)


class AvgPool2d(Function):
    """Average over each window, padding counted as zeros."""

    def forward(self, x):
        padded = _pad(x, self.padding, 0)
        taps = _taps(padded.shape, self.kernel_size, self.stride)
        y = padded[taps[0]].copy()
        for tap in taps[1:]:
            y += padded[tap]
        self.padded_shape, self.count = padded.shape, len(taps)
        return y / y.dtype.type(len(taps))

    def backward(self, gy):
        xp = get_array_module(gy)
        gx = xp.zeros(self.padded_shape, dtype=gy.dtype)
        g = gy / gy.dtype.type(self.count)
        for tap in _taps(self.padded_shape, self.kernel_size, self.stride):
            gx[tap] += g
        return (_unpad(gx, self.padding),)


def _pool_args(op, x, kernel_size, stride, padding):
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"{op}: expected an (N, C, H, W) input, got shape {tuple(x.shape)}")
    k = pair(kernel_size, "kernel_size")
    s = k if stride is None else pair(stride, "stride")
    p = pair(padding, "padding")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"{op}: padding {p} must be at most half the kernel {k}")
    return x, dict(kernel_size=k, stride=s, padding=p)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    x, params = _pool_args("max_pool2d", x, kernel_size, stride, padding)
    return MaxPool2d.apply(x, **params)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    x, params = _pool_args("avg_pool2d", x, kernel_size, stride, padding)
    return AvgPool2d.apply(x, **params)
