"""torch tensors through commrt's own point-to-point and collectives (the one buffer
function and the tensor adapter), every dtype torch uses on the CPU."""
import pytest

pytest.importorskip("torch")

from commrt.testing import World  # noqa: E402

import tensor_ranks as R  # noqa: E402


@pytest.fixture(scope="module", params=[2, 3])
def world(request):
    with World(request.param, transport="shm", timeout=120) as w:
        yield w


@pytest.mark.parametrize("n", [1, 1000, 70_001])
def test_all_reduce_every_dtype_in_place(world, n):
    for res in world.run(R.all_reduce_dtypes, n):
        for dtype, (returned_self, same_memory, right) in res.items():
            assert returned_self and same_memory and right, dtype


def test_bfloat16_agrees_with_torch_and_across_ranks(world):
    for same, ref in world.run(R.bfloat16_bits):
        assert same
        assert ref in (None, True)


def test_non_contiguous_tensors_get_the_right_answer(world):
    assert all(r == (True, True) for r in world.run(R.non_contiguous))


def test_zero_elements(world):
    assert world.run(R.zero_elements) == [0] * world.size


def test_point_to_point(world):
    res = world.run(R.p2p)
    assert res[1] == (16, True, True, True)


def test_numpy_bfloat16_arrays(world):
    assert world.run(R.bf16_numpy) == [0.5 + world.size] * world.size


def test_unsupported_dtype_is_a_clear_error(world):
    for msg in world.run(R.unsupported):
        assert msg and "float8_e4m3fn" in msg
