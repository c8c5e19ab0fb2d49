"""Checkpoints: model, optimizer and scheduler state in one ``.npz`` file.

Arrays are stored under ``model/<name>`` and ``optimizer/<param>/<name>``;
everything else (hyper-parameters, step counts, the scheduler, user
metadata) is one JSON string under ``meta``.  Loading never unpickles.
"""
import json

import numpy as np


def save_checkpoint(path, model, optimizer=None, scheduler=None, **meta):
    """Write the state of ``model`` (and ``optimizer``, ``scheduler``) to ``path``;
    ``meta`` holds JSON-serialisable extras such as the epoch."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    info = {"meta": meta}
    if optimizer is not None:
        opt = optimizer.state_dict()
        scalars = {}
        for index, state in opt["state"].items():
            for name, value in state.items():
                if isinstance(value, np.ndarray):
                    arrays[f"optimizer/{index}/{name}"] = value
                else:
                    scalars.setdefault(str(index), {})[name] = value
        info["optimizer"] = {"param_groups": opt["param_groups"], "scalars": scalars}
    if scheduler is not None:
        info["scheduler"] = scheduler.state_dict()
    arrays["meta"] = np.array(json.dumps(info))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_checkpoint(path, model, optimizer=None, scheduler=None):
    """Restore what ``save_checkpoint`` wrote; returns the user metadata."""
    with np.load(path, allow_pickle=False) as data:
        info = json.loads(str(data["meta"]))
        model.load_state_dict({k[6:]: data[k] for k in data.files if k.startswith("model/")})
        if optimizer is not None:
            if "optimizer" not in info:
                raise KeyError(f"load_checkpoint: {path} holds no optimizer state")
            state = {}
            for key in data.files:
                if key.startswith("optimizer/"):
                    _, index, name = key.split("/", 2)
                    state.setdefault(int(index), {})[name] = data[key]
            for index, scalars in info["optimizer"]["scalars"].items():
                state.setdefault(int(index), {}).update(scalars)
            optimizer.load_state_dict({"state": state,
                                       "param_groups": info["optimizer"]["param_groups"]})
    if scheduler is not None:
        scheduler.load_state_dict(info["scheduler"])
    return info["meta"]
