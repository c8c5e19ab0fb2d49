"""im2col/col2im: the NumPy reference against the definition, the Numba twin
against the reference, col2im as the adjoint of im2col, and the dispatcher."""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commrt.kernels import im2col_numba
from commrt.kernels import im2col_numpy as mod

# the submodule shares its name with the function it exports: take the module itself
dispatcher = importlib.import_module("commrt.kernels.conv")
im2col, col2im = dispatcher.im2col, dispatcher.col2im
rng = np.random.default_rng(2)


def definition(x, k, s, p, d):
    """col[(c, i, j), (n, ho, wo)] = x[n, c, ho*sh - ph + i*dh, wo*sw - pw + j*dw]."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = mod.geometry(x.shape, k, s, p, d)
    N, C, H, W = x.shape
    col = np.zeros((C, kh, kw, N, Ho, Wo), x.dtype)
    for c, i, j, n, ho, wo in np.ndindex(col.shape):
        h, w = ho * sh - ph + i * dh, wo * sw - pw + j * dw
        if 0 <= h < H and 0 <= w < W:
            col[c, i, j, n, ho, wo] = x[n, c, h, w]
    return col.reshape(C * kh * kw, N * Ho * Wo)


CASES = [((2, 3, 5, 4), 3, 1, 1, 1), ((1, 2, 7, 7), (2, 3), (2, 1), (1, 0), (2, 1)),
         ((2, 1, 1, 1), 3, 1, 1, 1), ((1, 1, 6, 9), (3, 2), (3, 2), (2, 1), (1, 3)),
         ((3, 2, 4, 4), 1, 1, 0, 1), ((1, 1, 5, 5), 5, 1, 0, 1)]


@pytest.mark.parametrize("shape,k,s,p,d", CASES)
@pytest.mark.parametrize("impl", ["numpy", "numba"])
def test_im2col_matches_definition_and_col2im_is_its_adjoint(shape, k, s, p, d, impl):
    fwd, adj = ((mod.im2col_numpy, mod.col2im_numpy) if impl == "numpy"
                else (im2col_numba.im2col, im2col_numba.col2im))
    x = rng.standard_normal(shape)
    col = fwd(x, k, s, p, d)
    np.testing.assert_array_equal(col, definition(x, k, s, p, d))
    c = rng.standard_normal(col.shape)
    back = adj(c, shape, k, s, p, d)
    assert back.shape == shape
    # <im2col(x), c> == <x, col2im(c)> for every x and c
    assert np.vdot(col, c) == pytest.approx(np.vdot(x, back), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       k=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       p=st.tuples(st.integers(0, 2), st.integers(0, 2)), d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_numba_equals_numpy_reference(n, c, h, w, k, s, p, d, dtype):
    shape = (n, c, h, w)
    try:
        mod.geometry(shape, k, s, p, d)
    except ValueError:
        return                                      # the kernel does not fit: covered below
    x = rng.standard_normal(shape).astype(dtype)
    col = im2col_numba.im2col(x, k, s, p, d)
    assert col.dtype == dtype
    np.testing.assert_array_equal(col, mod.im2col_numpy(x, k, s, p, d))
    g = rng.standard_normal(col.shape).astype(dtype)
    np.testing.assert_allclose(im2col_numba.col2im(g, shape, k, s, p, d),
                               mod.col2im_numpy(g, shape, k, s, p, d), rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_empty_batch():
    x = rng.standard_normal((3, 2, 6, 5)).transpose(1, 0, 2, 3)        # a CNHW-ordered view
    np.testing.assert_array_equal(im2col(x, 3, 1, 1), mod.im2col_numpy(x, 3, 1, 1))
    empty = np.zeros((0, 2, 4, 4))
    assert im2col(empty, 3).shape == (18, 0)
    assert col2im(np.zeros((18, 0)), empty.shape, 3).shape == empty.shape


def test_dispatch_by_array_type():
    assert dispatcher._backend(np.zeros(1)) == (mod.im2col_numpy, im2col_numba.col2im)
    with pytest.raises(TypeError, match="unsupported array type list"):
        im2col([[1.0]], 1)


@pytest.mark.parametrize("call,pattern", [
    (lambda: im2col(np.zeros((1, 1, 3, 3)), 4), r"4x4 kernel .* does not fit .*\(1, 1, 3, 3\)"),
    (lambda: im2col(np.zeros((3, 3)), 1), r"expected an \(N, C, H, W\) input, got shape \(3, 3\)"),
    (lambda: im2col(np.zeros((1, 1, 3, 3)), 2, stride=0), "must be >= 1"),
    (lambda: im2col(np.zeros((1, 1, 3, 3)), (1, 2, 3)), "kernel_size must be an int or a pair"),
    (lambda: col2im(np.zeros((4, 5)), (1, 1, 3, 3), 2), r"column matrix \(4, 5\) does not match \(4, 4\)"),
    (lambda: mod.col2im_numpy(np.zeros((4, 5)), (1, 1, 3, 3), 2), r"does not match \(4, 4\)"),
])
def test_errors(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_package_names_are_the_functions_even_after_the_module_loads():
    import commrt.kernels as k
    import commrt.kernels.conv  # noqa: F401  (loading the dispatcher must not shadow the names)

    assert callable(k.im2col) and k.im2col.__name__ == "im2col"
    assert callable(k.col2im) and k.col2im.__name__ == "col2im"
