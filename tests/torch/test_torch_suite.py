"""torch's own generic backend suite (torch/testing/_internal/distributed/distributed_test.py)
run against commrt, as third-party backends (torch_ucc) run it against themselves.

    pytest tests/torch/test_torch_suite.py                       # the CI subset (CURATED)
    COMMRT_TORCH_FULL=1 pytest tests/torch/test_torch_suite.py   # the whole suite
    COMMRT_TORCH_SUITE_BACKEND=gloo ...                          # the same, on gloo
    COMMRT_TORCH_SUITE_WORLD=3 ...                               # world size (default 2)

commrt declares its features before the suite is imported (DistTestCases:
ddp, subgroup, plugin; not gpu/cuda, which this CPU build of torch lacks).
Every test spawns WORLD processes that init_process_group(BACKEND, file://);
docs/torch.md has the table of passed / skipped / failed beside gloo.
"""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

from commrt import config  # noqa: E402

os.environ["BACKEND"] = config.get("COMMRT_TORCH_SUITE_BACKEND")
os.environ.setdefault("WORLD_SIZE", str(config.get("COMMRT_TORCH_SUITE_WORLD")))
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="commrt-torch-suite-")

import commrt.torch  # noqa: E402,F401  (registers "commrt" in every spawned rank too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add("commrt")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

FULL = config.get("COMMRT_TORCH_FULL")

# The CI subset: one or two tests per operation family (~14 s each here).
CURATED = {
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max",
    "test_all_reduce_coalesced_sum", "test_broadcast", "test_reduce_sum", "test_all_gather",
    "test_all_gather_into_cat_tensor_cuda", "test_gather", "test_scatter",
    "test_reduce_scatter_tensor_cpu", "test_all_to_all", "test_all_to_all_single_unequal_split",
    "test_send_recv", "test_send_recv_any_source", "test_batch_isend_irecv_gloo",
    "test_barrier", "test_all_gather_object_default_pg", "test_new_subgroups",
    "test_sparse_all_reduce_sum", "test_DistributedDataParallel_requires_grad",
}


class TestCommrtSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
