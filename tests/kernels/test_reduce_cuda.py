"""Numba CUDA reduction kernels: under the CUDA simulator (no GPU needed), and
on a real GPU where one is (skipped, with the reason, elsewhere).

The simulator must be chosen before numba.cuda is first imported, so the
checks run in a fresh interpreter with NUMBA_ENABLE_CUDASIM set; it runs the
kernels' Python bodies thread by thread, hence the tiny arrays (a real GPU
also gets arrays of millions of elements, many blocks and a partial one).
"""
import os
import subprocess
import sys
import textwrap

import pytest

from commrt.testing import no_cuda_gpu

SCRIPT = textwrap.dedent(r'''
    import numpy as np
    import numba
    import os
    SIMULATED = os.environ["NUMBA_ENABLE_CUDASIM"] == "1"
    assert bool(numba.config.ENABLE_CUDASIM) == SIMULATED, "simulator setting not honoured"
    from numba import cuda
    from commrt.kernels import reduce_into, reduce_into_many, scale_into, cast_into
    from commrt.kernels import reduce_cuda

    rng = np.random.default_rng(0)
    ORACLE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
              "land": np.logical_and, "lor": np.logical_or, "band": np.bitwise_and,
              "bor": np.bitwise_or, "bxor": np.bitwise_xor}

    def sample(dt, n):
        dt = np.dtype(dt)
        if dt.kind == "b":
            return rng.integers(0, 2, n).astype(bool)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        x = (rng.standard_normal(n) * 50).astype(dt)
        if n > 4:
            x[1] = np.nan
        return x

    checked = 0
    for dt in (np.bool_, np.int8, np.uint16, np.int32, np.int64, np.uint64,
               np.float16, np.float32, np.float64):
        for op in ORACLE:
            if np.dtype(dt).kind == "f" and op in ("band", "bor", "bxor"):
                continue
            for n in (0, 1, 37) if SIMULATED else (0, 1, 37, 4099, 1 << 20):
                a, b = sample(dt, n), sample(dt, n)
                if dt is np.float16 and op in ("sum", "prod"):
                    want = ORACLE[op](a.astype(np.float32), b.astype(np.float32)).astype(dt)
                else:
                    with np.errstate(all="ignore"):
                        want = ORACLE[op](a, b).astype(dt)
                d, s = cuda.to_device(a), cuda.to_device(b)
                assert type(d).__module__.startswith("numba")
                with np.errstate(all="ignore"):
                    reduce_into(d, s, op)
                np.testing.assert_array_equal(d.copy_to_host(), want, err_msg=f"{op} {dt} {n}")
                checked += 1

    # a 0.0/-0.0 tie gives the right operand, as np.minimum/np.maximum do
    ta = np.array([-0.0, 0.0, np.nan, 1.0], np.float32)
    tb = np.array([0.0, -0.0, 2.0, np.nan], np.float32)
    for op in ("min", "max"):
        d = cuda.to_device(ta.copy())
        reduce_into(d, cuda.to_device(tb), op)
        np.testing.assert_array_equal(d.copy_to_host().view(np.uint32),
                                      ORACLE[op](ta, tb).view(np.uint32), err_msg=f"tie {op}")

    # one kernel per (op, dtype), built once
    k1 = reduce_cuda.reduce_kernel("sum", np.dtype(np.float32).str)
    assert k1 is reduce_cuda.reduce_kernel("sum", np.dtype(np.float32).str)
    assert k1 is not reduce_cuda.reduce_kernel("sum", np.dtype(np.float64).str)

    # float16 accumulates in float32 across sources
    d = cuda.to_device(np.array([2048.0], np.float16))
    ones = [cuda.to_device(np.array([1.0], np.float16)) for _ in range(2)]
    reduce_into_many(d, ones, "sum")
    assert d.copy_to_host()[0] == 2050.0, d.copy_to_host()

    # partial blocks and the grid-stride loop: more elements than one grid covers
    reduce_cuda.MAX_BLOCKS = 1
    a = np.arange(600, dtype=np.int32)
    d = cuda.to_device(a)
    reduce_into(d, cuda.to_device(a), "sum")
    np.testing.assert_array_equal(d.copy_to_host(), 2 * a)

    x = cuda.to_device(np.array([7, -7], np.int32))
    scale_into(x, 2)
    np.testing.assert_array_equal(x.copy_to_host(), [3, -4])
    y = cuda.to_device(np.array([3.0], np.float16))
    scale_into(y, 4)
    assert y.copy_to_host()[0] == 0.75
    z = cuda.to_device(np.zeros(3, np.float16))
    cast_into(z, cuda.to_device(np.array([1.0, 2.5, 3.0], np.float32)))
    np.testing.assert_array_equal(z.copy_to_host(), np.array([1.0, 2.5, 3.0], np.float16))
    print("CHECKED", checked)
''')


def _run(simulated):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1" if simulated else "0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=110 if simulated else 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CHECKED" in proc.stdout
    return int(proc.stdout.split("CHECKED")[1])


def test_cuda_kernels_under_simulator():
    assert _run(simulated=True) > 150


@pytest.mark.timeout(400)
@pytest.mark.skipif(no_cuda_gpu() is not None, reason=str(no_cuda_gpu()))
def test_cuda_kernels_on_the_gpu():
    assert _run(simulated=False) > 250
