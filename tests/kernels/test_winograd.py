"""Winograd F(4x4, 3x3): the transform matrices against the definition, the
convolution and its gradients against a direct convolution (float64, exact
to rounding; float32 within its error bound), the adjoint transforms as
adjoints, and the dispatcher's choice between Winograd and im2col."""
import importlib

import numpy as np
import pytest

from commrt.kernels import winograd as wg

dispatcher = importlib.import_module("commrt.kernels.conv")
rng = np.random.default_rng(7)


def direct(x, w, b, padding):
    """Forward, and the backward for gy, of a 3x3 stride-1 convolution by taps."""
    ph, pw = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    Ho, Wo = xp.shape[2] - 2, xp.shape[3] - 2
    y = sum(np.einsum("nchw,kc->nkhw", xp[:, :, i:i + Ho, j:j + Wo], w[:, :, i, j])
            for i in range(3) for j in range(3))
    if b is not None:
        y = y + b[None, :, None, None]
    return y


def direct_backward(x, w, gy, padding):
    ph, pw = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    Ho, Wo = gy.shape[2:]
    gxp, gw = np.zeros_like(xp), np.zeros_like(w)
    for i in range(3):
        for j in range(3):
            gxp[:, :, i:i + Ho, j:j + Wo] += np.einsum("nkhw,kc->nchw", gy, w[:, :, i, j])
            gw[:, :, i, j] = np.einsum("nkhw,nchw->kc", gy, xp[:, :, i:i + Ho, j:j + Wo])
    return gxp[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]], gw, gy.sum(axis=(0, 2, 3))


def test_matrices_compute_a_1d_correlation():
    # y_i = sum_k g_k d_{i+k} for every g (3) and d (6), i < 4
    for _ in range(3):
        g, d = rng.standard_normal(3), rng.standard_normal(6)
        y = wg.AT @ ((wg.G @ g) * (wg.BT @ d))
        np.testing.assert_allclose(y, [g @ d[i:i + 3] for i in range(4)], atol=1e-13)


GEOMETRIES = [
    # x shape, Cout, padding
    ((2, 3, 8, 8), 4, (1, 1)),           # whole tiles
    ((2, 3, 7, 9), 2, (1, 1)),           # partial tiles on both sides
    ((1, 2, 6, 7), 3, (2, 1)),           # padding beyond the kernel's half
    ((2, 3, 5, 6), 4, (0, 0)),           # no padding
    ((2, 2, 9, 10), 3, (3, 0)),
    ((3, 2, 1, 1), 2, (1, 1)),           # one-pixel images
    ((1, 1, 3, 3), 1, (0, 0)),           # one output pixel
    ((1, 1, 2, 13), 2, (1, 1)),
]


@pytest.mark.parametrize("shape,cout,padding", GEOMETRIES)
def test_forward_and_backward_match_direct_convolution(shape, cout, padding):
    x = rng.standard_normal(shape)
    w = rng.standard_normal((cout, shape[1], 3, 3))
    b = rng.standard_normal(cout)
    y, U = wg.conv2d(x, w, b, padding)
    np.testing.assert_allclose(y, direct(x, w, b, padding), atol=1e-12)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = wg.conv2d_backward(gy, x, U, shape, padding)
    rx, rw, rb = direct_backward(x, w, gy, padding)
    np.testing.assert_allclose(gx, rx, atol=1e-12)
    np.testing.assert_allclose(gw, rw, atol=1e-12)
    np.testing.assert_allclose(gb, rb, atol=1e-12)


def test_backward_skips_what_is_not_needed_and_reads_any_memory_order():
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    _, U = wg.conv2d(x, w, None, (1, 1))
    gy = np.ascontiguousarray(rng.standard_normal((4, 2, 6, 6))).transpose(1, 0, 2, 3)   # CNHW
    gx, gw, _ = wg.conv2d_backward(gy, x, None, x.shape, (1, 1), need_x=False)
    assert gx is None
    np.testing.assert_allclose(gw, direct_backward(x, w, gy, (1, 1))[1], atol=1e-12)
    gx, gw, _ = wg.conv2d_backward(gy, None, U, x.shape, (1, 1), need_w=False)
    assert gw is None
    np.testing.assert_allclose(gx, direct_backward(x, w, gy, (1, 1))[0], atol=1e-12)


@pytest.mark.parametrize("per", [1, 2, 3, 5])
def test_any_chunk_of_images_gives_the_same_result(monkeypatch, per):
    # 5 images in chunks of 1, 2, 3 (last chunk partial) and all at once
    monkeypatch.setattr(wg, "PER", per)
    x, w = rng.standard_normal((5, 2, 7, 6)), rng.standard_normal((3, 2, 3, 3))
    b, padding = rng.standard_normal(3), (1, 0)
    y, U = wg.conv2d(x, w, b, padding)
    np.testing.assert_allclose(y, direct(x, w, b, padding), atol=1e-12)
    gy = rng.standard_normal(y.shape)
    for got, want in zip(wg.conv2d_backward(gy, x, U, x.shape, padding),
                         direct_backward(x, w, gy, padding)):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_float32_error_stays_within_its_bound():
    x = rng.standard_normal((4, 16, 12, 12))
    w = rng.standard_normal((8, 16, 3, 3))
    ref = direct(x, w, None, (1, 1))
    x32 = x.astype(np.float32)
    y, U = wg.conv2d(x32, w.astype(np.float32), None, (1, 1))
    assert y.dtype == U.dtype == np.float32
    assert np.abs(y - ref).max() < 2e-5 * np.abs(ref).max()
    gy = rng.standard_normal(ref.shape)
    gx, gw, _ = wg.conv2d_backward(gy.astype(np.float32), x32, U, x.shape, (1, 1))
    rx, rw, _ = direct_backward(x, w, gy, (1, 1))
    assert gx.dtype == gw.dtype == np.float32
    assert np.abs(gx - rx).max() < 2e-5 * np.abs(rx).max()
    assert np.abs(gw - rw).max() < 2e-5 * np.abs(rw).max()


@pytest.mark.parametrize("shape,padding", [((2, 3, 7, 9), (1, 1)), ((1, 2, 6, 7), (2, 1))])
def test_adjoint_transforms_are_adjoints(shape, padding):
    x = rng.standard_normal(shape)
    V = wg.input_transform(x, padding)
    dV = rng.standard_normal(V.shape)
    assert np.vdot(V, dV) == pytest.approx(np.vdot(x, wg.input_transform_adjoint(dV, shape, padding)),
                                           rel=1e-12)
    Ho, Wo, _, _ = wg.tiles(shape[2], shape[3], padding)
    M = rng.standard_normal((36, 3, V.shape[2]))
    y = wg.output_transform(M, None, shape[0], Ho, Wo)
    gy = rng.standard_normal(y.shape)
    dM, db = wg.output_transform_adjoint(gy)
    assert np.vdot(y, gy) == pytest.approx(np.vdot(M, dM), rel=1e-12)
    np.testing.assert_allclose(db, gy.sum(axis=(0, 2, 3)), atol=1e-12)


def test_empty_batch():
    x, w = np.zeros((0, 2, 5, 5)), np.ones((3, 2, 3, 3))
    y, U = wg.conv2d(x, w, np.ones(3), (1, 1))
    assert y.shape == (0, 3, 5, 5)
    gx, gw, gb = wg.conv2d_backward(np.zeros(y.shape), x, U, x.shape, (1, 1))
    assert gx.shape == x.shape and not gw.any() and not gb.any()


@pytest.mark.parametrize("x,k,s,d,expected", [
    (np.zeros((1, 1, 4, 4)), (3, 3), (1, 1), (1, 1), True),
    (np.zeros((1, 1, 4, 4), np.float32), (3, 3), (1, 1), (1, 1), True),
    (np.zeros((1, 1, 4, 4)), (5, 5), (1, 1), (1, 1), False),      # other kernels: im2col
    (np.zeros((1, 1, 4, 4)), (3, 2), (1, 1), (1, 1), False),
    (np.zeros((1, 1, 4, 4)), (3, 3), (2, 1), (1, 1), False),      # strided
    (np.zeros((1, 1, 6, 6)), (3, 3), (1, 1), (2, 2), False),      # dilated
    (np.zeros((1, 1, 4, 4), np.int64), (3, 3), (1, 1), (1, 1), False),
])
def test_dispatcher_chooses_winograd_only_where_it_applies(x, k, s, d, expected):
    assert (dispatcher.winograd(x, k, s, d) is wg) == expected
