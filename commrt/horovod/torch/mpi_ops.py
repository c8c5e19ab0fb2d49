"""horovod.torch's operations over commrt's coordinator.

Every ``*_async`` call submits one named operation and returns an integer
handle at once; ``poll(handle)`` is False while it is in flight and
``synchronize(handle)`` waits for it and returns its output.  The blocking
forms (``allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter`` and their ``grouped_`` forms) are autograd functions with
Horovod's backward passes.  Operations without a name get
``<op>.noname.<n>``, so ranks that call in the same order agree.
"""
import torch

from commrt.horovod import _coordinator as co
from commrt.horovod import _runtime
from commrt.horovod.process_sets import ProcessSet, global_process_set
from commrt.horovod.torch import _adapter
from commrt.horovod.torch.compression import Compression

Average, Sum, Adasum, Min, Max, Product = (co.AVERAGE, co.SUM_OP, co.ADASUM, co.MIN_OP,
                                           co.MAX_OP, co.PRODUCT)

_handle_map = {}        # handle -> (Op, finish(result) -> output)
_next_handle = [0]


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def _rt():
    return _runtime.current()


def size():
    return _rt().size


def rank():
    return _rt().rank


def _set_id(process_set):
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered (hvd.add_process_set)")
    return process_set.process_set_id


def _set_size(process_set):
    return _rt().size if process_set.process_set_id == 0 else len(process_set.ranks)


def _submit(kind, name, sig, bufs, process_set, finish):
    rt = _rt()
    set_id = _set_id(process_set)
    if name is None:
        name = rt.next_name(kind, set_id)
    elif not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    else:
        name = f"{kind}.{name}"             # Horovod's op names: allreduce.<name>
    op = rt.coordinator.submit(kind, name, sig, bufs, set_id)
    _next_handle[0] += 1
    handle = _next_handle[0]
    _handle_map[handle] = (op, finish)
    return handle


def _check_op(op, kind="allreduce"):
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by commrt's Horovod API; use "
                                  "Average or Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"unknown reduction op {op!r}")
    if kind == "reducescatter" and op not in (Average, Sum):
        raise ValueError("reducescatter supports only Average and Sum")


def _shape(t):
    return tuple(int(d) for d in t.shape)


# ---------------------------------------------------------------- allreduce
def _allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                     process_set, single=False):
    """Submit the allreduce of tensors into outputs -> handle; synchronize returns
    outputs (outputs[0] when single).  The per-tensor path of DistributedOptimizer's
    hooks: no torch ops beyond one NumPy view for a contiguous CPU tensor."""
    _check_op(op)
    arrays, finishes = [], []
    for t, out in zip(tensors, outputs):
        _adapter.check_tensor(t)
        if out is not t:
            with torch.no_grad():
                out.copy_(t)
        a, fin = _adapter.reduce_view(out)
        arrays.append(a)
        if fin is not _adapter.noop:
            finishes.append(fin)
    code = _adapter.dtype_code(arrays[0])
    if any(_adapter.dtype_code(a) != code for a in arrays[1:]):
        raise ValueError("a grouped allreduce needs tensors of one dtype")
    sig = ("allreduce", code, tuple(tuple(t.shape) for t in tensors), op,
           float(prescale_factor), float(postscale_factor))
    result = outputs[0] if single else outputs
    if finishes:
        def finish(_):
            for fin in finishes:
                fin()
            return result
    else:
        def finish(_):
            return result
    return _submit("allreduce", name, sig, arrays, process_set, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start averaging (or summing, ...) tensor across the ranks -> handle; tensor is
    not modified, synchronize(handle) returns a new tensor."""
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async([tensor], [output], name, op, prescale_factor, postscale_factor,
                            process_set, single=True)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Like allreduce_async, in place: synchronize(handle) returns tensor itself."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], [tensor], name, op, prescale_factor, postscale_factor,
                            process_set, single=True)


def gradient_allreduce_async_(tensor, full_name, op, prescale_factor, postscale_factor,
                              process_set):
    """allreduce_async_ as DistributedOptimizer's hook calls it, once per gradient per
    step: full_name is already "allreduce.<name>" and op and the factors were checked
    when the optimizer was made.  A contiguous CPU tensor of a NumPy dtype goes
    straight to the coordinator (one view, one signature); anything else takes
    allreduce_async_'s general path."""
    if tensor.is_cpu and tensor.dtype is not torch.bfloat16 and tensor.is_contiguous():
        try:
            a = tensor.detach().numpy().reshape(-1)
        except (RuntimeError, TypeError):        # conj/neg bit, a dtype NumPy lacks
            a = None
        if a is not None:
            sig = ("allreduce", a.dtype.str, (tuple(tensor.shape),), op, prescale_factor,
                   postscale_factor)
            handle_op = _rt().coordinator.submit("allreduce", full_name, sig, [a],
                                                 _set_id(process_set))
            _next_handle[0] += 1
            handle = _next_handle[0]
            _handle_map[handle] = (handle_op, lambda _: tensor)
            return handle
    return allreduce_async_(tensor, name=full_name[len("allreduce."):], op=op,
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set)


def _single(h):
    op, finish = _handle_map[h]
    _handle_map[h] = (op, lambda r: finish(r)[0])


class HorovodAllreduce(torch.autograd.Function):
    """allreduce as an autograd function: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        average, op, pre, post, ps = ctx.args
        return (allreduce(grad_output.contiguous(), average=average, op=op, prescale_factor=pre,
                          postscale_factor=post, process_set=ps),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Average (op=Average, the default), Sum, Min, Max or Product of tensor across the
    ranks, as a new tensor; differentiable."""
    compressed, cctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return compression.decompress(reduced, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """allreduce in place; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Allreduce a list of tensors as one operation (reduced together) -> handle."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _allreduce_async(list(tensors), outputs, name, op, prescale_factor,
                            postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(list(tensors), list(tensors), name, op, prescale_factor,
                            postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), average, name, op, prescale_factor, postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, ps = ctx.args
        reduced = grouped_allreduce([g.contiguous() for g in grads], average=average, op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=ps)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                            postscale_factor, process_set,
                                            *[p[0] for p in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse gradient: allgather its indices and values -> a callable handle."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                         process_set=process_set)
    vh = allgather_async(t._values().contiguous(), name=f"{name}.values",
                         process_set=process_set)

    def handle():
        values = synchronize(vh)
        indices = synchronize(ih)
        if op == Average:
            values = values / _set_size(process_set)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
    return handle


# ---------------------------------------------------------------- allgather
def _allgather_async(tensors, name, process_set):
    arrays, likes = [], []
    for t in tensors:
        _adapter.check_tensor(t)
        if t.dim() == 0:
            raise ValueError("allgather needs a tensor of at least one dimension")
        a, _ = _adapter.move_view(t)
        arrays.append(a)
        likes.append(t)
    sig = ("allgather", _adapter.dtype_code(arrays[0]), tuple(_shape(t) for t in tensors))

    def finish(result):
        return [_adapter.to_tensor(r, like) for r, like in zip(result, likes)]
    return _submit("allgather", name, sig, arrays, process_set, finish)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's tensor along dimension 0 (first dimensions
    may differ) -> handle."""
    h = _allgather_async([tensor], name, process_set)
    _single(h)
    return h


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _allgather_async(list(tensors), name, process_set)


def _offset_of_rank(dim, process_set):
    dims = allgather(torch.tensor([dim], dtype=torch.int64), process_set=process_set)
    r = process_set.rank() if process_set.process_set_id != 0 else _rt().rank
    return int(dims[:r].sum())


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), average=True, process_set=ctx.process_set)
        offset = _offset_of_rank(ctx.dim, ctx.process_set)
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dimension 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], average=True, process_set=ctx.process_set)
        out = [g.narrow(0, _offset_of_rank(d, ctx.process_set), d)
               for g, d in zip(reduced, ctx.dims)]
        return (None, None, *out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast
def _broadcast_async(tensor, output, root_rank, name, process_set):
    _adapter.check_tensor(tensor)
    n = _set_size(process_set)
    if not isinstance(root_rank, int) or not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank!r} out of range for a process set of size {n}")
    if output is not tensor:
        with torch.no_grad():
            output.copy_(tensor)
    a, fin = _adapter.move_view(output)
    sig = ("broadcast", _adapter.dtype_code(a), (_shape(tensor),), int(root_rank))

    def finish(_):
        fin()
        return output
    return _submit("broadcast", name, sig, [a], process_set, finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start copying root_rank's tensor to every rank -> handle (a new tensor)."""
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), average=True, process_set=ctx.process_set)
        me = _rt().rank if ctx.process_set.process_set_id == 0 else ctx.process_set.rank()
        if me != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor on every rank, as a new tensor; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ---------------------------------------------------------------- alltoall
def _splits(tensor, splits, n):
    dim0 = tensor.shape[0] if tensor.dim() else 0
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    if splits is None:
        if dim0 % n:
            raise ValueError(f"alltoall without splits needs the first dimension ({dim0}) to be "
                             f"divisible by the number of ranks ({n})")
        return (dim0 // n,) * n
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"splits must hold 32-bit integers, got {splits.dtype}")
        splits = splits.tolist()
    splits = tuple(int(s) for s in splits)
    if len(splits) != n:
        raise ValueError(f"splits must have one entry per rank ({n}), got {len(splits)}")
    if any(s < 0 for s in splits):
        raise ValueError(f"splits must be non-negative, got {list(splits)}")
    if sum(splits) != dim0:
        raise ValueError(f"splits sum to {sum(splits)} but the first dimension is {dim0}")
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending splits[i] rows of tensor to rank i -> handle; synchronize returns
    (output, received_splits)."""
    _adapter.check_tensor(tensor)
    parts = _splits(tensor, splits, _set_size(process_set))
    a, _ = _adapter.move_view(tensor)
    sig = ("alltoall", _adapter.dtype_code(a), _shape(tensor), parts)

    def finish(result):
        out, received = result
        return _adapter.to_tensor(out, tensor), torch.from_numpy(received)
    return _submit("alltoall", name, sig, [a], process_set, finish)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter rows of tensor to the ranks (splits[i] to rank i; even without splits) and
    gather theirs -> output, or (output, received_splits) when splits are given."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---------------------------------------------------------------- reducescatter
def _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor):
    _check_op(op, "reducescatter")
    arrays = []
    for t in tensors:
        _adapter.check_tensor(t)
        if t.dim() == 0:
            raise ValueError("reducescatter needs a tensor of at least one dimension")
        a, _ = _adapter.reduce_view(t)
        arrays.append(a)
    sig = ("reducescatter", _adapter.dtype_code(arrays[0]), tuple(_shape(t) for t in tensors), op,
           float(prescale_factor), float(postscale_factor))

    def finish(result):
        return [_adapter.to_tensor(r, t) for r, t in zip(result, tensors)]
    return _submit("reducescatter", name, sig, arrays, process_set, finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start reducing tensor across ranks; rank i gets the i-th block of rows."""
    h = _reducescatter_async([tensor], name, op, process_set, prescale_factor,
                             postscale_factor)
    _single(h)
    return h


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                postscale_factor)


def _scatter_grad(grads, ctx):
    n = _set_size(ctx.process_set)
    out = []
    for g in grads:
        if ctx.op == Sum:
            g = g * n
        if ctx.pre != 1.0:
            g = g * ctx.pre
        if ctx.post != 1.0:
            g = g * ctx.post
        out.append(g)
    return out


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set, ctx.pre, ctx.post = (op, process_set, prescale_factor,
                                                      postscale_factor)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        (g,) = _scatter_grad([grad_output], ctx)
        return allgather(g.contiguous(), process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce tensor across ranks and give rank i the i-th block of rows (the first
    dim0 % size ranks get one row more); differentiable."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set, ctx.pre, ctx.post = (op, process_set, prescale_factor,
                                                      postscale_factor)
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        gs = [g.contiguous() for g in _scatter_grad(grads, ctx)]
        return (None, None, None, None, None,
                *grouped_allgather(gs, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    pairs = [compression.compress(t) for t in tensors]
    out = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                            postscale_factor, *[p[0] for p in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(out, pairs)]


# ---------------------------------------------------------------- handles, join, barrier
def poll(handle):
    """True once the operation of handle has finished (False while in flight)."""
    entry = _handle_map.get(handle)
    if entry is None:
        raise ValueError(f"unknown handle {handle!r}")
    return entry[0].done


def synchronize(handle):
    """Wait for handle's operation and return its output (None for an unknown handle)."""
    if callable(handle):
        return handle()
    entry = _handle_map.pop(handle, None)
    if entry is None:
        return None
    op, finish = entry
    result = _rt().coordinator.wait(op)
    return finish(result)


def join(device=-1):
    """Contribute zeros to other ranks' allreduces until every rank has joined;
    returns the rank that joined last."""
    rt = _rt()
    op = rt.coordinator.submit(co.JOIN, co.JOIN, ("join",), None, 0)
    return int(rt.coordinator.wait(op))


def barrier(process_set=global_process_set):
    """Return once every rank of the process set has entered the barrier."""
    rt = _rt()
    # one name, as Horovod's: a set's members barrier together, whatever else they ran
    op = rt.coordinator.submit("barrier", "barrier", ("barrier",), None,
                               _set_id(process_set))
    rt.coordinator.wait(op)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("torch", "co")]
