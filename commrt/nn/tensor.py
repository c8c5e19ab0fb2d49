"""Tensor with reverse-mode automatic differentiation.

A Tensor wraps one array (``numpy`` or ``cupy``).  Every differentiable
operation is a ``Function`` node: ``forward`` computes on arrays and saves
what ``backward`` needs; ``Function.apply`` wraps the result in a Tensor and,
when gradients are wanted, links it to the node.  The graph is therefore
recorded as the program runs (dynamic graph).

``Tensor.backward()`` sorts the nodes reachable from the output
topologically and sweeps them in reverse, summing the gradient of every
tensor over all its uses.  A leaf (a tensor that no node produced, e.g. a
parameter) receives its gradient in ``.grad`` once *all* its uses have been
swept; at that moment its grad hooks run, which lets data-parallel code start
reducing a gradient while backward is still computing the others.
"""
import threading

import numpy as np

from commrt.nn.backend import device_of, get_array_module, to_device

_mode = threading.local()


def is_grad_enabled():
    return getattr(_mode, "enabled", True)


class _GradMode:
    enabled = True

    def __enter__(self):
        self._prev = is_grad_enabled()
        _mode.enabled = self.enabled

    def __exit__(self, *exc):
        _mode.enabled = self._prev

    def __call__(self, func):
        import functools

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with type(self)():
                return func(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Context manager (or decorator): operations inside record no graph."""
    enabled = False


class enable_grad(_GradMode):
    """Context manager (or decorator): record the graph even inside no_grad."""
    enabled = True


class Function:
    """One node of the graph.  Subclasses define ``forward(*arrays)`` returning
    one array, and ``backward(grad)`` returning one gradient (or None) per
    input.  ``needs_input_grad`` is set before ``forward`` so that it can skip
    saving what no gradient will need."""

    freed = False

    def __init__(self, **params):
        self.__dict__.update(params)

    @property
    def name(self):
        return type(self).__name__

    @classmethod
    def apply(cls, *inputs, **params):
        fn = cls(**params)
        _check_same_device(fn.name, inputs)
        record = is_grad_enabled() and any(t.requires_grad for t in inputs)
        fn.needs_input_grad = tuple(t.requires_grad for t in inputs) if record else (False,) * len(inputs)
        y = fn.forward(*[t.data for t in inputs])
        if isinstance(y, np.generic):              # numpy reductions return scalars
            y = np.asarray(y)
        out = Tensor._wrap(y, record)
        if record:
            fn.inputs = inputs
            out._node = fn
        return out

    def forward(self, *xs):
        raise NotImplementedError

    def backward(self, gy):
        raise NotImplementedError

    def describe(self):
        shapes = ", ".join(str(tuple(t.shape)) for t in getattr(self, "inputs", ()))
        return f"{self.name}(inputs {shapes})"

    def release(self):
        """Drop what forward saved: a second backward through this node fails."""
        keep = {"inputs": self.inputs}
        self.__dict__.clear()
        self.__dict__.update(keep)
        self.freed = True


def _check_same_device(op, inputs):
    kinds = {type(t.data) for t in inputs}
    if len(kinds) > 1 or (kinds and not issubclass(next(iter(kinds)), np.ndarray)
                          and len({device_of(t.data) for t in inputs}) > 1):
        devices = ", ".join(f"{tuple(t.shape)} on {t.device}" for t in inputs)
        raise ValueError(f"{op}: inputs are on different devices: {devices}")


class Tensor:
    """An array with an optional gradient.  ``grad`` stays None until a
    backward pass computes it; it is an array of the same shape, dtype and
    device as ``data``."""

    __array_ufunc__ = None          # numpy defers to our reflected operators
    __slots__ = ("data", "grad", "requires_grad", "_node", "_hooks", "name", "__weakref__")

    def __init__(self, data, requires_grad=False, dtype=None, name=None):
        if isinstance(data, Tensor):
            data = data.data
        xp = get_array_module(data)
        data = xp.asarray(data, dtype=dtype)
        if requires_grad and data.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {data.dtype}")
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._node = None
        self._hooks = None
        self.name = name

    @classmethod
    def _wrap(cls, data, requires_grad):
        t = Tensor.__new__(Tensor)
        t.data, t.grad, t.requires_grad = data, None, requires_grad
        t._node = t._hooks = t.name = None
        return t

    # ---- array-like properties -------------------------------------------------
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)
    device = property(lambda self: device_of(self.data))
    xp = property(lambda self: get_array_module(self.data))
    is_leaf = property(lambda self: self._node is None)
    grad_fn = property(lambda self: self._node)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self._node is not None:
            extra += f", grad_fn={self._node.name}"
        return f"Tensor({self.data!r}{extra})"

    def item(self):
        return self.data.item()

    def numpy(self):
        """The data as a NumPy array (copied from the GPU if needed)."""
        return to_device(self.data, "cpu")

    def detach(self):
        """The same data, cut from the graph."""
        return Tensor._wrap(self.data, False)

    def requires_grad_(self, flag=True):
        if not self.is_leaf:
            raise RuntimeError("requires_grad_ can only change leaf tensors")
        self.requires_grad = flag
        return self

    def to(self, device):
        """A copy on ``device`` ('cpu' or 'cuda[:N]'), differentiable only as a leaf."""
        return Tensor(to_device(self.data, device), requires_grad=self.requires_grad)

    # ---- gradients ---------------------------------------------------------------
    def register_grad_hook(self, hook):
        """Call ``hook(tensor)`` each time backward has finished accumulating
        this leaf's ``.grad``.  Returns a handle whose ``remove()`` detaches it."""
        if not self.is_leaf:
            raise RuntimeError("grad hooks can only be registered on leaf tensors")
        if self._hooks is None:
            self._hooks = {}
        handle = _HookHandle(self._hooks)
        self._hooks[handle.id] = hook
        return handle

    def zero_grad(self):
        self.grad = None

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not require grad (no graph was recorded)")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError("backward: grad can be implied only for a single-element output, "
                                   f"this one has shape {tuple(self.shape)}")
            grad = self.xp.ones_like(self.data)
        else:
            grad = grad.data if isinstance(grad, Tensor) else self.xp.asarray(grad, dtype=self.dtype)
            if grad.shape != self.shape:
                raise ValueError(f"backward: grad has shape {tuple(grad.shape)} but the output has "
                                 f"shape {tuple(self.shape)}")
        _run_backward(self, grad, retain_graph)

    def _accumulate(self, g, op):
        if g.shape != self.data.shape:
            raise RuntimeError(f"{op}: gradient of shape {tuple(g.shape)} for a tensor of shape "
                               f"{tuple(self.data.shape)}")
        if g.dtype != self.data.dtype or isinstance(g, np.generic):
            g = self.xp.asarray(g, dtype=self.data.dtype)
        # .grad must own its memory: a hook may reduce it in place.
        self.grad = g.copy() if self.grad is None else self.grad + g
        if self._hooks:
            for hook in list(self._hooks.values()):
                hook(self)


class _HookHandle:
    _next = 0

    def __init__(self, hooks):
        self.hooks = hooks
        _HookHandle._next += 1
        self.id = _HookHandle._next

    def remove(self):
        self.hooks.pop(self.id, None)


def _topological_nodes(root):
    """Nodes reachable from ``root`` in post-order, and how many node inputs
    refer to each leaf (so that a leaf's gradient is known to be complete)."""
    order, uses, seen = [], {}, set()
    stack = [(root._node, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        if node.freed:
            raise RuntimeError(
                f"backward through a freed graph: {node.describe()} was already used by a "
                "backward pass; pass retain_graph=True to the first backward to go through it twice")
        seen.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if not t.requires_grad:
                continue
            if t._node is None:
                uses[id(t)] = uses.get(id(t), 0) + 1
            elif id(t._node) not in seen:
                stack.append((t._node, False))
    return order, uses


def _run_backward(root, grad, retain_graph):
    if root._node is None:
        root._accumulate(grad, "backward")
        return
    order, uses = _topological_nodes(root)
    pending = {id(root._node): grad}       # gradient of each node's output, or of each leaf
    for node in reversed(order):
        gy = pending.pop(id(node), None)
        gxs = node.backward(gy) if gy is not None else (None,) * len(node.inputs)
        if len(gxs) != len(node.inputs):
            raise RuntimeError(f"{node.describe()}: backward returned {len(gxs)} gradients")
        for t, g in zip(node.inputs, gxs):
            if not t.requires_grad:
                continue
            key = id(t._node) if t._node is not None else id(t)
            if g is not None:
                prev = pending.get(key)
                pending[key] = g if prev is None else prev + g
            if t._node is None:
                uses[key] -= 1
                if uses[key] == 0:
                    g_total = pending.pop(key, None)
                    if g_total is not None:
                        t._accumulate(g_total, node.name)
        if not retain_graph:
            node.release()


# Operators and methods are defined with the functions they call.
from commrt.nn import functions as _F  # noqa: E402

_F.install_tensor_methods(Tensor)
