"""More of Horovod's test/parallel/test_torch.py CPU behaviours on commrt (the rest are
in test_horovod_api.py; docs/horovod.md maps each of Horovod's tests to ours).  Each
rank function returns the checks that failed on its rank."""
import pytest

import conformance_ranks as C

CASES = [C.product_per_dtype, C.fused_async_of_every_kind, C.duplicate_names_of_every_kind,
         C.type_and_shape_errors, C.reducescatter_variants, C.on_process_sets,
         C.gradients_by_value, C.broadcast_state_every_optimizer, C.backward_passes_errors,
         C.barriers_between_collectives, C.allgather_every_dtype_uneven]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_horovod_behaviour(world3, case):
    failed = world3.run(case, timeout=120)
    assert failed == [[]] * 3, failed
