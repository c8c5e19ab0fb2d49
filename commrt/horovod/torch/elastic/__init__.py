"""hvd.elastic for PyTorch: run, TorchState, ElasticSampler (see commrt.horovod.elastic)."""
from commrt.horovod.elastic import ObjectState, State, run_fn  # noqa: F401
from commrt.horovod.torch.elastic.sampler import ElasticSampler
from commrt.horovod.torch.elastic.state import TorchState


def run(func):
    """Decorate a training function of (state, ...) so that it survives failures."""
    return run_fn(func, _reset)


def _reset():
    from commrt.horovod import _runtime

    _runtime.shutdown()
    _runtime.init()


__all__ = ["TorchState", "ElasticSampler", "run", "ObjectState", "State"]
