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


COLLECTIVES = ["broadcast", "reduce", "all_reduce", "gather", "scatter", "all_gather",
               "reduce_scatter", "all_gatherv", "gatherv", "scatterv"]


@pytest.mark.parametrize("what", R.BAD_BUFFERS)
def test_a_buffer_refused_on_one_rank_can_be_passed_again(what):
    """Every collective: a bad buffer on rank 1 (read-only where it writes into it,
    non-contiguous, object dtype) raises on rank 1 before the
    collective takes its number, so the others wait in it and rank 1's call
    with a good buffer completes it, with the right result everywhere."""
    with World(3, transport="shm", timeout=60) as w:
        res = w.run(R.refused_on_one_rank_then_retried, COLLECTIVES, what, timeout=50)
    sums = {"reduce": [192.0, 64.0, 64.0], "all_reduce": [192.0] * 3,
            "reduce_scatter": [192.0] * 3}
    for i, kind in enumerate(COLLECTIVES):
        err = res[1][i][0]
        only_sends = kind in ("reduce", "gather", "all_gather", "gatherv", "all_gatherv")
        if not (only_sends and what == "read-only"):    # rank 1 only sends from buf there
            assert err is not None and err[0] in ("TypeError", "ValueError"), (kind, err)
            assert ("read-only" if what == "read-only" else
                    "contiguous" if what == "non-contiguous" else "pointers") in err[1], (kind, err)
        assert [res[r][i][1] for r in range(3)] == sums.get(kind, [64.0] * 3), (kind, what)


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
