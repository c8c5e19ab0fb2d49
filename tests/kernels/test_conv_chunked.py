"""Chunked im2col + GEMM convolution: forward and backward against the
whole-batch NumPy reference (im2col_numpy, one product, col2im_numpy) over
odd geometries, chunk sizes that do and do not divide the batch, float32 and
float64, and inputs and gradients in any memory order; the dispatcher; and
a LeNet step on both lowerings."""
import importlib

import numpy as np
import pytest

from commrt.kernels import conv_chunked as cc
from commrt.kernels.im2col_numpy import col2im_numpy, geometry, im2col_numpy

dispatcher = importlib.import_module("commrt.kernels.conv")
rng = np.random.default_rng(11)


def reference(x, w, b, gy, s, p, d):
    """(y, dx, dw, db) by the whole-batch lowering in NumPy; y and gy NCHW."""
    K = w.shape[0]
    k = w.shape[2:]
    _, _, _, _, (Ho, Wo) = geometry(x.shape, k, s, p, d)
    N = x.shape[0]
    col = im2col_numpy(x, k, s, p, d)
    w2 = w.reshape(K, -1)
    y = (w2 @ col).reshape(K, N, Ho, Wo).transpose(1, 0, 2, 3) + b[None, :, None, None]
    gy2 = gy.transpose(1, 0, 2, 3).reshape(K, -1)
    dx = col2im_numpy(w2.T @ gy2, x.shape, k, s, p, d)
    return y, dx, (gy2 @ col.T).reshape(w.shape), gy2.sum(axis=1)


GEOMETRIES = [
    # x shape, (K, kh, kw), stride, padding, dilation
    ((5, 1, 28, 28), (6, 5, 5), (1, 1), (2, 2), (1, 1)),   # LeNet's first layer, odd batch
    ((7, 6, 14, 14), (16, 5, 5), (1, 1), (0, 0), (1, 1)),  # and its second
    ((3, 2, 7, 6), (3, 3, 2), (2, 1), (1, 0), (1, 1)),
    ((2, 2, 7, 7), (2, 3, 3), (2, 2), (2, 1), (2, 2)),
    ((3, 1, 9, 8), (2, 2, 3), (3, 2), (0, 1), (3, 1)),
    ((3, 2, 1, 1), (2, 3, 3), (1, 1), (1, 1), (1, 1)),     # one-pixel images
    ((2, 1, 1, 1), (3, 1, 1), (1, 1), (0, 0), (1, 1)),     # 1x1 kernel on a 1x1 image
    ((1, 3, 4, 5), (2, 4, 5), (1, 1), (0, 0), (1, 1)),     # kernel as large as the image
]


@pytest.mark.parametrize("per", [None, 1, 2, 3])
@pytest.mark.parametrize("shape,wshape,s,p,d", GEOMETRIES)
def test_forward_and_backward_match_reference(monkeypatch, shape, wshape, s, p, d, per):
    monkeypatch.setattr(cc, "PER", per)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((wshape[0], shape[1]) + wshape[1:])
    b = rng.standard_normal(wshape[0])
    y = cc.conv2d(x, w, b, s, p, d)
    gy = rng.standard_normal(y.shape)
    ry, rdx, rdw, rdb = reference(x, w, b, gy, s, p, d)
    assert y.transpose(1, 0, 2, 3).flags.c_contiguous            # CNHW memory order
    np.testing.assert_allclose(y, ry, rtol=1e-12, atol=1e-12)
    dx, dw, db = cc.conv2d_backward(gy, x, w, s, p, d)
    np.testing.assert_allclose(dx, rdx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, rdw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, rdb, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("need_x,need_w", [(True, False), (False, True)])
def test_only_the_gradients_asked_for(need_x, need_w):
    x = rng.standard_normal((3, 2, 6, 5))
    w = rng.standard_normal((4, 2, 3, 2))
    gy = rng.standard_normal((3, 4, 4, 4))
    _, rdx, rdw, rdb = reference(x, w, np.zeros(4), gy, (1, 1), (0, 0), (1, 1))
    dx, dw, db = cc.conv2d_backward(gy, x, w, need_x=need_x, need_w=need_w)
    assert (dx is None) != need_x and (dw is None) != need_w
    if need_x:
        np.testing.assert_allclose(dx, rdx, atol=1e-12)
    else:
        np.testing.assert_allclose(dw, rdw, atol=1e-12)
    np.testing.assert_allclose(db, rdb, atol=1e-12)


def test_float32_and_any_memory_order(monkeypatch):
    monkeypatch.setattr(cc, "PER", 2)
    x64 = rng.standard_normal((5, 3, 9, 9))
    w64 = rng.standard_normal((4, 3, 3, 5))
    b64 = rng.standard_normal(4)
    y64 = cc.conv2d(x64, w64, b64, (1, 2), (1, 2), (1, 1))
    gy64 = rng.standard_normal(y64.shape)
    ref = cc.conv2d_backward(gy64, x64, w64, (1, 2), (1, 2), (1, 1))
    # float32 inputs and gradient in CNHW memory order (an NCHW view)
    x = np.ascontiguousarray(x64.astype(np.float32).transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    gy = np.ascontiguousarray(gy64.astype(np.float32).transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    w, b = w64.astype(np.float32), b64.astype(np.float32)
    y = cc.conv2d(x, w, b, (1, 2), (1, 2), (1, 1))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, y64, rtol=1e-4, atol=1e-4)
    for got, want in zip(cc.conv2d_backward(gy, x, w, (1, 2), (1, 2), (1, 1)), ref):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_without_bias_and_empty_batch():
    x = rng.standard_normal((2, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    ry, *_ = reference(x, w, np.zeros(3), np.zeros((2, 3, 3, 3)), (1, 1), (0, 0), (1, 1))
    np.testing.assert_allclose(cc.conv2d(x, w), ry, atol=1e-12)
    empty = np.zeros((0, 2, 5, 5))
    assert cc.conv2d(empty, w).shape == (0, 3, 3, 3)
    dx, dw, db = cc.conv2d_backward(np.zeros((0, 3, 3, 3)), empty, w)
    assert dx.shape == empty.shape and not dw.any() and not db.any()


def test_gradient_shape_is_checked():
    x = rng.standard_normal((2, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    with pytest.raises(ValueError, match="does not match the output"):
        cc.conv2d_backward(np.zeros((2, 3, 4, 4)), x, w)


@pytest.fixture
def one_thread():
    from commrt.kernels._jit import numba
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def test_dispatcher_takes_chunks_with_one_thread_unless_switched_off(one_thread, monkeypatch):
    from commrt.kernels._jit import numba
    x = np.zeros((1, 1, 4, 4), np.float32)
    assert dispatcher.chunked(x) is cc
    assert dispatcher.chunked(x.astype(np.int32)) is None
    monkeypatch.setenv("COMMRT_CONV_CHUNK_BYTES", "0")
    assert dispatcher.chunked(x) is None
    monkeypatch.delenv("COMMRT_CONV_CHUNK_BYTES")
    if numba.config.NUMBA_NUM_THREADS > 1:
        numba.set_num_threads(2)
        assert dispatcher.chunked(x) is None          # the whole batch, over the threads


def test_lenet_step_is_the_same_on_both_lowerings(one_thread, monkeypatch):
    """A LeNet forward and backward in float64 gives the same loss and
    gradients with chunks (through the layers' Functions) as with the whole
    batch."""
    from commrt import nn
    from commrt.nn import functions as F
    x = rng.standard_normal((9, 1, 28, 28))
    labels = rng.integers(0, 10, 9)
    grads = []
    for budget in ("64K", "0"):
        monkeypatch.setenv("COMMRT_CONV_CHUNK_BYTES", budget)
        nn.manual_seed(0)
        model = nn.LeNet(dtype=np.float64)
        loss = F.cross_entropy(model(nn.Tensor(x)), labels)
        loss.backward()
        grads.append([loss.data] + [p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
