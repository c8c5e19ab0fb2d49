"""im2col / col2im: lower a 2-D convolution to one matrix product.

Layout.  For an input ``x`` of shape (N, C, H, W) and a kh x kw kernel, the
column matrix has shape (C*kh*kw, N*Ho*Wo): row ``(c, i, j)`` holds, for
every output pixel ``(n, ho, wo)``, the input pixel that kernel tap
``(i, j)`` of channel ``c`` sees,

    col[(c, i, j), (n, ho, wo)] = x[n, c, ho*sh - ph + i*dh, wo*sw - pw + j*dw]

(zero outside the image).  A convolution is then ``W.reshape(Cout, -1) @
col``, one large BLAS product whose result (Cout, N*Ho*Wo) is the output in
CNHW order.  ``col2im`` is the adjoint: it scatters-and-adds columns back into
an image, which is the gradient of ``im2col``.

Twins: a NumPy reference (``im2col_numpy``: stride tricks; the only Python
loop runs over the kh*kw kernel taps, never over pixels), Numba CPU
(``im2col_numba``), Numba CUDA (``im2col_cuda``) and CuPy (``im2col_cupy``).
This module only dispatches by the array's type, and says which path a
convolution on the CPU takes instead of the whole-batch lowering: Winograd
(``winograd``: 3x3, stride 1, dilation 1; Numba and SciPy installed) or
im2col + GEMM a chunk of images at a time (``chunked``: any other geometry,
one thread; Numba installed), both for NumPy float arrays.
"""
import numpy as np

from commrt.kernels.im2col_numpy import col2im_numpy, im2col_numpy


def _backend(x):
    if isinstance(x, np.ndarray):
        # On the CPU the stride-trick gather is one memcpy-like pass and beats
        # the Numba loop on small images (0.34 ms against 0.9 ms for LeNet's
        # second layer); the scatter-add is where Numba wins (0.5 against 1.1 ms).
        try:
            from commrt.kernels import im2col_numba
        except ImportError:              # no Numba: the reference still works
            return im2col_numpy, col2im_numpy
        return im2col_numpy, im2col_numba.col2im
    if type(x).__module__.startswith("cupy"):
        from commrt.kernels import im2col_cupy
        return im2col_cupy.im2col, im2col_cupy.col2im
    # numba device arrays (the CUDA simulator's have no __cuda_array_interface__)
    if hasattr(x, "__cuda_array_interface__") or type(x).__module__.startswith("numba.cuda"):
        from commrt.kernels import im2col_cuda
        return im2col_cuda.im2col, im2col_cuda.col2im
    raise TypeError(f"im2col: unsupported array type {type(x).__name__}")


def im2col(x, kernel_size, stride=1, padding=0, dilation=1):
    """(N, C, H, W) -> (C*kh*kw, N*Ho*Wo) column matrix (see module docstring)."""
    return _backend(x)[0](x, kernel_size, stride, padding, dilation)


def col2im(col, x_shape, kernel_size, stride=1, padding=0, dilation=1):
    """(C*kh*kw, N*Ho*Wo) -> (N, C, H, W): the sum of every column entry into
    the pixel it came from (the adjoint of ``im2col``)."""
    return _backend(col)[1](col, tuple(x_shape), kernel_size, stride, padding, dilation)


def winograd(x, kernel_size, stride, dilation):
    """The ``commrt.kernels.winograd`` module when it computes this convolution
    (3x3 kernel, stride 1, dilation 1, a NumPy float array, Numba and SciPy
    installed), else None: the caller then lowers to im2col."""
    if not (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64)
            and tuple(kernel_size) == (3, 3) and tuple(stride) == (1, 1)
            and tuple(dilation) == (1, 1)):
        return None
    try:
        from commrt.kernels import winograd as module
    except ImportError:                  # no Numba, or no SciPy (Numba's BLAS)
        return None
    return module


def chunked(x):
    """The ``commrt.kernels.conv_chunked`` module when it computes this
    convolution (a NumPy float array, Numba installed, one Numba thread,
    COMMRT_CONV_CHUNK_BYTES not 0), else None: the caller then lowers the
    whole batch to one column matrix.  The chunks run on the calling thread;
    with more threads, the whole batch's products and col2im spread over
    them instead."""
    if not (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64)):
        return None
    from commrt import config
    if config.get("COMMRT_CONV_CHUNK_BYTES") <= 0:
        return None
    try:
        from commrt.kernels import conv_chunked as module
        from commrt.kernels._jit import numba
    except ImportError:                  # no Numba
        return None
    return module if numba.get_num_threads() == 1 else None
