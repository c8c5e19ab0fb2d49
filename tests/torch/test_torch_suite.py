"""torch's own generic backend suite (torch/testing/_internal/distributed/distributed_test.py)
run against commrt, as third-party backends (torch_ucc) run it against themselves.

    pytest tests/torch/test_torch_suite.py                       # the CI subset (CURATED)
    COMMRT_TORCH_FULL=1 pytest tests/torch/test_torch_suite.py   # the whole suite
    COMMRT_TORCH_SUITE_BACKEND=gloo ...                          # the same, on gloo
    COMMRT_TORCH_SUITE_WORLD=3 ...                               # world size (default 2)

commrt declares its features before the suite is imported (DistTestCases:
ddp, subgroup, plugin; not gpu/cuda, which this CPU build of torch lacks).
Many tests are gated on the backend's name (``BACKEND == "gloo"``, 259 gates):
by default (COMMRT_TORCH_SUITE_GATES=gloo) the suite evaluates them as for
gloo, and every process group it asks of gloo is made on commrt, so commrt
runs exactly the tests gloo runs (a test that compares dist.get_backend()
with "gloo" then fails by name; docs/torch.md lists those).
Every test spawns WORLD processes that init_process_group(BACKEND, file://);
docs/torch.md has the table of passed / skipped / failed beside gloo.
"""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

from commrt import config  # noqa: E402

RUN = config.get("COMMRT_TORCH_SUITE_BACKEND")          # the backend the tests run on
GATES = config.get("COMMRT_TORCH_SUITE_GATES") if RUN == "commrt" else RUN
os.environ["BACKEND"] = GATES                           # what the suite's gates read
os.environ.setdefault("WORLD_SIZE", str(config.get("COMMRT_TORCH_SUITE_WORLD")))
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="commrt-torch-suite-")

import commrt.torch  # noqa: E402,F401  (registers "commrt" in every spawned rank too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add("commrt")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


def _swap(fn):
    """fn with backend GATES (as the suite spells it) replaced by RUN."""
    def wrapper(*args, **kwargs):
        if kwargs.get("backend") == GATES:
            kwargs["backend"] = RUN
        elif args and args[0] == GATES and fn.__name__ == "init_process_group":
            args = (RUN,) + args[1:]
        return fn(*args, **kwargs)
    wrapper.__name__ = fn.__name__
    return wrapper


if GATES != RUN:
    # commrt runs the tests gated for gloo: the suite evaluates its gates with
    # "gloo" and every process group it asks of gloo is made on commrt.
    import torch.distributed as dist  # noqa: E402

    for _f in ("init_process_group", "new_group", "new_subgroups",
               "new_subgroups_by_enumeration"):
        setattr(dist, _f, _swap(getattr(dist, _f)))

FULL = config.get("COMMRT_TORCH_FULL")
START = config.get("COMMRT_TORCH_SUITE_START")

# The CI subset: one or two tests per operation family (~14 s each here).
CURATED = {
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max",
    "test_all_reduce_coalesced_sum", "test_broadcast", "test_reduce_sum", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_gather", "test_scatter",
    "test_all_to_all_single_unequal_split", "test_send_recv", "test_send_recv_any_source",
    "test_batch_isend_irecv_gloo", "test_barrier", "test_all_gather_object_default_pg",
    "test_broadcast_object_list", "test_new_subgroups_by_enumeration",
    "test_sparse_all_reduce_sum", "test_DistributedDataParallel_requires_grad",
    "test_ddp_hook_parity_powerSGD",
}


class TestCommrtSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:  # fork or forkserver: the ranks inherit (or share) the imported suite
            self._start_processes(torch.multiprocessing.get_context(START).Process)
