"""commrt.parallel: distributed training on the public Communicator API.

Data parallel (DistributedOptimizer, broadcast_parameters,
broadcast_optimizer_state, DistributedSampler), asynchronous SGD with a
parameter server, model parallel (differentiable send/recv), pipeline
parallel (GPipe, 1F1B, PipeDream) and the timeline.  Names load lazily.
"""
_LAZY = {}


def _export(module, *names):
    for name in names:
        _LAZY[name] = module


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'commrt.parallel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
