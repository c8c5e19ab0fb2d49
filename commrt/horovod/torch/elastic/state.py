"""TorchState: a model, an optimizer, samplers and plain attributes, committed together."""
import copy

import torch

from commrt.horovod.elastic import ObjectState
from commrt.horovod.torch.elastic.sampler import ElasticSampler
from commrt.horovod.torch.functions import (broadcast_object, broadcast_optimizer_state,
                                            broadcast_parameters)
from commrt.horovod.torch.mpi_ops import rank


class TorchState(ObjectState):
    """TorchState(model, optimizer, epoch=0, batch=0, sampler=...): commit() saves
    copies, restore() loads them back, sync() broadcasts rank 0's."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in getattr(self, "_handlers", {}):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


class StateHandler:
    def __init__(self, value):
        self.value = value

    def set_value(self, value):
        self.value = value
        self.save()


class StateDictHandler(StateHandler):
    """An object with state_dict()/load_state_dict(): its commit is a deep copy of that."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateDictHandler):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry = [(torch.nn.Module, ModelStateHandler),
                     (torch.optim.Optimizer, OptimizerStateHandler),
                     (ElasticSampler, SamplerStateHandler)]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handlers(kwargs):
    handlers, rest = {}, {}
    for k, v in kwargs.items():
        for typ, cls in _handler_registry:
            if isinstance(v, typ):
                handlers[k] = cls(v)
                break
        else:
            rest[k] = v
    return handlers, rest
