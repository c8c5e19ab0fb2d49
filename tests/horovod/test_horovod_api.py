"""horovod.torch's behaviours (as Horovod's test/parallel/test_torch.py checks them)
on commrt, over a real 3-rank world."""
import json

import pytest

import hvd_ranks


def test_basics_and_reinit(world3):
    out = world3.run(hvd_ranks.basics, timeout=60)
    assert [o["rank"] for o in out] == [0, 1, 2] and {o["size"] for o in out} == {3}
    assert [o["local_rank"] for o in out] == [0, 1, 0]
    assert [o["local_size"] for o in out] == [2, 2, 1]
    assert [o["cross_rank"] for o in out] == [0, 0, 1]     # among ranks of one local rank
    assert [o["cross_size"] for o in out] == [2, 1, 2]
    assert not any(o["homogeneous"] for o in out)
    assert all(o["initialized"] and not o["after"] for o in out)
    assert {o["gloo"] for o in out} == {(True, True)}
    assert {o["others"] for o in out} == {(False, False, False, False)}
    assert all(o["again"] == [3.0, 3.0] for o in out)


def test_allreduce_dtypes_ops_scaling_async(world3):
    assert world3.run(hvd_ranks.allreduce_ops, timeout=90) == [3.0] * 3


def test_grouped_ops(world3):
    assert world3.run(hvd_ranks.grouped_ops, timeout=60) == [True] * 3


def test_ops_match_by_name_not_order_and_duplicate_names_raise(world3):
    assert world3.run(hvd_ranks.order_and_names, timeout=60) == [True] * 3


def test_poll_is_false_while_in_flight(world3):
    out = world3.run(hvd_ranks.real_async, timeout=60)
    assert out[0] == (False, 3000.0) or out[0][0] is False
    assert [o[1] for o in out] == [3.0] * 3


def test_a_waiting_caller_is_not_held_a_cycle(world3):
    # without the rounds back to back while a caller waits, the ranks waiting for
    # "z" slept out the 20 s cycle after the round that finished "b"
    spent = world3.run(hvd_ranks.waiting_caller_gets_rounds_at_once, timeout=60)
    assert all(s < 10 for s in spent), spent


def test_response_cache_skips_negotiation_and_fusion_packs_tensors(world3):
    steps, max_fused, cached = zip(*world3.run(hvd_ranks.cache_and_fusion, 64 << 20, timeout=60))
    for per_step in steps:
        assert per_step[0] >= 1                   # the first step negotiates
        assert per_step[1:] == [0, 0, 0], per_step  # later steps hit the cache only
    assert min(cached) >= 3 * 12
    assert min(max_fused) > 1                      # some buffer held several tensors
    steps, max_fused, _ = zip(*world3.run(hvd_ranks.cache_and_fusion, 0, timeout=60))
    assert set(max_fused) == {1}                   # threshold 0: fusion off


def test_mismatches_raise_on_every_rank_and_the_job_goes_on(world3):
    out = world3.run(hvd_ranks.mismatches, timeout=60)
    for errors, ok in out:
        assert errors[:7] == ["HorovodMismatchError"] * 7, errors
        assert errors[7:11] == ["ValueError"] * 4, errors
        assert errors[11:] == ["HorovodMismatchError"], errors     # a cached name too
        assert ok is True


def test_allgather_broadcast_alltoall_reducescatter(world3):
    assert world3.run(hvd_ranks.gather_scatter, timeout=90) == [True] * 3


def test_gradients_of_the_blocking_ops(world3):
    assert world3.run(hvd_ranks.gradients, timeout=60) == [True] * 3


def test_join(world3):
    rets = world3.run(hvd_ranks.join_allreduce, timeout=90)
    assert rets[0] == rets[1] == rets[2]


def test_process_sets(world3):
    for out in world3.run(hvd_ranks.process_sets, timeout=60):
        assert out[:5] == (True, True, True, True, True), out
        assert out[5][:2] == (2, 1) and out[5][3] and not out[5][4]
        assert out[6] is True


def test_broadcast_parameters_optimizer_state_objects(world3):
    for same_params, same_lr, same_moments, lr, obj_rank, ranks in \
            world3.run(hvd_ranks.state_broadcasts, timeout=60):
        assert same_params and same_lr and same_moments
        assert lr == pytest.approx(0.2) and obj_rank == 1 and ranks == [0, 1, 2]


def test_fp16_compression(world3):
    assert world3.run(hvd_ranks.compression, timeout=60) == [(True, [3, 3, 3])] * 3


@pytest.mark.parametrize("kw,passes", [({}, 1), ({}, 2), ({"groups": 2}, 1),
                                       ({"groups": "list"}, 1), ({"fp16": True}, 1),
                                       ({"gradient_predivide_factor": 2.0}, 1)])
def test_distributed_optimizer_equals_one_process_on_the_whole_batch(world3, kw, passes):
    assert world3.run(hvd_ranks.optimizer, kw, passes, timeout=90) == [True] * 3


def test_distributed_optimizer_api_errors(world3):
    for errors in world3.run(hvd_ranks.optimizer_api, timeout=60):
        assert errors == ["zero_grad race"] + ["named_parameters"] * 3 + ["predivide"]


def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch(world3):
    assert world3.run(hvd_ranks.sync_batch_norm, timeout=60) == [(True,) * 5] * 3


def test_timeline(world3, tmp_path):
    path = tmp_path / "timeline.json"
    world3.run(hvd_ranks.timeline, str(path), timeout=60)
    text = path.read_text()
    events = json.loads(text)
    for needle in ("allreduce.test_allreduce", "start_time_since_epoch_in_micros",
                   "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "CYCLE_START"):
        assert needle in text, needle
    assert any(e.get("ph") == "B" for e in events)
    assert "allreduce.from_env" in (tmp_path / "timeline.json.env").read_text()


def test_optimizer_cases_of_horovods_suite(world3):
    for forced, n, clipped, warned, sparse_same, sparse_match in \
            world3.run(hvd_ranks.optimizer_cases, timeout=120):
        assert forced and n >= 8 and clipped and warned and sparse_same and sparse_match


def test_optimizer_on_a_process_set(world3):
    assert world3.run(hvd_ranks.optimizer_process_set, timeout=60) == [True] * 3


def test_one_rank_shutting_down_fails_the_others_operations(world3):
    assert world3.run(hvd_ranks.one_rank_shuts_down, timeout=60) == ["shut down"] * 3


def test_init_on_a_list_of_world_ranks(world3):
    assert world3.run(hvd_ranks.init_with_ranks, timeout=60) == [(0, 2, 2.0), "not a member",
                                                                  (1, 2, 2.0)]


def test_fused_buffers_of_odd_lengths_give_exact_results_for_every_op(world3):
    for max_fused, _ in world3.run(hvd_ranks.fused_odd_sizes, timeout=60):
        assert max_fused > 1                     # some buffers held several tensors


def test_distributed_optimizer_steady_steps_skip_negotiation(world3):
    for per_step, cached, max_fused in world3.run(hvd_ranks.optimizer_steady_steps, timeout=60):
        assert per_step[0] >= 1 and per_step[1:] == [0] * 4, per_step
        assert cached[1:] == [20] * 4, cached         # 10 weights + 10 biases, all cache hits
        assert max_fused > 1
