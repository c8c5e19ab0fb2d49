"""broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object."""
import collections
import io
from collections.abc import Iterable

import cloudpickle
import numpy as np
import torch

from commrt.horovod.process_sets import global_process_set
from commrt.horovod.torch.mpi_ops import allgather, broadcast_, broadcast_async_, synchronize


def _rank_in(process_set):
    from commrt.horovod import _runtime

    rt = _runtime.current()
    return rt.rank if process_set.process_set_id == 0 else process_set.rank()


def broadcast_parameters(params, root_rank):
    """Copy root_rank's parameters (a state_dict, named_parameters() or a list) into
    every rank's, in place."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    elif isinstance(params, Iterable):
        params = list(params)
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = [broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p, root_rank,
                                name)
               for name, p in params]
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Copy root_rank's optimizer state (tensors and scalars, per parameter and per
    group) into every rank's optimizer."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        # a fresh optimizer has no state yet: take one zero step to create it
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in state_dict["state"]:
                    p.grad = p.data.new(p.size()).zero_()
        base = getattr(type(optimizer), "_hvd_base", None)
        (base.step(optimizer) if base is not None else optimizer.step())
        state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        return
    params, scalars, callbacks = [], {}, {}
    seen = collections.defaultdict(int)

    def set_state(pid, name):
        def assign(v):
            state_dict["state"][pid][name] = v
        return assign

    def set_option(index, key):
        def assign(v):
            optimizer.param_groups[index][key] = v
        return assign

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key == "params":
                continue
            k = f"{key}.{index}"
            scalars[k] = value
            callbacks[k] = set_option(index, key)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue
            for name, p in state_dict["state"][pid].items():
                seen[name] += 1
                k = f"{name}.{seen[name]}"
                if torch.is_tensor(p):
                    params.append((k, p))
                else:
                    scalars[k] = p
                    callbacks[k] = set_state(pid, name)
    broadcast_parameters(params, root_rank)
    scalars = broadcast_object(scalars, root_rank)
    for k, v in scalars.items():
        callbacks[k](v)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's picklable object, on every rank of the process set."""
    name = name or type(obj).__name__
    if _rank_in(process_set) == root_rank:
        data = cloudpickle.dumps(obj)
        t = torch.from_numpy(np.frombuffer(data, np.uint8).copy())
        sz = torch.tensor([t.numel()], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
    else:
        sz = torch.zeros(1, dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
        t = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(t, root_rank, name + ".t", process_set)
    if _rank_in(process_set) != root_rank:
        obj = cloudpickle.load(io.BytesIO(t.numpy().tobytes()))
    return obj


def allgather_object(obj, name=None, process_set=global_process_set):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    name = name or type(obj).__name__
    data = cloudpickle.dumps(obj)
    t = torch.from_numpy(np.frombuffer(data, np.uint8).copy())
    sizes = allgather(torch.tensor([t.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=process_set).tolist()
    gathered = allgather(t, name=name + ".t", process_set=process_set).numpy()
    offs = np.concatenate([[0], np.cumsum(sizes)])
    return [cloudpickle.loads(gathered[offs[i]:offs[i + 1]].tobytes()) for i in range(len(sizes))]
