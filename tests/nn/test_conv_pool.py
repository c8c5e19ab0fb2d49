"""Conv2d against a direct convolution, pooling against window loops, and
their gradients against finite differences."""
import numpy as np
import pytest

from commrt import nn
from commrt.nn import functions as F
from commrt.nn.gradcheck import check_grad

rng = np.random.default_rng(5)


def direct_conv2d(x, w, b, stride, padding, dilation):
    """Sum over kernel taps of an einsum on a strided view: no im2col."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((N, O, Ho, Wo))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh:i * dh + sh * (Ho - 1) + 1:sh, j * dw:j * dw + sw * (Wo - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out + (0 if b is None else b[None, :, None, None])


GEOMETRIES = [
    # x shape, (Cout, kh, kw), stride, padding, dilation
    ((2, 3, 5, 5), (4, 3, 3), (1, 1), (0, 0), (1, 1)),
    ((2, 3, 5, 5), (4, 3, 3), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 7, 6), (3, 3, 2), (2, 1), (1, 0), (1, 1)),
    ((2, 2, 7, 7), (2, 3, 3), (2, 2), (2, 1), (2, 2)),
    ((1, 1, 9, 8), (2, 2, 3), (3, 2), (0, 1), (3, 1)),
    ((3, 2, 1, 1), (2, 3, 3), (1, 1), (1, 1), (1, 1)),      # one-pixel images
    ((2, 1, 1, 1), (3, 1, 1), (1, 1), (0, 0), (1, 1)),      # 1x1 kernel on 1x1 image
    ((1, 3, 4, 5), (2, 4, 5), (1, 1), (0, 0), (1, 1)),      # kernel as large as the image
]


@pytest.fixture(params=["chunked", "whole batch"])
def lowering(request, monkeypatch):
    """Run a test with im2col + GEMM a chunk of images at a time (the CPU's
    way with one thread) and again with the whole batch lowered at once."""
    from commrt.kernels._jit import numba
    before = numba.get_num_threads()
    if request.param == "whole batch":
        monkeypatch.setenv("COMMRT_CONV_CHUNK_BYTES", "0")
    else:
        numba.set_num_threads(1)
    yield request.param
    numba.set_num_threads(before)


@pytest.mark.parametrize("shape,wshape,stride,padding,dilation", GEOMETRIES)
def test_conv2d_matches_direct_convolution(lowering, shape, wshape, stride, padding, dilation):
    x = rng.standard_normal(shape)
    w = rng.standard_normal((wshape[0], shape[1]) + wshape[1:])
    b = rng.standard_normal(wshape[0])
    got = F.conv2d(nn.Tensor(x), nn.Tensor(w), nn.Tensor(b), stride, padding, dilation).data
    np.testing.assert_allclose(got, direct_conv2d(x, w, b, stride, padding, dilation), atol=1e-12)


@pytest.mark.parametrize("shape,wshape,stride,padding,dilation", GEOMETRIES[1:6])
def test_conv2d_gradients(lowering, shape, wshape, stride, padding, dilation):
    x = nn.Tensor(rng.standard_normal(shape), requires_grad=True)
    w = nn.Tensor(rng.standard_normal((wshape[0], shape[1]) + wshape[1:]), requires_grad=True)
    b = nn.Tensor(rng.standard_normal(wshape[0]), requires_grad=True)
    check_grad(lambda: F.conv2d(x, w, b, stride, padding, dilation), [x, w, b])


def test_conv2d_without_bias_and_without_input_grad(lowering):
    x = nn.Tensor(rng.standard_normal((2, 2, 4, 4)))
    w = nn.Tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    check_grad(lambda: F.conv2d(x, w, padding=1), [w])
    assert x.grad is None


def test_conv2d_float32_matches_float64():
    x = rng.standard_normal((4, 16, 12, 12))
    w = rng.standard_normal((8, 16, 3, 3))
    y64 = F.conv2d(nn.Tensor(x), nn.Tensor(w), padding=1).data
    y32 = F.conv2d(nn.Tensor(x.astype(np.float32)), nn.Tensor(w.astype(np.float32)), padding=1).data
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4)


def window_reference(x, k, s, p, reduce, pad_value):
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
    Ho = (xp.shape[2] - kh) // sh + 1
    Wo = (xp.shape[3] - kw) // sw + 1
    out = np.empty(x.shape[:2] + (Ho, Wo))
    for a in range(Ho):
        for b in range(Wo):
            out[:, :, a, b] = reduce(xp[:, :, a * sh:a * sh + kh, b * sw:b * sw + kw], axis=(2, 3))
    return out


POOLS = [
    ((2, 3, 4, 4), (2, 2), None, (0, 0)),
    ((1, 2, 5, 7), (3, 3), (2, 2), (1, 1)),
    ((2, 1, 6, 5), (2, 3), (1, 2), (1, 0)),
    ((1, 1, 1, 1), (1, 1), None, (0, 0)),
    ((1, 2, 5, 5), (2, 2), (2, 2), (0, 0)),                 # odd size: the last row is dropped
]


@pytest.mark.parametrize("shape,k,s,p", POOLS)
def test_pooling_matches_window_loops(shape, k, s, p):
    x = rng.standard_normal(shape)
    stride = k if s is None else s
    np.testing.assert_allclose(F.max_pool2d(nn.Tensor(x), k, s, p).data,
                               window_reference(x, k, stride, p, np.max, -np.inf))
    np.testing.assert_allclose(F.avg_pool2d(nn.Tensor(x), k, s, p).data,
                               window_reference(x, k, stride, p, np.mean, 0.0))


@pytest.mark.parametrize("shape,k,s,p", POOLS)
def test_pooling_gradients(shape, k, s, p):
    x = nn.Tensor(rng.standard_normal(shape), requires_grad=True)
    check_grad(lambda: F.max_pool2d(x, k, s, p), [x])
    check_grad(lambda: F.avg_pool2d(x, k, s, p), [x])


def test_max_pool_sends_tied_gradient_to_one_element():
    x = nn.Tensor(np.zeros((1, 1, 2, 2)), requires_grad=True)
    F.max_pool2d(x, 2).sum().backward()
    assert x.grad.sum() == 1 and x.grad[0, 0, 0, 0] == 1


def test_matches_pytorch_when_installed():
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((4, 3, 3, 2))
    b = rng.standard_normal(4)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, torch.tensor(b), (2, 1), (1, 1), (2, 1))
    ty = torch.nn.functional.max_pool2d(ty, 2, 1, 1)
    ty.sum().backward()
    cx, cw = nn.Tensor(x, requires_grad=True), nn.Tensor(w, requires_grad=True)
    cy = F.max_pool2d(F.conv2d(cx, cw, nn.Tensor(b), (2, 1), (1, 1), (2, 1)), 2, 1, 1)
    cy.sum().backward()
    np.testing.assert_allclose(cy.data, ty.detach().numpy(), atol=1e-10)
    np.testing.assert_allclose(cx.grad, tx.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(cw.grad, tw.grad.numpy(), atol=1e-10)


@pytest.fixture(params=["winograd", "im2col"])
def conv_path(request, monkeypatch):
    """Run a test through the Winograd path (3x3, stride 1, dilation 1) and
    again with it switched off, through the im2col fallback."""
    import commrt.nn.functions.conv as conv_module
    if request.param == "im2col":
        monkeypatch.setattr(conv_module, "winograd", lambda *args: None)
    return request.param


@pytest.mark.parametrize("shape,cout,padding", [
    ((2, 3, 6, 7), 4, 1), ((1, 2, 5, 5), 3, 0), ((3, 2, 1, 1), 2, 1), ((2, 2, 9, 4), 2, (2, 0))])
def test_conv2d_3x3_stride_1_on_both_paths(conv_path, shape, cout, padding):
    x = nn.Tensor(rng.standard_normal(shape), requires_grad=True)
    w = nn.Tensor(rng.standard_normal((cout, shape[1], 3, 3)), requires_grad=True)
    b = nn.Tensor(rng.standard_normal(cout), requires_grad=True)
    p = (padding, padding) if isinstance(padding, int) else padding
    np.testing.assert_allclose(F.conv2d(x, w, b, 1, padding).data,
                               direct_conv2d(x.data, w.data, b.data, (1, 1), p, (1, 1)), atol=1e-12)
    check_grad(lambda: F.conv2d(x, w, b, 1, padding), [x, w, b])
    check_grad(lambda: F.conv2d(x, w, None, 1, padding), [w])


def test_conv2d_takes_winograd_for_3x3_stride_1(monkeypatch):
    from commrt.kernels import winograd as wg
    calls = []
    real = wg.conv2d
    monkeypatch.setattr(wg, "conv2d", lambda *a: calls.append(1) or real(*a))
    x = nn.Tensor(rng.standard_normal((1, 2, 5, 5)))
    F.conv2d(x, nn.Tensor(rng.standard_normal((2, 2, 3, 3))), padding=1)
    F.conv2d(x, nn.Tensor(rng.standard_normal((2, 2, 3, 3))), stride=2, padding=1)
    F.conv2d(x, nn.Tensor(rng.standard_normal((2, 2, 5, 5))), padding=2)
    assert len(calls) == 1
