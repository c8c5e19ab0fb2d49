"""Model parallel: a model split into stages on different ranks, joined by
differentiable point-to-point communication (ChainerMN's
point_to_point_communication is the model).

Public API
----------
``send_forward(x, comm, dst, tag=0) -> Tensor``
    Sends ``x`` to rank ``dst`` and returns a *delegate*: a 0-d tensor whose
    ``backward()`` receives d(loss)/dx from ``dst`` and carries it on
    through the graph that produced ``x`` (Send.backward is a receive).
``recv_forward(comm, src, tag=0, delegate=None) -> Tensor``
    Receives the tensor ``src`` sent with the same tag; its gradient is sent
    back to ``src`` during backward (Recv.backward is a send).  A rank that
    has already sent something in this graph passes that delegate, so one
    ``backward()`` runs the whole rank's part in the right order (ChainerMN's
    pseudo_connect).
``wait_sends(timeout=None)``
    Waits for every send posted by the functions above (sends are
    non-blocking so that neighbouring stages never wait on each other's
    sends; a send's buffer stays alive until then).  Pipelines call it at
    the end of each step.
``Stage(module, comm, prev=None, next=None)``
    One rank's part of a model: ``stage.forward(x=None, target=None, tag=0,
    loss_fn=..., loss_scale=1.0)`` returns the loss (last stage) or the
    delegate (other stages); call ``.backward()`` on what it returns.
``GlobalAvgPool()``, ``resnet_layers(model)``, ``partition(costs, k)``,
``split_layers(layers, k, costs=None)``, ``layer_costs(layers, x)``
    Split a model into contiguous stages, balanced by a cost per layer
    (default parameter count; ``layer_costs`` measures forward+backward time).
``train_model_parallel(comm, build_stages, data, *, optimizer=None,
        loss_fn=F.cross_entropy, epochs=1, lr_scheduler=None, progress=True,
        on_epoch=None) -> dict``
    Trains a model split into ``comm.size`` stages, one batch at a time (no
    micro-batches: this is the schedule whose bubble pipelining removes).
    ``build_stages(k)`` returns k modules (or callables returning one, so a
    rank builds only its own); ``data`` is an iterable of (x, y) batches (a
    DataLoader), the same on every rank; ``optimizer(params)`` builds the
    stage's optimizer (default SGD lr=0.05, momentum 0.9).  Returns
    ``{"losses": per-epoch mean loss, "stage": module, "optimizer": opt}`` on
    every rank.  It is ``train_pipeline(..., schedule="gpipe",
    micro_batches=1)`` (commrt.parallel.pipeline), which also evaluates.

Wire protocol.  Tag ``t`` of the caller becomes tags ``2t`` (activations)
and ``2t+1`` (gradients).  An activation travels as a small header (int64:
ndim, dtype, wants-gradient flag, shape) and then the payload, both with tag
``2t``; its gradient comes back as one message of the same shape and dtype
(no header).  A sender that recorded no graph (``no_grad``, a tensor that
needs no gradient) says so in the header, so the receiver sends nothing back.

Caveat: a received tensor that does not contribute to the loss gets no
gradient, so nothing is sent back and its sender waits in backward until
its timeout (COMMRT_TIMEOUT); every received activation must be used.
"""
import time

import numpy as np

from commrt.nn import functions as F
from commrt.nn.backend import get_array_module
from commrt.nn.layers import Module, Sequential
from commrt.nn.tensor import Function, Tensor, is_grad_enabled
from commrt.parallel import timeline

__all__ = ["send_forward", "recv_forward", "wait_sends", "Send", "Recv", "Stage",
           "GlobalAvgPool", "resnet_layers", "partition", "split_layers", "layer_costs",
           "train_model_parallel"]

_MAX_DIMS = 8
_HEADER = 3 + _MAX_DIMS
_DTYPES = [np.dtype(t) for t in ("float64", "float32", "float16", "int64", "int32", "int16",
                                 "int8", "uint8", "bool", "complex64", "complex128")]
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}

_pending = []           # Requests of non-blocking sends not yet known to be complete
wait_ns = [0]           # nanoseconds this process spent blocked in receives (for bubble accounting)


class _waiting:
    """A timeline span of category 'wait' that also adds its time to wait_ns."""
    __slots__ = ("span", "t0")

    def __init__(self, name):
        self.span = timeline.span(name, "wait")

    def __enter__(self):
        self.span.__enter__()
        self.t0 = time.monotonic_ns()

    def __exit__(self, *exc):
        wait_ns[0] += time.monotonic_ns() - self.t0
        return self.span.__exit__(*exc)


def _act_tag(tag):
    if tag < 0:
        raise ValueError(f"tag must be >= 0, got {tag}")
    return 2 * tag


def _post(comm, buf, peer, tag):
    """Non-blocking send, remembered until wait_sends(); prunes finished ones."""
    global _pending
    if len(_pending) > 32:
        _pending = [r for r in _pending if not r.test()]
    _pending.append(comm.isend(buf, peer, tag))


def wait_sends(timeout=None):
    """Wait for every send posted by send_forward/recv_forward's backward."""
    global _pending
    reqs, _pending = _pending, []
    if reqs:
        from commrt.comm import wait_all

        with _waiting("wait sends"):
            wait_all(reqs, timeout)


def _contiguous(xp, a):
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


class Send(Function):
    """Forward: send x to ``peer`` (non-blocking); output: a 0-d delegate.
    Backward: receive the gradient of x from ``peer``."""

    def forward(self, x):
        xp = get_array_module(x)
        if x.ndim > _MAX_DIMS:
            raise ValueError(f"send_forward: at most {_MAX_DIMS} dimensions, got shape {x.shape}")
        if x.dtype not in _DTYPE_CODE:
            raise TypeError(f"send_forward: dtype {x.dtype} cannot be sent")
        wants = bool(self.needs_input_grad[0])
        header = np.zeros(_HEADER, np.int64)
        header[:3] = (x.ndim, _DTYPE_CODE[x.dtype], wants)
        header[3:3 + x.ndim] = x.shape
        buf = _contiguous(xp, x)
        tag = _act_tag(self.tag)
        with timeline.span(f"send {tuple(x.shape)} to {self.peer}", "comm"):
            _post(self.comm, header, self.peer, tag)
            _post(self.comm, buf, self.peer, tag)
        self.shape, self.dtype, self.xp = x.shape, x.dtype, xp
        self.nbytes = buf.nbytes
        return xp.zeros((), dtype=x.dtype if x.dtype.kind == "f" else np.float32)

    def backward(self, gy):
        g = self.xp.empty(self.shape, self.dtype)
        with _waiting(f"recv grad from {self.peer}"):
            self.comm.recv(g, self.peer, _act_tag(self.tag) + 1)
        return (g,)


class Recv(Function):
    """Forward: the received array (its input is only a delegate that links
    this node into the rank's graph).  Backward: send the gradient back."""

    def forward(self, delegate):
        return self.array

    def backward(self, gy):
        xp = get_array_module(gy)
        g = _contiguous(xp, gy)
        if g.dtype != self.array.dtype:
            g = g.astype(self.array.dtype)
        with timeline.span(f"send grad to {self.peer}", "comm"):
            _post(self.comm, g, self.peer, _act_tag(self.tag) + 1)
        self.array = None
        return (xp.zeros((), dtype=self.delegate_dtype),)


def send_forward(x, comm, dst, tag=0):
    """Send tensor ``x`` to ``dst``; returns the delegate whose backward()
    receives x's gradient from ``dst``.  See the module docstring."""
    if not isinstance(x, Tensor):
        x = Tensor(x)
    return Send.apply(x, comm=comm, peer=int(dst), tag=int(tag))


def recv_forward(comm, src, tag=0, delegate=None, timeout=None):
    """Receive the tensor ``src`` sent with ``send_forward(.., tag)``.

    The result requires grad when the sender recorded a graph and gradients
    are enabled here; its backward sends the gradient to ``src``.  Pass the
    ``delegate`` of an earlier send_forward of this rank to join both in one
    graph."""
    t = _act_tag(tag)
    header = np.empty(_HEADER, np.int64)
    with _waiting(f"recv from {src}"):
        comm.recv(header, src, t, timeout=timeout)
        ndim, code, wants = (int(v) for v in header[:3])
        if not 0 <= ndim <= _MAX_DIMS or not 0 <= code < len(_DTYPES):
            raise ValueError(f"recv_forward: malformed header {header.tolist()} from rank {src} "
                             f"tag {tag}")
        shape = tuple(int(d) for d in header[3:3 + ndim])
        xp = get_array_module(delegate.data) if delegate is not None else np
        array = xp.empty(shape, _DTYPES[code])
        comm.recv(array, src, t, timeout=timeout)
    record = wants and is_grad_enabled() and array.dtype.kind == "f"
    if delegate is None or not delegate.requires_grad:
        delegate = Tensor._wrap(xp.zeros((), array.dtype if array.dtype.kind == "f" else np.float32),
                                record)
    elif not record:
        delegate = delegate.detach()
    return Recv.apply(delegate, comm=comm, peer=int(src), tag=int(tag), array=array,
                      delegate_dtype=delegate.dtype)


# ---- stages ---------------------------------------------------------------------------
class Stage:
    """One rank's part of a model between its neighbours ``prev`` and ``next``
    (ranks of ``comm``; None at the ends).

    ``forward(x=None, target=None, tag=0, loss_fn=F.cross_entropy,
    loss_scale=1.0)``: the first stage takes ``x``, the others receive it
    from ``prev``; the last stage returns ``loss_fn(output, target) *
    loss_scale`` (its unscaled value is kept in ``last_loss`` and the output
    in ``last_output``), the others send their output to ``next`` and return
    the delegate.  Call ``.backward()`` on the result.  ``compute_s``
    accumulates the seconds spent in the module (forward and backward are
    timed by the caller's spans; forward here)."""

    def __init__(self, module, comm, prev=None, next=None):
        self.module, self.comm, self.prev, self.next = module, comm, prev, next
        self.last_loss = self.last_output = None

    is_first = property(lambda self: self.prev is None)
    is_last = property(lambda self: self.next is None)

    def parameters(self):
        return self.module.parameters()

    def forward(self, x=None, target=None, tag=0, loss_fn=F.cross_entropy, loss_scale=1.0):
        if self.prev is not None:
            x = recv_forward(self.comm, self.prev, tag)
        elif x is None:
            raise ValueError("Stage.forward: the first stage needs its input x")
        elif not isinstance(x, Tensor):
            x = Tensor(x)
        with timeline.span(f"forward {tag}", "compute"):
            y = self.module(x)
            if self.next is None:
                self.last_output = y
                loss = loss_fn(y, target) if loss_fn is not None else y
                self.last_loss = float(loss.item()) if loss.size == 1 else None
                return loss * loss_scale if loss_scale != 1.0 else loss
        return send_forward(y, self.comm, self.next, tag)


class GlobalAvgPool(Module):
    """(N, C, H, W) -> (N, C): the mean over the spatial axes."""

    def forward(self, x):
        return F.mean(x, axis=(2, 3))


def resnet_layers(model):
    """A ResNet as a list of layers whose composition is model.forward:
    stem, each residual block, global average pooling, head."""
    return [model.stem, *model.stages, GlobalAvgPool(), model.head]


def partition(costs, k):
    """Split ``costs`` (one per layer, in order) into ``k`` contiguous
    non-empty groups minimising the largest group's sum (exact dynamic
    programme).  Returns the k+1 boundaries: group i is layers b[i]:b[i+1]."""
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"partition: cannot split {n} layers into {k} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for m in range(j - 1, i):
                v = max(best[j - 1][m], prefix[i] - prefix[m])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, m
    bounds, i = [n], n
    for j in range(k, 0, -1):
        i = cut[j][i]
        bounds.append(i)
    return bounds[::-1]


def split_layers(layers, k, costs=None):
    """``k`` Sequential stages of contiguous ``layers``, balanced by ``costs``
    (default: parameter count + 1 per layer)."""
    layers = list(layers)
    if costs is None:
        costs = [sum(p.size for p in layer.parameters()) + 1 for layer in layers]
    b = partition(costs, k)
    return [Sequential(*layers[b[i]:b[i + 1]]) for i in range(k)]


def layer_costs(layers, x, repeats=3):
    """Measured seconds of each layer's forward + backward on input ``x``
    (the median of ``repeats``), for ``split_layers(layers, k, costs)``:
    balancing by time rather than by parameter count."""
    import statistics

    h = x if isinstance(x, Tensor) else Tensor(x)
    for layer in layers:                    # warm-up: compilation, first allocations
        out = layer(Tensor(h.data, requires_grad=True))
        out.backward(out.xp.ones_like(out.data))
        h = out.detach()
    h = x if isinstance(x, Tensor) else Tensor(x)
    costs = []
    for layer in layers:
        times = []
        for _ in range(repeats):
            inp = Tensor(h.data, requires_grad=True)
            t0 = time.perf_counter()
            out = layer(inp)
            out.backward(out.xp.ones_like(out.data))
            times.append(time.perf_counter() - t0)
        costs.append(statistics.median(times))
        h = out.detach()
    return costs


def train_model_parallel(comm, build_stages, data, **kw):
    """Train a model split across ``comm.size`` ranks, one batch at a time
    (see the module docstring).  Same keywords as train_pipeline except
    ``schedule`` and ``micro_batches``."""
    from commrt.parallel.pipeline import train_pipeline

    for key in ("schedule", "micro_batches"):
        if key in kw:
            raise TypeError(f"train_model_parallel: unexpected keyword {key!r}")
    return train_pipeline(comm, build_stages, data, schedule="gpipe", micro_batches=1, **kw)
