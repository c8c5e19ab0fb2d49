"""Bad input gets a clear error and moves nothing: pointer buffers, bad timeouts,
ranks out of range; and mixed C/Fortran layouts give the right result."""
import numpy as np
import pytest

from commrt.testing import World

import comm_ranks as R


@pytest.fixture(scope="module", params=["shm", "tcp"])
def world2(request):
    with World(2, transport=request.param, timeout=60) as w:
        yield w


def test_pointer_buffers_are_refused_on_send_and_receive(world2):
    for out, price, nbytes in world2.run(R.pointer_buffers_are_refused, timeout=50):
        for (name, op), what in out.items():
            assert "holds pointers" in what, (name, op, what)
        assert price == 1 and nbytes == 8


def test_bad_timeouts_and_ranks_raise_value_error(world2):
    for out in world2.run(R.bad_numbers, timeout=50):
        assert set(out.values()) == {"ValueError"}, out


@pytest.mark.parametrize("kind", ["all_reduce", "broadcast", "all_gather"])
def test_c_and_fortran_arrays_mix_in_collectives(kind):
    with World(3, timeout=60) as w:
        res = w.run(R.mixed_orders, kind, timeout=50)
    base = np.arange(15, dtype=np.float64).reshape(3, 5)
    if kind == "all_reduce":
        expect = (base * 6).tolist()
    elif kind == "broadcast":
        expect = (base * 2).tolist()
    else:
        expect = [(base * (q + 1)).tolist() for q in range(3)]
    for r in res:
        assert r == expect
