"""The CuPy im2col/col2im kernels and a CuPy training step, on a GPU."""
import numpy as np
import pytest


def _cupy():
    try:
        import cupy
    except ImportError:
        pytest.skip("cupy is not installed")
    try:
        available = cupy.cuda.is_available()
    except Exception:                                        # a broken driver counts as absent
        available = False
    if not available:
        pytest.skip("cupy.cuda.is_available() is False: no GPU")
    return cupy


@pytest.mark.parametrize("shape,k,s,p,d", [((2, 3, 5, 4), 3, 1, 1, 1),
                                           ((1, 2, 7, 7), (2, 3), (2, 1), (1, 0), (2, 1)),
                                           ((2, 1, 1, 1), 3, 1, 1, 1)])
def test_cupy_kernels_match_reference(shape, k, s, p, d):
    cupy = _cupy()
    from commrt.kernels.conv import col2im, im2col
    from commrt.kernels.im2col_numpy import col2im_numpy, im2col_numpy
    x = np.random.default_rng(0).standard_normal(shape)
    col = im2col(cupy.asarray(x), k, s, p, d)
    assert isinstance(col, cupy.ndarray)
    np.testing.assert_array_equal(col.get(), im2col_numpy(x, k, s, p, d))
    g = np.random.default_rng(1).standard_normal(col.shape)
    np.testing.assert_allclose(col2im(cupy.asarray(g), shape, k, s, p, d).get(),
                               col2im_numpy(g, shape, k, s, p, d), rtol=1e-12)


def test_training_step_on_cupy_matches_numpy():
    cupy = _cupy()
    from commrt import nn, optim
    from commrt.nn import functions as F
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    y = np.array([1, 2, 3, 4])
    losses = []
    for device in ("cpu", "cuda"):
        nn.manual_seed(0)
        model = nn.LeNet().to(device)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xs = nn.Tensor(x).to(device)
        for _ in range(2):
            loss = F.cross_entropy(model(xs), y if device == "cpu" else cupy.asarray(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(float(loss.item()))
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
