"""Pipeline parallel: micro-batches flowing through stages on K ranks.

Entry points (called by examples/train_digits.py ``--mode model|gpipe|1f1b|hybrid``)
-------------------------------------------------------------------------------
``train_pipeline(comm, build_stages, data, *, schedule="1f1b", micro_batches=4,
        optimizer=None, loss_fn=F.cross_entropy, epochs=1, lr_scheduler=None,
        transform=None, eval_data=None, progress=True, measure=False) -> dict``
    ``comm.size`` stages, one per rank (stage = rank).
``train_hybrid(comm, build_stages, data, *, stages=2, ...same keywords...) -> dict``
    ``comm.size // stages`` pipeline replicas trained data parallel: rank r
    is stage ``r % stages`` of replica ``r // stages``; each replica takes a
    contiguous shard of every batch; after the backward pass each stage's
    gradients are summed among the ranks of that stage (a sub-communicator
    from ``comm.split``), BatchNorm buffers are then copied from replica 0.
``train_model_parallel(comm, build_stages, data, ...)``
    (commrt.parallel.model_parallel) = train_pipeline with one micro-batch.

Arguments: ``build_stages(k)`` returns k modules whose composition is the
model (``model_parallel.split_layers(model_layers(model), k)`` does this), or
k callables that each build one, so a rank builds only its own.  ``data`` is
an iterable of (x, y) NumPy batches, the same sequence on every rank (a
DataLoader with a seed; ``set_epoch`` is called when it has one).
``optimizer(params)`` builds a stage's optimizer (default SGD lr=0.05,
momentum=0.9); ``lr_scheduler(opt)`` an optional per-epoch scheduler;
``transform(x)`` is applied to inputs on stage 0 (augmentation);
``eval_data`` is evaluated after training.  ``schedule`` is "gpipe",
"1f1b" or "pipedream" (asynchronous, one update per micro-batch with weight
stashing).  Returns, on every rank: ``losses`` (mean training loss per
epoch), ``test_loss``/``accuracy`` (when eval_data), ``pipeline`` (the
Pipeline), ``steps``; with ``measure=True`` also ``step_stats`` (one
``gather_stats`` result per step).

Schedules, for stage s of K and M micro-batches (F = forward, B = backward,
U = optimizer update)::

    GPipe      F0 F1 .. F(M-1)  B0 B1 .. B(M-1)  U         stash peak M
    1F1B       F0 .. F(w-1) | F(w) B0 F(w+1) B1 .. | .. B(M-1) U
               w = min(K-s-1, M) warm-up forwards    stash peak min(K-s, M)
    PipeDream  as 1F1B, with U after every B; the weights a forward used are
               stashed until its backward (weight stashing)

Both synchronous schedules take (M+K-1)(t_f+t_b) for M(t_f+t_b) of work per
stage: the bubble fraction is (K-1)/(M+K-1).  ``simulate`` replays any
schedule's op lists with given op times (the dependency graph of the real
executor), ``gather_stats`` measures the bubble of a real step.

Exactness: micro-batch i's loss is scaled by n_i/B (its share of the batch),
backwards run in micro-batch order on every stage, so the accumulated
gradients are bit for bit those of one process that runs the same
micro-batches one after the other (tests/parallel/test_pipeline.py).
"""
import time

import numpy as np

from commrt.nn import functions as F
from commrt.nn.layers import Module
from commrt.nn.tensor import Tensor, no_grad
from commrt.parallel import model_parallel as mp
from commrt.parallel import timeline

__all__ = ["Schedule", "GPipeSchedule", "OneFOneBSchedule", "PipeDreamSchedule", "get_schedule",
           "simulate", "bubble_formula", "Pipeline", "gather_stats", "train_pipeline",
           "train_hybrid", "model_layers"]

_TAG_SPAN = 1 << 20


# ---- schedules ------------------------------------------------------------------------
class Schedule:
    """The ordered ops ("F", i), ("B", i), ("U", i) of one stage."""
    name = "?"
    asynchronous = False        # updates inside the step (PipeDream)

    def ops(self, stage, num_stages, m):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"


class GPipeSchedule(Schedule):
    """All forwards, then all backwards (in micro-batch order), one update."""
    name = "gpipe"

    def ops(self, stage, num_stages, m):
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)] + [("U", m - 1)]


class OneFOneBSchedule(Schedule):
    """PipeDream-Flush: K-s-1 warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards, one update."""
    name = "1f1b"
    per_microbatch_update = False

    def ops(self, stage, num_stages, m):
        w = min(num_stages - stage - 1, m)
        ops = [("F", i) for i in range(w)]
        for j in range(m - w):
            ops += [("F", w + j), ("B", j)]
            if self.per_microbatch_update:
                ops.append(("U", j))
        for j in range(m - w, m):
            ops.append(("B", j))
            if self.per_microbatch_update:
                ops.append(("U", j))
        if not self.per_microbatch_update:
            ops.append(("U", m - 1))
        return ops


class PipeDreamSchedule(OneFOneBSchedule):
    """PipeDream (asynchronous 1F1B): an update after every backward; a
    forward uses the weights of the moment and its backward the same ones
    (weight stashing).  Stage s's forward of micro-batch i sees the weights
    after max(0, i-(K-s-1)) updates."""
    name = "pipedream"
    asynchronous = True
    per_microbatch_update = True


_SCHEDULES = {c.name: c for c in (GPipeSchedule, OneFOneBSchedule, PipeDreamSchedule)}


def get_schedule(schedule):
    if isinstance(schedule, Schedule):
        return schedule
    try:
        return _SCHEDULES[str(schedule).lower()]()
    except KeyError:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of "
                         f"{', '.join(_SCHEDULES)}") from None


def bubble_formula(num_stages, m):
    """(K-1)/(M+K-1): the idle fraction of GPipe and 1F1B with equal stages."""
    return (num_stages - 1) / (m + num_stages - 1)


def simulate(schedule, num_stages, m, t_f=1.0, t_b=2.0, t_comm=0.0, t_u=0.0):
    """Replay the schedule's op lists on ideal stages: F(i) on stage s waits
    for F(i) on s-1 (plus t_comm), B(i) for B(i) on s+1, each stage runs its
    ops in order.  t_f and t_b may be per-stage lists.  Returns makespan,
    bubble (idle fraction of K stages over the makespan, updates excluded),
    spans[s] = [(kind, i, start, end)] and peak stash per stage."""
    sched = get_schedule(schedule)
    K = num_stages
    tf = list(t_f) if hasattr(t_f, "__len__") else [t_f] * K
    tb = list(t_b) if hasattr(t_b, "__len__") else [t_b] * K
    ops = [sched.ops(s, K, m) for s in range(K)]
    pos, free = [0] * K, [0.0] * K
    done = {}                                   # (kind, stage, i) -> end time
    spans = [[] for _ in range(K)]
    stash, peak = [0] * K, [0] * K
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for s in range(K):
            while pos[s] < len(ops[s]):
                kind, i = ops[s][pos[s]]
                if kind == "F":
                    dep = 0.0 if s == 0 else done.get(("F", s - 1, i))
                    dep = dep if dep is None or s == 0 else dep + t_comm
                    dur = tf[s]
                elif kind == "B":
                    dep = done.get(("F", s, i)) if s == K - 1 else done.get(("B", s + 1, i))
                    dep = dep if dep is None or s == K - 1 else dep + t_comm
                    dur = tb[s]
                else:
                    dep, dur = 0.0, t_u
                if dep is None:
                    break
                start = max(free[s], dep)
                free[s] = end = start + dur
                done[(kind, s, i)] = end
                spans[s].append((kind, i, start, end))
                if kind == "F":
                    stash[s] += 1
                    peak[s] = max(peak[s], stash[s])
                elif kind == "B":
                    stash[s] -= 1
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{sched.name}: the schedule deadlocks (stage positions {pos})")
    makespan = max(free)
    busy = sum(e - b for sp in spans for k, _, b, e in sp if k != "U")
    return {"makespan": makespan, "bubble": 1.0 - busy / (K * makespan) if makespan else 0.0,
            "spans": spans, "peak_stash": peak}


# ---- the executor ---------------------------------------------------------------------
def model_layers(model):
    """A model as a list of layers whose composition is its forward: ResNet
    (stem, blocks, pooling, head), LeNet (features, classifier), Sequential."""
    from commrt.nn.layers import Sequential
    from commrt.nn.models import LeNet, ResNet

    if isinstance(model, ResNet):
        return mp.resnet_layers(model)
    if isinstance(model, LeNet):
        return list(model.features) + list(model.classifier)
    if isinstance(model, Sequential):
        return list(model)
    raise TypeError(f"model_layers: do not know how to split a {type(model).__name__}; "
                    "give build_stages a list of modules")


def _default_optimizer(params):
    from commrt import optim

    return optim.SGD(params, lr=0.05, momentum=0.9)


class Pipeline:
    """One rank's stage of a pipeline, and the schedule that drives it.

    ``comm``: the ranks of this pipeline, in stage order (stage = comm.rank).
    ``dp_comm``: optional, the ranks holding the same stage in the other
    replicas (hybrid); ``replica``/``replicas`` say which shard of each
    batch this pipeline takes.

    ``train_step(x, y)`` runs one step on a batch (x needed on stage 0, y on
    the last stage; others may pass None) and returns the batch's mean loss
    on the last stage (None elsewhere).  ``last`` holds the step's
    measurements: start_ns/end_ns (monotonic, first forward to last
    backward), busy_ns (forward and backward compute), peak_stash
    (activations kept for a backward), peak_weight_versions (PipeDream),
    f_ns/b_ns (compute per op kind)."""

    def __init__(self, module, comm, *, schedule="1f1b", micro_batches=4,
                 loss_fn=F.cross_entropy, optimizer=None, dp_comm=None, replica=0, replicas=1,
                 transform=None):
        self.module, self.comm = module, comm
        self.stage, self.num_stages = comm.rank, comm.size
        self.schedule = get_schedule(schedule)
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.micro_batches = int(micro_batches)
        self.loss_fn = loss_fn
        self.dp_comm, self.replica, self.replicas = dp_comm, replica, replicas
        if dp_comm is not None and self.schedule.asynchronous:
            raise ValueError("the asynchronous schedule does not combine with data parallel")
        self.transform = transform
        s, k = self.stage, self.num_stages
        self.worker = mp.Stage(module, comm, prev=s - 1 if s > 0 else None,
                               next=s + 1 if s < k - 1 else None)
        params = module.parameters()
        self.optimizer = (optimizer or _default_optimizer)(params) if params else None
        self.last = {}
        self.steps = 0

    is_first = property(lambda self: self.stage == 0)
    is_last = property(lambda self: self.stage == self.num_stages - 1)

    def _shard(self, a):
        if a is None or self.replicas == 1:
            return a
        return np.array_split(np.asarray(a), self.replicas)[self.replica]

    def train_step(self, x, y):
        total = len(x) if x is not None else len(y)
        x, y = self._shard(x), self._shard(y)
        n_local = len(x) if x is not None else len(y)
        m = min(self.micro_batches, n_local)
        bounds = np.linspace(0, n_local, m + 1).round().astype(int)
        bounds = [int(b) for b in bounds]
        if self.is_first and self.transform is not None:
            x = self.transform(x)
        ops = self.schedule.ops(self.stage, self.num_stages, m)
        stash, versions = {}, {}
        version, peak, peak_versions = 0, 0, 1
        busy = f_ns = b_ns = 0
        loss_sum = 0.0
        w = self.worker
        start = end = None
        for kind, i in ops:
            if kind == "F":
                lo, hi = bounds[i], bounds[i + 1]
                xi = Tensor(x[lo:hi]) if self.is_first else None
                yi = y[lo:hi] if self.is_last else None
                wait0 = mp.wait_ns[0]
                t0 = time.monotonic_ns()
                start = start or t0
                h = w.forward(xi, yi, tag=i % _TAG_SPAN, loss_fn=self.loss_fn,
                              loss_scale=(hi - lo) / total)
                t1 = time.monotonic_ns()
                dt = (t1 - t0) - (mp.wait_ns[0] - wait0)
                busy += dt
                f_ns += dt
                if self.is_last:
                    loss_sum += w.last_loss * (hi - lo)
                stash[i] = h
                versions[i] = version
                peak = max(peak, len(stash))
                peak_versions = max(peak_versions, len(set(versions.values()) | {version}))
            elif kind == "B":
                h = stash.pop(i)
                wait0 = mp.wait_ns[0]
                t0 = time.monotonic_ns()
                with timeline.span(f"backward {i}", "compute"):
                    h.backward()
                end = time.monotonic_ns()
                dt = (end - t0) - (mp.wait_ns[0] - wait0)
                busy += dt
                b_ns += dt
                versions.pop(i, None)
            else:
                if self.schedule.asynchronous and stash and self.optimizer is not None:
                    # weight stashing: in-flight micro-batches keep the arrays
                    # their forward used; the update goes to fresh copies
                    for p in self.optimizer._params():
                        p.data = p.data.copy()
                version += 1
                self._update()
        mp.wait_sends()
        self.steps += 1
        self.last = {"start_ns": start, "end_ns": end, "busy_ns": busy, "f_ns": f_ns,
                     "b_ns": b_ns, "peak_stash": peak, "peak_weight_versions": peak_versions,
                     "micro_batches": m, "stage": self.stage}
        return loss_sum / n_local if self.is_last else None

    def _update(self):
        if self.dp_comm is not None and self.dp_comm.size > 1:
            self._all_reduce_grads()
        if self.optimizer is not None:
            with timeline.span("update", "optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad()
        if self.dp_comm is not None and self.dp_comm.size > 1:
            self._sync_buffers()

    def _all_reduce_grads(self):
        params = self.module.parameters()
        if not params:
            return
        sizes = [p.size for p in params]
        flat = np.empty(sum(sizes), params[0].dtype)
        o = 0
        for p, n in zip(params, sizes):
            flat[o:o + n] = 0 if p.grad is None else p.grad.reshape(-1)
            o += n
        with timeline.span("all-reduce grads", "comm", bytes=int(flat.nbytes)):
            self.dp_comm.all_reduce(flat)
        o = 0
        for p, n in zip(params, sizes):
            p.grad = flat[o:o + n].reshape(p.shape).copy()
            o += n

    def _sync_buffers(self):
        for _, b in self.module.named_buffers():
            if isinstance(b, np.ndarray) and b.size:
                self.dp_comm.broadcast(b, root=0)

    @no_grad()
    def evaluate(self, data):
        """(mean loss, accuracy) over ``data`` ((x, y) batches, the same on
        every rank), on every rank of the pipeline (and of all replicas)."""
        self.module.eval()
        loss_sum = correct = seen = 0.0
        w = self.worker
        try:
            for j, (x, y) in enumerate(data):
                x, y = self._shard(x), self._shard(y)
                out = w.forward(Tensor(x) if self.is_first else None, None, tag=j % _TAG_SPAN,
                                loss_fn=None)
                if self.is_last:
                    loss_sum += F.cross_entropy(out, y, reduction="sum").item()
                    correct += int((out.data.argmax(axis=1) == y).sum())
                    seen += len(y)
            mp.wait_sends()
        finally:
            self.module.train()
        sums = np.array([loss_sum, correct, seen], np.float64)
        if self.dp_comm is not None and self.dp_comm.size > 1 and self.is_last:
            self.dp_comm.all_reduce(sums)
        sums = self.comm.broadcast_obj(sums.tolist() if self.is_last else None,
                                       root=self.num_stages - 1)
        loss_sum, correct, seen = sums
        return loss_sum / max(seen, 1), correct / max(seen, 1)


def gather_stats(pipe):
    """Measurements of the last step of every stage of ``pipe`` (a collective
    over its ranks): per stage busy, forward and backward seconds, peak
    stash; the makespan from stage 0's first forward to the last backward
    anywhere (one host: one monotonic clock), the measured bubble
    1 - sum(busy)/(K * makespan), the formula (K-1)/(M+K-1), and the bubble
    ``simulate`` predicts from the measured per-stage op times."""
    rows = pipe.comm.all_gather_obj(pipe.last)
    K, m = len(rows), rows[0]["micro_batches"]
    t0 = rows[0]["start_ns"]
    makespan = max(r["end_ns"] for r in rows) - t0
    busy = [r["busy_ns"] / 1e9 for r in rows]
    tf = [r["f_ns"] / m / 1e9 for r in rows]
    tb = [r["b_ns"] / m / 1e9 for r in rows]
    predicted = simulate(pipe.schedule, K, m, tf, tb)["bubble"] if pipe.schedule.name != "pipedream" \
        else None
    return {"schedule": pipe.schedule.name, "stages": K, "micro_batches": m,
            "makespan_s": makespan / 1e9, "busy_s": busy,
            "bubble": 1.0 - sum(busy) / (K * makespan / 1e9) if makespan > 0 else 0.0,
            "bubble_formula": bubble_formula(K, m), "bubble_simulated": predicted,
            "peak_stash": [r["peak_stash"] for r in rows],
            "peak_weight_versions": [r["peak_weight_versions"] for r in rows]}


# ---- training entry points ------------------------------------------------------------
def _build(build_stages, k, s):
    mods = build_stages(k)
    if len(mods) != k:
        raise ValueError(f"build_stages({k}) returned {len(mods)} stages")
    mod = mods[s]
    if not isinstance(mod, Module) and callable(mod):
        mod = mod()
    return mod


def train_hybrid(comm, build_stages, data, *, stages=2, schedule="1f1b", micro_batches=4,
                 optimizer=None, loss_fn=F.cross_entropy, epochs=1, lr_scheduler=None,
                 transform=None, eval_data=None, progress=True, measure=False):
    """Data parallel across ``comm.size // stages`` pipeline replicas (see the
    module docstring)."""
    if stages < 1 or comm.size % stages:
        raise ValueError(f"train_hybrid: {comm.size} ranks do not divide into pipelines of "
                         f"{stages} stages")
    replicas = comm.size // stages
    replica, stage = divmod(comm.rank, stages)
    pipe_comm = comm.split(replica, stage) if replicas > 1 else comm
    dp_comm = comm.split(stage, replica) if replicas > 1 else None
    module = _build(build_stages, stages, stage)
    pipe = Pipeline(module, pipe_comm, schedule=schedule, micro_batches=micro_batches,
                    loss_fn=loss_fn, optimizer=optimizer, dp_comm=dp_comm, replica=replica,
                    replicas=replicas, transform=transform)
    scheduler = lr_scheduler(pipe.optimizer) if lr_scheduler and pipe.optimizer else None
    bar = None
    if progress and comm.rank == 0:
        from tqdm import tqdm
        try:
            total = epochs * len(data)
        except TypeError:
            total = None
        bar = tqdm(total=total, desc=f"{pipe.schedule.name} x{stages}", unit="batch")
    losses, step_stats = [], []
    try:
        for epoch in range(epochs):
            if hasattr(data, "set_epoch"):
                data.set_epoch(epoch)
            timeline.instant(f"epoch {epoch}", "mark")
            epoch_losses = []
            for x, y in data:
                loss = pipe.train_step(x if pipe.is_first else None, y)
                if pipe.is_last:
                    epoch_losses.append((loss, len(pipe._shard(y))))
                if measure:
                    step_stats.append(gather_stats(pipe))
                if bar is not None:
                    bar.update(1)
            mean = None
            if pipe.is_last:
                n = sum(c for _, c in epoch_losses)
                mean = sum(v * c for v, c in epoch_losses) / max(n, 1)
            mean = pipe_comm.broadcast_obj(mean, root=stages - 1)
            if dp_comm is not None:
                mean = float(np.mean(dp_comm.all_gather_obj(mean)))
            losses.append(mean)
            if bar is not None:
                bar.set_postfix(loss=f"{mean:.4f}", refresh=False)
            if scheduler is not None:
                scheduler.step()
    finally:
        if bar is not None:
            bar.close()
    result = {"losses": losses, "pipeline": pipe, "steps": pipe.steps, "stage": stage,
              "replica": replica}
    if measure:
        result["step_stats"] = step_stats
    if eval_data is not None:
        result["test_loss"], result["accuracy"] = pipe.evaluate(eval_data)
    return result


def train_pipeline(comm, build_stages, data, *, schedule="1f1b", micro_batches=4, **kw):
    """Train with one pipeline of ``comm.size`` stages (see the module docstring)."""
    return train_hybrid(comm, build_stages, data, stages=comm.size, schedule=schedule,
                        micro_batches=micro_batches, **kw)
