"""Horovod's PyTorch API on commrt: ``import commrt.horovod.torch as hvd``.

The names and semantics of horovod.torch 0.28 (see docs/horovod.md):
operations are matched across ranks by name through a background
coordinator with a response cache and tensor fusion; the build queries
answer as a CPU build of Horovod with Gloo would.
"""
from commrt.horovod import _runtime
from commrt.horovod.errors import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from commrt.horovod.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                         global_process_set, remove_process_set)
from commrt.horovod.torch.compression import Compression  # noqa: F401
from commrt.horovod.torch.mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
    allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
    broadcast_, broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
    grouped_reducescatter, grouped_reducescatter_async, join, poll, reducescatter,
    rank, reducescatter_async, size, sparse_allreduce_async, synchronize)


def init(comm=None, process_sets=None):
    """Start Horovod: comm is a commrt Communicator, a list of world ranks, or None
    (the job commrt-launch, torchrun, mpirun or srun started)."""
    from commrt.horovod.torch import mpi_ops

    mpi_ops._handle_map.clear()
    _runtime.init(comm, process_sets)


def shutdown():
    """Stop Horovod on this rank; init() may be called again afterwards."""
    _runtime.shutdown()


is_initialized = _runtime.is_initialized
start_timeline = _runtime.start_timeline
stop_timeline = _runtime.stop_timeline


def local_size():
    return _runtime.current().local_size


def local_rank():
    return _runtime.current().local_rank


def cross_size():
    return _runtime.current().cross_size


def cross_rank():
    return _runtime.current().cross_rank


def is_homogeneous():
    return _runtime.current().homogeneous


# the build queries of a CPU build with Gloo
def gloo_built():
    return True


def gloo_enabled():
    return _runtime.is_initialized()


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


from commrt.horovod.torch.functions import (allgather_object, broadcast_object,  # noqa: E402,F401
                                            broadcast_optimizer_state, broadcast_parameters)
from commrt.horovod.torch.optimizer import DistributedOptimizer  # noqa: E402,F401
from commrt.horovod.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402,F401
from commrt.horovod.torch import elastic  # noqa: E402,F401
