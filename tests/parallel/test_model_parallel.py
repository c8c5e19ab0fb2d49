"""Model parallel: differentiable send/recv; a split ResNet is the unsplit one, bit for bit."""
import numpy as np
import pytest

from commrt import nn
from commrt.parallel import model_parallel as mp
from commrt.testing import World

import mp_ranks


@pytest.fixture(scope="module")
def world2():
    with World(2, transport="shm", env={"OPENBLAS_NUM_THREADS": "1"}, timeout=120) as w:
        yield w


@pytest.fixture(scope="module")
def world3():
    with World(3, transport="shm", env={"OPENBLAS_NUM_THREADS": "1"}, timeout=120) as w:
        yield w


def _check_identical(results, size):
    last = results[-1] if len(results) == size else None
    for r in results:
        assert r["mismatched"] == [], r["mismatched"]
        assert r["checked"] > 0
    losses = [r["loss"] for r in results if r["loss"] is not None]
    assert losses == [results[0]["ref_loss"]]          # exactly the unsplit loss
    return last


def test_split_resnet_two_ranks_same_loss_and_gradients(world2):
    res = world2.run(mp_ranks.split_resnet_grads, timeout=100)
    _check_identical(res, 2)
    # together the ranks checked every parameter of the model
    assert sum(r["checked"] for r in res) == len(mp_ranks.resnet().parameters())


def test_split_resnet_three_ranks(world3):
    res = world3.run(mp_ranks.split_resnet_grads, timeout=100)
    _check_identical(res, 3)
    assert sum(r["checked"] for r in res) == len(mp_ranks.resnet().parameters())


def test_stages_wrap_around_ranks_through_the_delegate(world2):
    """Four stages on two ranks: each rank sends, receives back and sends
    again; one backward() per rank runs its two stages in order."""
    res = world2.run(mp_ranks.split_resnet_grads, 2, timeout=100)
    _check_identical(res, 2)
    assert [r["stages"] for r in res] == [[0, 2], [1, 3]]
    assert sum(r["checked"] for r in res) == len(mp_ranks.resnet().parameters())


def test_no_grad_and_non_float_tensors_send_nothing_back(world2):
    res = world2.run(mp_ranks.no_grad_and_ints, timeout=60)[1]
    assert res["a"] == (np.arange(12.0).reshape(3, 4).tolist(), False)
    assert res["b"] == ("<i4", [[0, 1, 2], [3, 4, 5]], False)
    assert res["c"] == ((0, 3), "<f4", False)


def test_partition_minimises_the_largest_stage():
    assert mp.partition([1, 1, 1, 1], 2) == [0, 2, 4]
    assert mp.partition([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert mp.partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [0, 5, 7, 9]   # 15, 13, 17
    b = mp.partition([3, 1, 4, 1, 5, 9, 2, 6], 4)
    sums = [sum([3, 1, 4, 1, 5, 9, 2, 6][b[i]:b[i + 1]]) for i in range(4)]
    assert max(sums) == 9 and len(sums) == 4 and all(s > 0 for s in sums)
    with pytest.raises(ValueError, match="cannot split 2 layers into 3"):
        mp.partition([1, 1], 3)


def test_split_layers_compose_to_the_model():
    model = mp_ranks.resnet()
    x, _ = mp_ranks.batch()
    full = model(nn.Tensor(x)).data
    h = nn.Tensor(x)
    for stage in mp.split_layers(mp.resnet_layers(model), 3):
        h = stage(h)
    assert np.array_equal(h.data, full)


def test_bad_tag_is_rejected():
    with pytest.raises(ValueError, match="tag must be >= 0"):
        mp.send_forward(nn.Tensor(np.ones(2)), None, 1, tag=-1)
