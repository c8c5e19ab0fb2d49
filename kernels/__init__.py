"""commrt.kernels: compute kernels that know nothing of communication.

Reductions (collectives call them) and im2col/col2im (the engine's
convolution), each as a NumPy reference, Numba CPU, Numba CUDA and CuPy
twin, chosen by the array's type; and C combine loops (``_combine.pyx``)
whose addresses a caller in C can call between messages (the small
all-reduce's exchange chain).  Names load lazily so that ``import
commrt`` never pays for Numba.
"""
from commrt import _lazy

_LAZY = {
    # reductions
    "reduce_into": "commrt.kernels.reduce",
    "reduce_into_many": "commrt.kernels.reduce",
    "reference_reduce_into": "commrt.kernels.reduce",
    "scale_into": "commrt.kernels.reduce",
    "cast_into": "commrt.kernels.reduce",
    "combine_address": "commrt.kernels._combine",
    "combine_into": "commrt.kernels._combine",
    "f16_scale": "commrt.kernels._combine",
    # convolution lowering
    "im2col": "commrt.kernels.conv",
    "col2im": "commrt.kernels.conv",
}


__getattr__, __dir__ = _lazy.attributes('commrt.kernels', _LAZY, globals())
