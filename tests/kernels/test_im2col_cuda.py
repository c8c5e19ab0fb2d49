"""The Numba CUDA im2col/col2im kernels under the CUDA simulator, and on a real
GPU where one is (skipped, with the reason, elsewhere).

The simulator must be chosen before numba.cuda is first imported, so the
checks run in a fresh interpreter with NUMBA_ENABLE_CUDASIM set (tiny shapes
under the simulator, which runs every thread in Python; a real GPU also gets a
batch the size of a training step's)."""
import os
import subprocess
import sys
import textwrap

import pytest

from commrt.testing import no_cuda_gpu

CHECK = textwrap.dedent("""
    import numpy as np
    import numba
    import os
    SIMULATED = os.environ["NUMBA_ENABLE_CUDASIM"] == "1"
    assert bool(numba.config.ENABLE_CUDASIM) == SIMULATED, "simulator setting not honoured"
    from commrt.kernels import im2col_cuda
    from commrt.kernels.im2col_numpy import col2im_numpy, im2col_numpy
    from numba import cuda
    rng = np.random.default_rng(0)
    cases = [((1, 2, 4, 3), 3, 1, 1, 1), ((2, 1, 5, 5), (2, 3), (2, 1), (1, 0), (1, 2)),
             ((1, 1, 1, 1), 3, 1, 1, 1)]
    if not SIMULATED:
        cases += [((32, 16, 28, 28), 3, 1, 1, 1), ((8, 3, 33, 17), (5, 3), (2, 3), (2, 1), (1, 2))]
    for shape, k, s, p, d in cases:
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal(shape).astype(dtype)
            col = im2col_cuda.im2col(x, k, s, p, d)
            np.testing.assert_array_equal(col, im2col_numpy(x, k, s, p, d))
            g = rng.standard_normal(col.shape).astype(dtype)
            np.testing.assert_allclose(im2col_cuda.col2im(g, shape, k, s, p, d),
                                       col2im_numpy(g, shape, k, s, p, d),
                                       rtol=1e-6 if SIMULATED else 1e-5,
                                       atol=0 if SIMULATED else 1e-5)
    # device arrays stay on the device, and the dispatcher routes them here
    from commrt.kernels.conv import im2col
    x = rng.standard_normal((1, 1, 3, 3))
    d_col = im2col(cuda.to_device(x), 2)
    assert not isinstance(d_col, np.ndarray) and hasattr(d_col, "copy_to_host")
    np.testing.assert_array_equal(d_col.copy_to_host(), im2col_numpy(x, 2))
    assert im2col_cuda.im2col(np.zeros((0, 1, 3, 3)), 2).shape == (4, 0)
    print("ok")
""")


def _run(simulated):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1" if simulated else "0")
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                            text=True, timeout=100 if simulated else 300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_cuda_kernels_under_simulator():
    _run(simulated=True)


@pytest.mark.timeout(400)
@pytest.mark.skipif(no_cuda_gpu() is not None, reason=str(no_cuda_gpu()))
def test_cuda_kernels_on_the_gpu():
    _run(simulated=False)
