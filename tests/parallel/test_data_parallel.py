"""Data parallel: N ranks on B/N samples each end where one process on B does
(float64, exact up to rounding), buckets start during backward in the same
order everywhere, missing gradients are zero-filled, fp16 halves the bytes,
local accumulation, and clear errors."""
import numpy as np
import pytest

import dp_ranks

STEPS, BATCH = 4, 12       # 12 splits evenly over 1, 2, 3 and 4 ranks


def assert_params_equal(got, want, rtol=1e-10, atol=1e-12):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"parameter {i}")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_n_ranks_equal_one_process_on_the_whole_batch(world4, n, kind):
    want = dp_ranks.reference(STEPS, BATCH, kind)
    results = world4.run(dp_ranks.equivalence, n, STEPS, BATCH, kind, 2048, timeout=90)
    for rank in range(n):
        assert_params_equal(results[rank], want)
    assert all(r is None for r in results[n:])
    # and training moved them: the comparison is not of two untouched models
    start = [p.data for p in dp_ranks.small_model(0).parameters()]
    assert max(np.abs(a - b).max() for a, b in zip(results[0], start)) > 1e-3


def test_equivalence_without_overlap(world4):
    want = dp_ranks.reference(STEPS, BATCH, "sgd")
    results = world4.run(dp_ranks.equivalence, 4, STEPS, BATCH, "sgd", 2048, 1, False, timeout=90)
    for r in results:
        assert_params_equal(r, want)


def test_backward_passes_per_step_accumulates_locally(world4):
    want = dp_ranks.reference(STEPS, BATCH, "sgd", passes=3)
    results = world4.run(dp_ranks.equivalence, 2, STEPS, BATCH, "sgd", 2048, 3, timeout=90)
    assert_params_equal(results[0], want)
    assert_params_equal(results[1], want)
    msgs = world4.run(dp_ranks.too_many_passes, timeout=60)
    assert all(m and "backward_passes_per_step=2" in m and "3 times" in m for m in msgs), msgs


def test_broadcast_parameters_copies_root(world4):
    results = world4.run(dp_ranks.broadcast_start, timeout=60)
    root = [p.data for p in dp_ranks.small_model(seed=103).parameters()]
    for r in results:
        assert_params_equal(r, root, rtol=0, atol=0)


def test_buckets_are_reverse_registration_order_and_start_during_backward(world4):
    results = world4.run(dp_ranks.bucket_layout, 2048, True, timeout=60)
    layout, nbytes, logs, names = results[0]
    assert all(r[0] == layout for r in results)                     # same buckets everywhere
    assert [n for bucket in layout for n in bucket] == names[::-1]  # reverse registration order
    assert len(layout) >= 3
    for bucket, size in zip(layout[:-1], nbytes[:-1]):              # each bucket ~bucket_bytes
        assert size >= 2048 or len(bucket) == 1
    last = len(layout) - 1
    for _, _, rank_logs, _ in results:
        for during, total in rank_logs:
            # every bucket but the last started inside backward, in bucket order, before
            # step() was called; the last one (the first layers: nothing left to overlap)
            # starts in step()
            assert during == [(i, "backward") for i in range(last)]
            assert total == during + [(last, "step")]


def test_overlap_off_starts_everything_in_step(world4):
    results = world4.run(dp_ranks.bucket_layout, 2048, False, timeout=60)
    layout = results[0][0]
    for _, _, rank_logs, _ in results:
        for during, total in rank_logs:
            assert during == []
            assert total == [(i, "step") for i in range(len(layout))]


def test_averaged_grads_are_bucket_views_and_step_buckets_run_on_the_caller(world4):
    # overlap off: every all-reduce starts in step() with nothing in flight, so each
    # runs on the calling thread and the collectives thread is never started
    for views, right, worker in world4.run(dp_ranks.grads_as_views, False, timeout=60):
        assert views and right and not worker
    for views, right, worker in world4.run(dp_ranks.grads_as_views, True, timeout=60):
        assert views and right and worker


@pytest.mark.parametrize("bucket_bytes", [64, 1 << 20])
def test_missing_gradients_are_zero_filled(world4, bucket_bytes):
    results = world4.run(dp_ranks.missing_grads, bucket_bytes, timeout=60)
    locals_ = [r[0] for r in results]
    for local, averaged, after in results:
        for name in ("trunk.weight", "head_a.bias"):
            np.testing.assert_allclose(averaged[name],
                                       sum(lo[name] for lo in locals_) / 4, rtol=1e-12)
        # only rank 1 had head_b's gradient: the others contributed zeros
        assert locals_[0]["head_b.weight"] is None and locals_[1]["head_b.weight"] is not None
        np.testing.assert_allclose(averaged["head_b.weight"], locals_[1]["head_b.weight"] / 4,
                                   rtol=1e-12)
        # nobody used `unused`: it keeps no gradient and weight decay leaves it alone
        assert averaged["unused.weight"] is None and averaged["unused.bias"] is None
        np.testing.assert_array_equal(after["unused.weight"], dp_ranks.Branches().unused.weight.data)
        for name in after:                                       # the ranks did not diverge
            np.testing.assert_array_equal(after[name], results[0][2][name])


def test_fp16_compression_halves_the_bytes(world4):
    plain = world4.run(dp_ranks.compressed, None, timeout=60)
    half = world4.run(dp_ranks.compressed, "fp16", timeout=60)
    exact = [sum(np.asarray(r[0][i], np.float64) for r in plain) / 4 for i in range(len(plain[0][0]))]
    for _, avg, _ in plain:
        for a, e in zip(avg, exact):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)
    for _, avg, _ in half:
        for a, e in zip(avg, exact):
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, e, rtol=2e-3, atol=2e-3 * np.abs(e).max())
    for (_, _, b32), (_, _, b16) in zip(plain, half):
        assert 0.45 * b32 <= b16 <= 0.55 * b32, (b32, b16)


def test_mismatched_models_fail_at_broadcast_with_a_clear_error(world4):
    messages = world4.run(dp_ranks.mismatched, timeout=60)
    for m in messages:          # every rank raises, none hangs
        assert m is not None
        assert "classifier.0.weight" in m and "rank 1" in m
        assert "(24, 32)" in m and "(16, 32)" in m


def test_broadcast_optimizer_state(world4):
    states = world4.run(dp_ranks.optimizer_state, timeout=60)
    assert states[0] and states[0][0]["exp_avg"].any() and states[0][0]["step"] == 1
    for st in states[1:]:
        assert st.keys() == states[0].keys()
        for i in st:
            for k in st[i]:
                np.testing.assert_array_equal(st[i][k], states[0][i][k])


def test_wrapper_errors_and_delegation():
    from commrt import optim
    from commrt.parallel import DistributedOptimizer

    class Solo:
        rank, size = 0, 1
    model = dp_ranks.small_model(0)
    inner = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="compression"):
        DistributedOptimizer(inner, Solo(), compression="int8")
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        DistributedOptimizer(inner, Solo(), backward_passes_per_step=0)
    opt = DistributedOptimizer(inner, Solo())
    assert opt.param_groups is inner.param_groups and "SGD" in repr(opt)
    with pytest.raises(TypeError, match="already distributed"):
        DistributedOptimizer(opt, Solo())
