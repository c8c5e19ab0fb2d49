"""DistributedOptimizer: Horovod's optimizer wrapper.

Each parameter's gradient accumulator gets a hook that starts an in-place
allreduce of the gradient as soon as backward has produced it (after
``backward_passes_per_step`` passes), so communication overlaps the rest
of backward; ``step()`` (or ``synchronize()``) waits for them all.  The
coordinator fuses the small ones.  ``groups`` reduce lists of parameters
as one grouped allreduce.
"""
import warnings
from contextlib import contextmanager

import torch

from commrt.horovod.process_sets import global_process_set
from commrt.horovod.torch.compression import Compression
from commrt.horovod.torch.functions import broadcast_object
from commrt.horovod.torch.mpi_ops import (Adasum, Average, allreduce_async_,
                                          gradient_allreduce_async_, grouped_allreduce_async_,
                                          size, sparse_allreduce_async, synchronize)


_WIDE_FLOATS = (torch.float32, torch.float64)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             f"duplicates: {', '.join(dups)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: "
                             + ", ".join(str(i) for i in unnamed))
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._halves = {}                        # parameter -> its float16 gradient buffer
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        if groups is not None:
            if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
                raise ValueError("groups should be a non-negative integer or a list of list of "
                                 "torch.Tensor.")
            if isinstance(groups, list):
                seen = set()
                for grp in groups:
                    for p in grp:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in seen:
                            raise ValueError("A parameter can only appear once in groups.")
                        seen.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}
        import os

        if self.process_set.included() and (size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        if self._groups is not None:
            self._make_groups()
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(acc)

    def _make_groups(self):
        plist = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        names = broadcast_object([self._parameter_names.get(p) for p in plist], root_rank=0,
                                 process_set=self.process_set)
        plist.sort(key=lambda p: names.index(self._parameter_names.get(p)))
        if isinstance(self._groups, list):
            ids = {id(p) for p in plist}
            pgroups = [[p for p in grp if id(p) in ids] for grp in self._groups]
            grouped = {id(p) for grp in pgroups for p in grp}
            pgroups += [[p] for p in plist if id(p) not in grouped]
        else:
            n = self._groups
            k, m = divmod(len(plist), n)
            pgroups = [plist[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]
        for grp in (tuple(g) for g in pgroups if g):
            for p in grp:
                self._p_to_group[p] = grp
            self._group_counts[grp] = 0

    def _scales(self):
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p, name=None):
        if p.grad is None:
            p.grad = p.data.new(p.size()).zero_()
        if name is None:
            name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return sparse_allreduce_async(tensor, name=name, op=self.op,
                                              process_set=self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps):
        name = self._parameter_names.get(ps[0])
        pairs = [self._compression.compress(p.grad) for p in ps]
        pre, post = self._scales()
        handle = grouped_allreduce_async_([t for t, _ in pairs], name=name, op=self.op,
                                          prescale_factor=pre, postscale_factor=post,
                                          process_set=self.process_set)
        return handle, [c for _, c in pairs]

    def _make_hook(self, p):
        name = self._parameter_names.get(p)      # looked up once, not per backward
        full_name = f"allreduce.{name}"
        pre, post = (float(f) for f in self._scales())
        plain = self._compression is Compression.none and self._groups is None
        # fp16 compression of a float32/float64 CPU gradient: the cast into a float16
        # buffer kept per parameter (no allocation a step), then the plain path's
        # one call; decompressed in synchronize as the general path's is
        half = self._compression is Compression.fp16 and self._groups is None
        halves = self._halves

        def hook(*ignore):
            handles, delays = self._handles, self._allreduce_delay
            entry = handles.get(p)
            left = delays[p]
            if entry is not None and entry[0] is not None and left <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times "
                    "before call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert left > 0
            handle, ctx = None, None
            left -= 1
            delays[p] = left
            if left == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        handles[group] = (handle, ctxs)
                        for gp in group:
                            handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                elif plain and p.grad is not None and not p.grad.is_sparse:
                    # the common case in one call (see gradient_allreduce_async_)
                    handle = gradient_allreduce_async_(p.grad, full_name, self.op, pre, post,
                                                       self.process_set)
                elif half and p.grad is not None and p.grad.dtype in _WIDE_FLOATS \
                        and p.grad.is_cpu and not p.grad.is_sparse:
                    grad = p.grad
                    buf = halves.get(p)
                    if buf is None or buf.shape != grad.shape:
                        buf = halves[p] = torch.empty(grad.shape, dtype=torch.float16)
                    buf.copy_(grad)
                    handle = gradient_allreduce_async_(buf, full_name, self.op, pre, post,
                                                       self.process_set)
                    ctx = grad.dtype
                else:
                    handle, ctx = self._allreduce_grad_async(p, name)
            handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Wait for every gradient's allreduce (starting those backward did not)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        done = set()
        for key in self._handles:
            done.update(key) if isinstance(key, tuple) else done.add(key)
        for p in self._requires_update - done:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if isinstance(p, tuple):
                outputs = synchronize(handle)
                for gp, out, gctx in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    gp.grad.set_(self._compression.decompress(out, gctx))
                self._group_counts[p] = 0
                continue
            out = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if self._groups is not None:
                self._group_counts[self._p_to_group[p]] = 0
            if p.grad.is_sparse:
                agg = self._compression.decompress(out, ctx)
                p.grad.zero_().add_(agg if agg.is_sparse else agg.to_sparse())
            elif out is not p.grad or ctx is not None:   # reduced in place: nothing to set
                p.grad.set_(self._compression.decompress(out, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize (call synchronize() first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap a torch optimizer so that step() applies gradients averaged across ranks.
    The result is an instance of a subclass of the optimizer's own class."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by commrt's Horovod API; use "
                                  "op=hvd.Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    base = optimizer.__class__
    cls = type(base.__name__, (base,), dict(_DistributedOptimizer.__dict__))
    cls._hvd_base = base
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
