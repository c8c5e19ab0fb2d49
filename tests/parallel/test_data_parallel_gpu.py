"""Data parallel on a GPU: a CuPy model's gradients are averaged through host
memory and land back on its device, ending where one process on the whole
batch does.  Runs where a CUDA GPU is (skipped, with the reason, elsewhere)."""
import numpy as np
import pytest

import dp_ranks
from commrt.testing import World, no_cuda_gpu

pytestmark = pytest.mark.skipif(no_cuda_gpu() is not None, reason=str(no_cuda_gpu()))

STEPS, BATCH = 4, 12


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_two_gpu_ranks_end_where_one_cpu_process_does(kind):
    want = dp_ranks.reference(STEPS, BATCH, kind)
    with World(2, transport="shm", env={"NUMBA_ENABLE_CUDASIM": "0"}, timeout=240) as w:
        got = w.run(dp_ranks.equivalence, 2, STEPS, BATCH, kind, 2048, 1, True, "cuda",
                    timeout=200)
    start = [p.data for p in dp_ranks.small_model(0).parameters()]
    for params in got:
        assert len(params) == len(want)
        for i, (g, w_) in enumerate(zip(params, want)):
            # float64; cuBLAS and the CPU's BLAS round differently
            np.testing.assert_allclose(g, w_, rtol=1e-8, atol=1e-10, err_msg=f"parameter {i}")
    assert max(np.abs(a - b).max() for a, b in zip(got[0], start)) > 1e-3
