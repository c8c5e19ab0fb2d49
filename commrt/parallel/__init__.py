"""commrt.parallel: distributed training on the public Communicator API.

Data parallel (DistributedOptimizer, broadcast_parameters,
broadcast_optimizer_state, DistributedSampler), asynchronous SGD with a
parameter server, model parallel (differentiable send/recv), pipeline
parallel (GPipe, 1F1B, PipeDream) and the timeline.  Names load lazily.
"""
from commrt import _lazy

_LAZY = {}


def _export(module, *names):
    for name in names:
        _LAZY[name] = module


__getattr__, __dir__ = _lazy.attributes('commrt.parallel', _LAZY, globals())


# Each engineer adds the names of their module here, one line each.
_export("commrt.parallel.data_parallel", "DistributedOptimizer", "broadcast_parameters",
        "broadcast_optimizer_state")
_export("commrt.parallel.sampler", "DistributedSampler")
_export("commrt.parallel.param_server", "ParameterServer", "AsyncWorker", "run_async_sgd")
_export("commrt.parallel.model_parallel", "send_forward", "recv_forward", "wait_sends", "Stage",
        "split_layers", "train_model_parallel")
_export("commrt.parallel.pipeline", "Pipeline", "GPipeSchedule", "OneFOneBSchedule",
        "PipeDreamSchedule", "train_pipeline", "train_hybrid", "model_layers")
_export("commrt.parallel.timeline", "Timeline", "span")
