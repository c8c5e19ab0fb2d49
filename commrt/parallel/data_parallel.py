"""Data parallel training: every rank holds the whole model, trains on its own
shard of each batch, and the ranks average their gradients before every
update (Horovod's DistributedOptimizer, ChainerMN's multi-node optimizer).

    comm = commrt.init()
    model = build_model()
    broadcast_parameters(model, root=0, comm=comm)        # one starting point
    opt = DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm)
    broadcast_optimizer_state(opt, root=0)
    for x, y in loader:                                  # loader over a DistributedSampler
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()          # buckets are all-reduced while backward goes on
        opt.step()               # waits for the buckets, then updates

Buckets.  The parameters, in reverse registration order (the order backward
produces their gradients), are cut into buckets of about ``bucket_bytes``,
one dtype each.  The buckets are the same on every rank.  A gradient hook
(``Tensor.register_grad_hook``) copies each gradient into its bucket's flat
buffer as soon as backward has finished it; when a bucket is full, its
non-blocking all-reduce starts (``comm.all_reduce(..., async_op=True)``)
while backward computes the layers below: communication overlaps
computation.  Buckets are launched strictly in bucket order, so the
collectives match on every rank even where a rank's graph finishes its
gradients in another order; ``step()`` launches whatever backward did not
(``overlap=False`` launches everything there), waits, and points each
``.grad`` at its average in the bucket before the wrapped optimizer's update.

Threads.  An all-reduce started during backward runs on the communicator's
collectives thread while this thread computes.  The last bucket holds the
first layers' gradients, the last ones backward computes: nothing is left
for it to overlap with, so ``step()`` starts it, like every bucket backward
did not start.  One that ``step()`` starts while none of the earlier ones is
still running runs here, as a blocking call, instead of on the collectives
thread, which would only add two thread wake-ups to the step (and on a busy
host each can wait for a core).  A model that fits in one bucket therefore
has nothing to overlap.

Gradients are bucket views.  After ``step()`` (or ``synchronize()``) each
averaged ``.grad`` is a view into its bucket's buffer (PyTorch DDP's
``gradient_as_bucket_view``): no copy back.  It stays valid until the next
backward pass refills the bucket; copy it to keep it longer.  (Buckets on
the wire in another dtype, ``compression="fp16"``, are cast back into a new
array as before.)

Missing gradients.  Each bucket carries one extra element per parameter,
1 where the rank has a gradient for it and 0 where not, reduced with the
gradients.  A parameter without a gradient on this rank is zero-filled, so
all ranks apply the same average; a parameter without a gradient on every
rank keeps ``grad = None`` and the optimizer skips it, exactly as a single
process would.

GPU parameters.  Parameters on a GPU (CuPy arrays, ``model.to("cuda")``)
train the same way: each gradient is copied to its bucket in host memory,
the buckets are reduced there, and each average is copied back to the
parameter's device as its ``.grad`` (a fresh device array, not a view).
``broadcast_parameters`` likewise stages device parameters through host
memory.  Two copies per gradient per step: commrt has no device transport.

Compression.  ``compression="fp16"`` divides each gradient by the world
size, casts it to float16 (so the sum cannot overflow where the average
fits), sums in float16 and casts back: half the bytes on the wire.

Accumulation.  With ``backward_passes_per_step=k`` the gradients of k
backward passes accumulate locally (summed, as ``.grad`` does) and are
averaged across ranks once, at the k-th pass; call ``step()`` after every
k passes.  Scale each pass's loss by 1/k for the mean over all of them.

Equivalence.  With ``compression=None`` and the same parameters on every
rank, N ranks each on B/N samples of a batch with a mean loss compute the
average of the per-shard mean gradients, which is the gradient of the mean
loss over the B samples: the update equals one process's on the whole batch
up to floating-point rounding (tests/parallel/test_data_parallel.py checks
it in float64 for N = 1..4).
"""
import numpy as np

from commrt.collectives.ops import AVG, SUM
from commrt.nn.backend import device_of, to_device
from commrt.parallel import timeline

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
           "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 256 * 1024
_COMPRESSIONS = (None, "none", "fp16")
_DONE = object()        # bucket.request of an all-reduce that ran on the caller's thread


# ---- buckets --------------------------------------------------------------------------
class _Bucket:
    """A fixed run of parameters of one dtype and their flat reduction buffer:
    gradients first, then one presence flag per parameter."""

    def __init__(self, index, params, wire_dtype):
        self.index = index
        self.params = params
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.data.size
        self.numel = n
        self.buffer = np.zeros(n + len(params), dtype=wire_dtype)
        self.flags = self.buffer[n:]
        self.reset()

    def reset(self):
        self.ready = 0          # parameters whose gradient is in the buffer
        self.started_ns = 0
        self.filled = [False] * len(self.params)
        self.request = None

    def view(self, i):
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.data.size]

    @property
    def nbytes(self):
        return self.buffer.nbytes


class DistributedOptimizer:
    """Wraps an optimizer so that ``step()`` applies the gradients averaged
    over every rank of ``comm``.  See the module docstring.

    optimizer                  any commrt.optim optimizer (its parameters are
                               the ones averaged, in its order)
    comm                       the communicator whose ranks train together
    bucket_bytes               about how many gradient bytes one all-reduce carries
    compression                None or "fp16"
    backward_passes_per_step   backward passes accumulated locally per step
    overlap                    False starts every all-reduce in step(), after
                               backward (for measuring what overlap gains)
    algorithm                  all-reduce algorithm (None: the cost model)

    Other attributes (param_groups, state, state_dict, ...) are the wrapped
    optimizer's.
    """

    def __init__(self, optimizer, comm, bucket_bytes=DEFAULT_BUCKET_BYTES, compression=None,
                 backward_passes_per_step=1, overlap=True, algorithm=None):
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("DistributedOptimizer: the optimizer is already distributed")
        if compression not in _COMPRESSIONS:
            raise ValueError(f"DistributedOptimizer: compression must be None or 'fp16', "
                             f"got {compression!r}")
        if int(backward_passes_per_step) < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be >= 1, "
                             f"got {backward_passes_per_step}")
        if bucket_bytes <= 0:
            raise ValueError(f"DistributedOptimizer: bucket_bytes must be > 0, got {bucket_bytes}")
        self.optimizer = optimizer
        self.comm = comm
        self.bucket_bytes = int(bucket_bytes)
        self.compression = None if compression == "none" else compression
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.overlap = bool(overlap)
        self.algorithm = algorithm
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.buckets = self._make_buckets(params)
        self._where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._passes = {id(p): 0 for p in params}
        self._launched = 0      # buckets 0 .. _launched-1 have their all-reduce started
        self.launch_log = []    # (bucket index, "backward" | "step") of the last step
        self._handles = [p.register_grad_hook(self._on_grad) for p in params] \
            if comm.size > 1 else []

    # -- construction ----------------------------------------------------------------
    def _make_buckets(self, params):
        buckets, run, run_bytes = [], [], 0
        for p in reversed(params):
            if run and (p.data.dtype != run[0].data.dtype or run_bytes >= self.bucket_bytes):
                buckets.append(run)
                run, run_bytes = [], 0
            run.append(p)
            run_bytes += p.data.nbytes
        if run:
            buckets.append(run)
        out = []
        for i, run in enumerate(buckets):
            dtype = run[0].data.dtype
            if self.compression == "fp16" and dtype.kind == "f":
                wire = np.float16
            else:
                wire = dtype
            if dtype.kind not in "fc":
                raise TypeError(f"DistributedOptimizer: parameter of dtype {dtype} cannot be "
                                "averaged")
            out.append(_Bucket(i, run, wire))
        return out

    def __getattr__(self, name):
        # Only reached for names this wrapper lacks: param_groups, state, defaults ...
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self):
        sizes = [b.nbytes for b in self.buckets]
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, size={self.comm.size}, "
                f"buckets={len(sizes)} ({sum(sizes)} bytes), compression={self.compression}, "
                f"backward_passes_per_step={self.backward_passes_per_step}, "
                f"overlap={self.overlap})")

    # -- during backward ---------------------------------------------------------------
    def _on_grad(self, p):
        n = self._passes[id(p)] = self._passes[id(p)] + 1
        if n > self.backward_passes_per_step:
            raise RuntimeError(
                f"DistributedOptimizer: a gradient of shape {tuple(p.shape)} was computed "
                f"{n} times before step(), but backward_passes_per_step="
                f"{self.backward_passes_per_step}; call step() (and zero_grad()) after every "
                f"{self.backward_passes_per_step} backward pass(es)")
        if n < self.backward_passes_per_step:
            return
        bucket, i = self._where[id(p)]
        if bucket.index < self._launched:
            raise RuntimeError("DistributedOptimizer: a gradient arrived after its bucket was "
                               "reduced; call step() before the next backward")
        self._fill(bucket, i)
        if self.overlap:
            self._launch_ready("backward")

    def _fill(self, bucket, i):
        p = bucket.params[i]
        view = bucket.view(i)
        if p.grad is None:
            view[...] = 0
            bucket.flags[i] = 0
        else:
            g = to_device(p.grad, "cpu").reshape(-1)    # a GPU gradient: a host copy
            if self.compression == "fp16" and view.dtype != g.dtype:
                np.multiply(g, 1.0 / self.comm.size, out=view, casting="unsafe")
            else:
                view[...] = g
            bucket.flags[i] = 1
        bucket.filled[i] = True
        bucket.ready += 1

    def _launch_ready(self, when):
        """Start the all-reduce of every complete bucket whose predecessors have started
        (in backward, all but the last bucket: see Threads)."""
        while self._launched < len(self.buckets):
            bucket = self.buckets[self._launched]
            if bucket.ready < len(bucket.params):
                return
            if when == "backward" and self._launched == len(self.buckets) - 1:
                return
            self._start(bucket, when)

    def _start(self, bucket, when):
        op = SUM if bucket.buffer.dtype != bucket.params[0].data.dtype else AVG
        bucket.started_ns = timeline.now_ns()
        if when == "step" and not self._in_flight():
            # Nothing to overlap with any more: run it on this thread (see Threads).
            self.comm.all_reduce(bucket.buffer, op=op, algorithm=self.algorithm)
            bucket.request = _DONE
            timeline.record(f"all-reduce bucket {bucket.index}", "comm", bucket.started_ns,
                            timeline.now_ns(), bytes=bucket.nbytes)
        else:
            bucket.request = self.comm.all_reduce(bucket.buffer, op=op,
                                                  algorithm=self.algorithm, async_op=True)
        self.launch_log.append((bucket.index, when))
        self._launched += 1

    def _in_flight(self):
        """Whether an all-reduce this optimizer started on the collectives thread
        may still be running (a later one must then queue behind it there)."""
        for bucket in self.buckets[:self._launched]:
            req = bucket.request
            if req is not None and req is not _DONE and not req.test():
                return True
        return False

    # -- step ------------------------------------------------------------------------
    def synchronize(self):
        """Finish averaging: start the buckets backward did not, wait for all of
        them, and write the averages into ``.grad``.  ``step()`` calls it; call
        it yourself to clip or inspect the averaged gradients before ``step()``
        (which then does not reduce again)."""
        if self.comm.size == 1:
            return
        if self._launched == len(self.buckets) and self.buckets[-1].request is None:
            return      # already synchronized this step
        for bucket in self.buckets[self._launched:]:
            for i, done in enumerate(bucket.filled):
                if not done:
                    self._fill(bucket, i)
        self._launch_ready("step")
        for bucket in self.buckets:
            if bucket.request is not _DONE:
                with timeline.span(f"all-reduce wait bucket {bucket.index}", "wait"):
                    bucket.request.wait()
                timeline.record(f"all-reduce bucket {bucket.index}", "comm", bucket.started_ns,
                                timeline.now_ns(), bytes=bucket.nbytes)
            self._unpack(bucket)
            bucket.request = None
        for key in self._passes:
            self._passes[key] = 0

    def _unpack(self, bucket):
        for i, p in enumerate(bucket.params):
            if bucket.flags[i] == 0:        # no rank had a gradient: leave it None
                p.grad = None
                continue
            avg = bucket.view(i).reshape(p.data.shape)
            if not isinstance(p.data, np.ndarray):      # a GPU parameter: copy the average back
                p.grad = to_device(avg.astype(p.data.dtype, copy=False), device_of(p.data))
            elif avg.dtype == p.data.dtype:
                p.grad = avg                # a view: see "Gradients are bucket views"
            elif p.grad is None or p.grad.shape != p.data.shape or p.grad.dtype != p.data.dtype:
                p.grad = avg.astype(p.data.dtype, copy=True)
            else:
                p.grad[...] = avg

    def step(self):
        """Average the gradients over the ranks (if not yet done), then update."""
        self.synchronize()
        self.optimizer.step()
        self._new_step()

    def _new_step(self):
        for bucket in self.buckets:
            bucket.reset()
        self._launched = 0
        for key in self._passes:
            self._passes[key] = 0

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)
        if self._launched and any(b.request is not None for b in self.buckets):
            for bucket in self.buckets:      # a step abandoned mid-way: drain its requests
                if bucket.request is not None and bucket.request is not _DONE:
                    bucket.request.wait()
        self._new_step()
        self.launch_log = []

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def close(self):
        """Remove the gradient hooks (the parameters can then train without comm)."""
        for h in self._handles:
            h.remove()
        self._handles = []


def _is_array(a):
    return isinstance(a, np.ndarray) or type(a).__module__.startswith("cupy")


# ---- broadcasting the starting point ------------------------------------------------
def _named_arrays(params):
    """[(name, array)] for a Module (parameters, then buffers), a dict name -> tensor
    or array (a state_dict), a list of (name, tensor) pairs or a list of tensors."""
    if hasattr(params, "named_parameters"):
        items = list(params.named_parameters())
        if hasattr(params, "named_buffers"):
            items += list(params.named_buffers())
    elif isinstance(params, dict):
        items = list(params.items())
    else:
        items = list(params)
        if items and not (isinstance(items[0], tuple) and len(items[0]) == 2):
            items = [(f"param{i}", t) for i, t in enumerate(items)]
    out = []
    for name, t in items:
        arr = t.data if hasattr(t, "data") and not isinstance(t, np.ndarray) else t
        if not _is_array(arr):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(arr).__name__}, "
                            "expected a tensor or array (NumPy, or CuPy on a GPU)")
        out.append((str(name), arr))
    return out


def _describe(shape, dtype):
    return f"shape {tuple(shape)} {dtype}"


def broadcast_parameters(params, root=0, *, comm):
    """Copy root's parameters (and buffers) into every rank's, in place.

    ``params`` is a Module, a state_dict-like dict of tensors or arrays, a list
    of (name, tensor) pairs, or a list of tensors.  Every rank first checks
    that its names, shapes and dtypes are root's; where any rank differs,
    every rank raises ValueError naming the parameter, the rank and both
    shapes, before a byte of weights moves.  The values then travel as one
    broadcast per dtype."""
    items = _named_arrays(params)
    signature = [(name, tuple(a.shape), str(a.dtype)) for name, a in items]
    everyone = comm.all_gather_obj(signature)
    ref = everyone[root]
    problems = []
    for rank, sig in enumerate(everyone):
        if sig == ref:
            continue
        if len(sig) != len(ref):
            problems.append(f"rank {rank} has {len(sig)} parameters, root {root} has {len(ref)}")
        for (name, shape, dtype), (rname, rshape, rdtype) in zip(sig, ref):
            if name != rname:
                problems.append(f"rank {rank}'s parameter {name!r} is root {root}'s {rname!r} "
                                "(the models differ)")
                break
            if shape != rshape or dtype != rdtype:
                problems.append(f"parameter {name!r}: rank {rank} has "
                                f"{_describe(shape, dtype)}, root {root} has "
                                f"{_describe(rshape, rdtype)}")
        if problems:
            break
    if problems:
        raise ValueError("broadcast_parameters: the models differ across ranks: "
                         + "; ".join(problems[:3]))
    by_dtype = {}
    for _, arr in items:
        by_dtype.setdefault(arr.dtype.str, []).append(arr)
    for arrays in by_dtype.values():
        if comm.rank == root:       # GPU parameters through a host copy
            flat = np.concatenate([to_device(a, "cpu").reshape(-1) for a in arrays])
        else:
            flat = np.empty(sum(a.size for a in arrays), dtype=arrays[0].dtype)
        comm.broadcast(flat, root)
        if comm.rank != root:
            at = 0
            for a in arrays:
                a[...] = to_device(flat[at:at + a.size].reshape(a.shape), device_of(a))
                at += a.size


def broadcast_optimizer_state(optimizer, root=0, *, comm=None):
    """Copy root's optimizer state (hyper-parameters, step counts, momentum
    buffers ...) into every rank's optimizer.  ``comm`` defaults to the
    DistributedOptimizer's.  Uses state_dict()/load_state_dict(), so the
    optimizers must hold the same parameters in the same order."""
    if isinstance(optimizer, DistributedOptimizer):
        comm = optimizer.comm if comm is None else comm
        optimizer = optimizer.optimizer
    if comm is None:
        raise TypeError("broadcast_optimizer_state: pass comm= (or a DistributedOptimizer)")
    state = comm.broadcast_obj(optimizer.state_dict() if comm.rank == root else None, root)
    if comm.rank != root:
        optimizer.load_state_dict(state)
