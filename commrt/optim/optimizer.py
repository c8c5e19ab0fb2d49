"""Optimizers.  ``Optimizer.step`` walks the parameters that have a gradient
and hands each to the variant's one hook, ``_step(param, grad, state,
group)``, which updates ``param.data`` in place.  A wrapper (e.g. data
parallel) can therefore act on all gradients before ``step`` without knowing
the update rule."""
import math

from commrt.nn.backend import device_of, to_device
from commrt.nn.tensor import no_grad


class Optimizer:
    defaults = {}
    scalar_state = ("step",)             # per-parameter state that is a number, not an array

    def __init__(self, params, **hyper):
        unknown = set(hyper) - set(self.defaults)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown options {sorted(unknown)}")
        self.defaults = {**self.defaults, **hyper}
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups, self.state = [], {}
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group):
        group = {**self.defaults, **group, "params": list(group["params"])}
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if not getattr(p, "requires_grad", False):
                raise ValueError(f"{type(self).__name__}: parameter of shape {tuple(p.shape)} "
                                 "does not require grad")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter appears in two groups")
            seen.add(id(p))
        self._validate(group)
        self.param_groups.append(group)

    def _validate(self, group):
        if group["lr"] < 0:
            raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {group['lr']}")

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad[...] = 0

    @no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step(p, p.grad, self.state.setdefault(p, {}), group)

    def _step(self, param, grad, state, group):
        raise NotImplementedError

    # ---- state: parameters are referred to by their index across the groups -----------
    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        index = {id(p): i for i, p in enumerate(self._params())}
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(start, start + n))})
            start += n
        state = {index[id(p)]: {k: (to_device(v, "cpu").copy() if hasattr(v, "shape") else v)
                                for k, v in s.items()}
                 for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved groups have "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                             f"{[len(g['params']) for g in self.param_groups]}")
        for own, saved in zip(self.param_groups, groups):
            own.update({k: (tuple(v) if isinstance(v, list) else v)
                        for k, v in saved.items() if k != "params"})
        params = self._params()
        self.state = {}
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            self.state[p] = {k: (_scalar(v) if k in self.scalar_state else
                                 to_device(v, device_of(p.data)).astype(p.dtype, copy=True))
                             for k, v in s.items()}


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (heavy-ball or
    Nesterov) and L2 weight decay, as in PyTorch."""

    defaults = dict(lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)

    def _validate(self, group):
        super()._validate(group)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")

    def _step(self, p, grad, state, group):
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p.data
        mu = group["momentum"]
        if mu:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= mu
                buf += (1 - group["dampening"]) * grad
            grad = grad + mu * buf if group["nesterov"] else buf
        p.data -= group["lr"] * grad


class Adam(Optimizer):
    """Adam (Kingma and Ba) with bias correction; ``weight_decay`` adds an L2
    term to the gradient."""

    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    decoupled = False

    def _step(self, p, grad, state, group):
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd and self.decoupled:
            p.data *= 1 - lr * wd
        elif wd:
            grad = grad + wd * p.data
        if not state:
            xp = p.xp
            state.update(step=0, exp_avg=xp.zeros_like(p.data), exp_avg_sq=xp.zeros_like(p.data))
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        denom = p.xp.sqrt(v) / math.sqrt(1 - b2 ** t) + group["eps"]
        p.data -= (lr / (1 - b1 ** t)) * m / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): the weights
    shrink by ``lr * weight_decay`` each step, apart from the adaptive update."""

    defaults = dict(Adam.defaults, weight_decay=1e-2)
    decoupled = True
