"""Asynchronous SGD with a parameter server.

Ranks ``0 .. servers-1`` are servers, each holding one contiguous shard of
the flattened parameters and the optimizer state of that shard; the other
ranks are workers.  A worker never waits for the other workers:

    pull every shard (the first time)
    repeat:  compute a gradient on its batch with the parameters it holds
             push each shard's slice of it to that shard's server
             receive the shard's new parameters back (push-and-pull)

A server answers requests in arrival order (``recv`` from ANY_SOURCE): a
push is applied at once (``version += 1``), whatever the version the worker
computed it on; the difference is that gradient's *staleness*, counted in a
histogram.  Messages carry the version in the transport header's ``meta``
field, so a push or a reply is exactly one message.

Bounded staleness (``staleness=S``, Stale Synchronous Parallel, Ho et al.
2013): a server counts each worker's pushes (its clock) and holds back its
reply to a worker whose clock is more than S ahead of the slowest unfinished
worker's, until that one catches up.  S=0 is round-robin synchronous; no
bound (the default) is fully asynchronous (Hogwild-style across processes).

Protocol (a private communicator, so user tags never collide):
    worker -> server  tag PULL, 0 bytes                 send me the shard
    worker -> server  tag PUSH, gradient slice, meta=v  gradient computed on version v
    worker -> server  tag DONE, 0 bytes                 this worker has finished
    server -> worker  tag REPLY, shard, meta=version    the shard after the update

Names: ``ParameterServer`` (serves one shard), ``AsyncWorker`` (a model's
pull/push side), ``run_async_sgd`` (a whole job: roles, training, the final
model on every rank, evaluation and the staleness report).
"""
import collections
import math
import time

import numpy as np

from commrt import nn, optim
from commrt.nn import functions as F

__all__ = ["ParameterServer", "AsyncWorker", "run_async_sgd", "shard_bounds",
           "staleness_summary"]

TAG_PULL, TAG_PUSH, TAG_DONE, TAG_REPLY = 1, 2, 3, 4


def shard_bounds(numel, servers):
    """Element boundaries of the servers' shards (the first numel % servers one longer)."""
    q, r = divmod(numel, servers)
    return [i * q + min(i, r) for i in range(servers + 1)]


def flatten(params, dtype=np.float32):
    return np.concatenate([np.asarray(p.data, dtype).reshape(-1) for p in params]) \
        if params else np.zeros(0, dtype)


def unflatten_into(flat, params):
    at = 0
    for p in params:
        n = p.data.size
        p.data[...] = flat[at:at + n].reshape(p.data.shape)
        at += n


def flat_grad(params, out):
    at = 0
    for p in params:
        n = p.data.size
        if p.grad is None:
            out[at:at + n] = 0
        else:
            out[at:at + n] = p.grad.reshape(-1)
        at += n
    return out


def staleness_summary(hist):
    """'0:12 1:40 2:7  mean 1.0  max 2  (59 updates)' from {staleness: count}."""
    total = sum(hist.values())
    if not total:
        return "no updates"
    mean = sum(k * v for k, v in hist.items()) / total
    bins = " ".join(f"{k}:{hist[k]}" for k in sorted(hist))
    return f"{bins}  mean {mean:.2f}  max {max(hist)}  ({total} updates)"


class ParameterServer:
    """Serves one shard of the parameters until every worker has said DONE.

    comm        the job's (private) communicator
    shard       float array, this server's slice of the flattened parameters
    workers     the workers' ranks
    lr, momentum, weight_decay, nesterov   the SGD rule applied to each push
    total_updates  with ``cosine=True``, the cosine schedule's length in pushes
    staleness   None (unbounded) or S: the SSP bound on clock differences
    """

    def __init__(self, comm, shard, workers, *, lr=0.05, momentum=0.0, weight_decay=0.0,
                 nesterov=False, staleness=None, total_updates=None, cosine=False):
        self.comm = comm
        self.param = nn.Parameter(np.ascontiguousarray(shard))
        self.opt = optim.SGD([self.param], lr=lr, momentum=momentum, nesterov=nesterov,
                             weight_decay=weight_decay)
        self.base_lr, self.cosine, self.total_updates = lr, cosine, total_updates
        self.workers = list(workers)
        self.staleness = staleness
        self.version = 0
        self.clock = {w: 0 for w in self.workers}
        self.active = set(self.workers)
        self.held = []                      # workers whose reply waits for the slowest
        self.hist = collections.Counter()
        self.max_clock_gap = 0
        self.served = collections.Counter()   # pushes per worker

    @property
    def shard(self):
        return self.param.data

    def _apply(self, grad, grad_version):
        self.hist[self.version - grad_version] += 1
        if self.cosine and self.total_updates:
            t = min(self.version, self.total_updates)
            self.opt.param_groups[0]["lr"] = \
                0.5 * self.base_lr * (1 + math.cos(math.pi * t / self.total_updates))
        self.param.grad = grad
        self.opt.step()
        self.param.grad = None
        self.version += 1

    def _may_reply(self, w):
        if self.staleness is None:
            return True
        slowest = min((self.clock[q] for q in self.active), default=self.clock[w])
        return self.clock[w] - slowest <= self.staleness

    def _reply(self, w):
        self.comm.send(self.param.data, w, TAG_REPLY, meta=self.version)

    def _release_held(self):
        still = []
        for w in self.held:
            if self._may_reply(w):
                self._reply(w)
            else:
                still.append(w)
        self.held = still

    def serve(self):
        """Answer pulls and pushes in arrival order until every worker is done.
        Returns this server's statistics."""
        import commrt

        grad = np.empty_like(self.param.data)
        started = time.perf_counter()
        while self.active:
            st = self.comm.recv(grad, commrt.ANY_SOURCE, commrt.ANY_TAG)
            w = st.source
            if st.tag == TAG_PULL:
                self._reply(w)
            elif st.tag == TAG_PUSH:
                if st.nbytes != grad.nbytes:
                    raise ValueError(f"parameter server rank {self.comm.rank}: worker {w} pushed "
                                     f"{st.nbytes} bytes, the shard has {grad.nbytes}")
                self._apply(grad, st.meta)
                self.clock[w] += 1
                self.served[w] += 1
                if self.staleness is not None and len(self.active) > 1:
                    gap = self.clock[w] - min(self.clock[q] for q in self.active)
                    self.max_clock_gap = max(self.max_clock_gap, gap)
                if self._may_reply(w):
                    self._reply(w)
                else:
                    self.held.append(w)
                self._release_held()
            elif st.tag == TAG_DONE:
                self.active.discard(w)
                self._release_held()
            else:
                raise ValueError(f"parameter server: unexpected tag {st.tag} from rank {w}")
        return {"version": self.version, "staleness": dict(self.hist),
                "max_clock_gap": self.max_clock_gap, "served": dict(self.served),
                "seconds": time.perf_counter() - started}


class AsyncWorker:
    """The worker side: holds a model, pulls its parameters from the servers and
    pushes gradients.  ``servers`` are the servers' ranks, ``bounds`` the shard
    boundaries (``shard_bounds``)."""

    def __init__(self, comm, model, servers, bounds):
        self.comm, self.model = comm, model
        self.params = list(model.parameters())
        self.servers, self.bounds = list(servers), bounds
        self.flat = flatten(self.params)
        self.grad = np.empty_like(self.flat)
        self.versions = [0] * len(self.servers)
        self.pushes = 0

    def _receive(self):
        for i, s in enumerate(self.servers):
            st = self.comm.recv(self.flat[self.bounds[i]:self.bounds[i + 1]], s, TAG_REPLY)
            self.versions[i] = st.meta
        unflatten_into(self.flat, self.params)

    def pull(self):
        """Fetch every shard (blocking)."""
        for s in self.servers:
            self.comm.send(np.zeros(0, np.uint8), s, TAG_PULL)
        self._receive()

    def push_pull(self):
        """Push the model's current gradients, then take the servers' new parameters."""
        import commrt

        flat_grad(self.params, self.grad)
        reqs = [self.comm.isend(self.grad[self.bounds[i]:self.bounds[i + 1]], s, TAG_PUSH,
                                meta=self.versions[i])
                for i, s in enumerate(self.servers)]
        self._receive()
        commrt.wait_all(reqs)
        self.pushes += 1

    def done(self):
        for s in self.servers:
            self.comm.send(np.zeros(0, np.uint8), s, TAG_DONE)


def run_async_sgd(comm, model_fn, train_set, *, epochs=10, batch_size=64, lr=0.05, seed=0,
                  servers=1, staleness=None, momentum=0.5, weight_decay=5e-4, augment=None,
                  progress=None, test_loader=None, loss_fn=F.cross_entropy):
    """Train ``model_fn()`` on ``train_set`` with asynchronous SGD; every rank calls it.

    Ranks ``0 .. servers-1`` serve, the others are workers, each on its own
    DistributedSampler shard of the data for ``epochs`` epochs, with
    ``batch_size // workers`` samples per push (so one epoch is as many
    pushes as synchronous SGD at ``batch_size`` has steps, times the workers).
    The servers apply SGD (momentum, weight decay, a cosine schedule over all
    the pushes).  ``augment(images, rng)`` transforms each batch.

    Returns, on every rank, a dict: ``model`` (the final parameters),
    ``test_loss``/``accuracy`` (when ``test_loader`` is given), ``train_loss``
    (the workers' mean over their last epoch), ``images`` (trained on, all
    workers), ``seconds``, ``staleness`` (histogram {versions behind: count},
    all servers), ``staleness_summary``, ``max_clock_gap``, ``pushes``
    (per worker)."""
    from commrt.data import DataLoader
    from commrt.parallel.sampler import DistributedSampler

    if not 1 <= servers < comm.size:
        raise ValueError(f"run_async_sgd: needs 1 <= servers < ranks, got servers={servers} "
                         f"with {comm.size} ranks")
    ps_comm = comm.new_group(list(range(comm.size)))      # a private context for the protocol
    worker_ranks = list(range(servers, comm.size))
    n_workers = len(worker_ranks)
    per_worker = max(1, batch_size // n_workers)
    model = model_fn()
    params = list(model.parameters())
    bounds = shard_bounds(sum(p.data.size for p in params), servers)
    steps_per_epoch = math.ceil(math.ceil(len(train_set) / n_workers) / per_worker)
    total = steps_per_epoch * epochs * n_workers
    comm.barrier()
    start = time.perf_counter()
    out = {"train_loss": None, "images": 0, "pushes": None}
    if comm.rank < servers:
        flat = flatten(params)
        server = ParameterServer(ps_comm, flat[bounds[comm.rank]:bounds[comm.rank + 1]].copy(),
                                 worker_ranks, lr=lr, momentum=momentum, nesterov=momentum > 0,
                                 weight_decay=weight_decay, staleness=staleness,
                                 total_updates=total, cosine=True)
        stats = server.serve()
        shard, mine = server.shard, stats
    else:
        me = comm.rank - servers
        sampler = DistributedSampler(train_set, (me, n_workers), seed=seed)
        loader = DataLoader(train_set, per_worker, sampler=sampler)
        worker = AsyncWorker(ps_comm, model, range(servers), bounds)
        rng = np.random.default_rng([seed, comm.rank])
        worker.pull()
        if progress is not None:
            progress.reset(total=epochs * len(loader))
        model.train()
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            if progress is not None:
                progress.set_description(f"async epoch {epoch + 1}/{epochs}")
            total_loss, seen = 0.0, 0
            for images, labels in loader:
                if augment is not None:
                    images = augment(images, rng)
                for p in params:
                    p.grad = None
                loss = loss_fn(model(nn.Tensor(images)), labels)
                loss.backward()
                worker.push_pull()
                total_loss += loss.item() * len(labels)
                seen += len(labels)
                if progress is not None:
                    progress.update(1)
            out["train_loss"] = total_loss / max(seen, 1)
            out["images"] += seen
        worker.done()
        shard, mine = None, {"pushes": worker.pushes}
    seconds = time.perf_counter() - start
    everyone = comm.all_gather_obj((shard, mine, out["train_loss"], out["images"], seconds))
    flat = np.concatenate([everyone[s][0] for s in range(servers)])
    unflatten_into(flat, params)
    hist = collections.Counter()
    for s in range(servers):
        hist.update({int(k): v for k, v in everyone[s][1]["staleness"].items()})
    result = {
        "model": model,
        "train_loss": float(np.mean([e[2] for e in everyone[servers:]])),
        "images": int(sum(e[3] for e in everyone[servers:])),
        "seconds": max(e[4] for e in everyone),
        "staleness": dict(sorted(hist.items())),
        "staleness_summary": staleness_summary(hist),
        "max_clock_gap": max(everyone[s][1]["max_clock_gap"] for s in range(servers)),
        "pushes": {r: everyone[r][1]["pushes"] for r in worker_ranks},
        "versions": [everyone[s][1]["version"] for s in range(servers)],
    }
    if test_loader is not None:
        from commrt.data import Subset

        ds = test_loader.dataset
        part = DataLoader(Subset(ds, np.arange(comm.rank, len(ds), comm.size)),
                          test_loader.batch_size)
        loss_sum, correct, n = 0.0, 0, len(part.dataset)
        model.eval()
        with nn.no_grad():
            for images, labels in part:
                logits = model(nn.Tensor(images))
                loss_sum += loss_fn(logits, labels, reduction="sum").item()
                correct += int((logits.data.argmax(axis=1) == labels).sum())
        parts = comm.all_gather_obj((loss_sum, correct, n))
        seen = sum(p[2] for p in parts)
        result["test_loss"] = sum(p[0] for p in parts) / seen
        result["accuracy"] = sum(p[1] for p in parts) / seen
    return result
