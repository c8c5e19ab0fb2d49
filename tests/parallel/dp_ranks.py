"""Rank functions for the data-parallel tests (run in spawned worlds), and the
single-process references they are compared with."""
import numpy as np

from commrt import nn, optim
from commrt.nn import functions as F
from commrt.nn.backend import device_of, to_device
from commrt.parallel import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters


# ---- a small float64 CNN and its data ------------------------------------------------
def small_model(seed=0, hidden=16, dtype=np.float64):
    nn.manual_seed(seed)
    return nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(4, 8), kernel_size=3,
                    padding=(1, 1), hidden=(hidden,), dtype=dtype)


def batches(steps, batch, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 1, 8, 8)).astype(dtype), rng.integers(0, 10, batch))
            for _ in range(steps)]


def make_optimizer(kind, params):
    if kind == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if kind == "adam":
        return optim.Adam(params, lr=1e-2, weight_decay=1e-3)
    raise ValueError(kind)


def reference(steps, batch, kind, passes=1):
    """One process on the whole batch: the parameters after ``steps`` updates."""
    model = small_model(0)
    opt = make_optimizer(kind, model.parameters())
    for x, y in batches(steps, batch):
        opt.zero_grad()
        for part in np.array_split(np.arange(batch), passes):
            loss = F.cross_entropy(model(nn.Tensor(x[part])), y[part]) * (1.0 / passes)
            loss.backward()
        opt.step()
    return [p.data.copy() for p in model.parameters()]


def _group(comm, n):
    return comm if n == comm.size else comm.new_group(list(range(n)))


# ---- equivalence ------------------------------------------------------------------
def equivalence(comm, n, steps, batch, kind, bucket_bytes, passes=1, overlap=True,
                device="cpu"):
    """Ranks 0..n-1 train data parallel, each on its 1/n of every batch (in
    ``passes`` backward passes), on ``device`` ('cpu' or 'cuda'); returns the
    final parameters (rank 0 ..n-1), in host memory."""
    group = _group(comm, n)
    if group is None:
        return None
    # rank 0 holds the reference's model; the others start elsewhere until the broadcast
    model = small_model(seed=0 if group.rank == 0 else 100 + group.rank).to(device)
    broadcast_parameters(model, root=0, comm=group)
    opt = DistributedOptimizer(make_optimizer(kind, model.parameters()), group,
                               bucket_bytes=bucket_bytes, backward_passes_per_step=passes,
                               overlap=overlap)
    for x, y in batches(steps, batch):
        shard = np.array_split(np.arange(batch), group.size)[group.rank]
        opt.zero_grad()
        for part in np.array_split(shard, passes):
            xs, ys = to_device(x[part], device), to_device(y[part], device)
            loss = F.cross_entropy(model(nn.Tensor(xs)), ys) * (1.0 / passes)
            loss.backward()
        opt.step()
    if device != "cpu":
        assert all(p.device.startswith("cuda") and p.grad is not None
                   and device_of(p.grad) == p.device for p in model.parameters())
    return [to_device(p.data, "cpu").copy() for p in model.parameters()]


def broadcast_start(comm):
    model = small_model(seed=100 + comm.rank)
    broadcast_parameters(model, root=comm.size - 1, comm=comm)
    return [p.data.copy() for p in model.parameters()]


# ---- buckets and overlap order ----------------------------------------------------------
def bucket_layout(comm, bucket_bytes, overlap):
    model = small_model(0)
    names = {id(p): name for name, p in model.named_parameters()}
    opt = DistributedOptimizer(make_optimizer("sgd", model.parameters()), comm,
                               bucket_bytes=bucket_bytes, overlap=overlap)
    layout = [[names[id(p)] for p in b.params] for b in opt.buckets]
    nbytes = [sum(p.data.nbytes for p in b.params) for b in opt.buckets]
    logs = []
    for x, y in batches(2, 8, seed=comm.rank):
        opt.zero_grad()
        F.cross_entropy(model(nn.Tensor(x)), y).backward()
        during = list(opt.launch_log)           # what started before step()
        opt.step()
        logs.append((during, list(opt.launch_log)))
    return layout, nbytes, logs, [n for n, _ in model.named_parameters()]


def grads_as_views(comm, overlap):
    """Two steps: after each, every .grad is a view into its bucket holding the
    average (checked here against an all-reduce of a copy of the local grads);
    returns (views everywhere, averages right, a collectives thread started)."""
    import threading

    def workers():
        return sum(t.name == "commrt-collectives" for t in threading.enumerate())

    comm = comm.split(0)            # a fresh communicator: no collectives thread yet
    before = workers()
    model = small_model(0)
    opt = DistributedOptimizer(make_optimizer("sgd", model.parameters()), comm,
                               bucket_bytes=2048, overlap=overlap)
    views, right = [], []
    for x, y in batches(2, 8, seed=comm.rank):
        opt.zero_grad()
        F.cross_entropy(model(nn.Tensor(x)), y).backward()
        local = [p.grad.copy() for p in model.parameters()]
        opt.synchronize()
        views.append(all(any(np.shares_memory(p.grad, b.buffer) for b in opt.buckets)
                         for p in model.parameters()))
        right.append(all(np.allclose(p.grad, g) for p, g in zip(model.parameters(),
                                                                 _average(comm, local))))
        opt.step()
    return all(views), all(right), workers() > before


def _average(comm, arrays):
    out = []
    for a in arrays:
        a = a.copy()
        comm.all_reduce(a)
        out.append(a / comm.size)
    return out


# ---- missing gradients -------------------------------------------------------------
class Branches(nn.Module):
    """trunk -> head_a always; head_b only when asked; unused never."""

    def __init__(self):
        super().__init__()
        nn.manual_seed(3)
        self.trunk = nn.Linear(4, 4, dtype=np.float64)
        self.head_a = nn.Linear(4, 2, dtype=np.float64)
        self.head_b = nn.Linear(4, 2, dtype=np.float64)
        self.unused = nn.Linear(4, 2, dtype=np.float64)

    def forward(self, x, use_b):
        h = F.relu(self.trunk(x))
        out = self.head_a(h)
        if use_b:
            out = out + self.head_b(h)
        return F.sum(out * out)


def missing_grads(comm, bucket_bytes):
    """Only rank 1 uses head_b; nobody uses `unused`."""
    model = Branches()
    opt = DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1), comm,
                               bucket_bytes=bucket_bytes)
    x = np.random.default_rng(comm.rank).standard_normal((3, 4))
    opt.zero_grad()
    model(nn.Tensor(x), use_b=comm.rank == 1).backward()
    local = {n: (None if p.grad is None else p.grad.copy()) for n, p in model.named_parameters()}
    opt.synchronize()
    averaged = {n: (None if p.grad is None else p.grad.copy()) for n, p in model.named_parameters()}
    opt.step()
    after = {n: p.data.copy() for n, p in model.named_parameters()}
    return local, averaged, after


# ---- fp16 compression ----------------------------------------------------------------
def compressed(comm, compression):
    """Average one backward's gradients; returns (local grads, averaged grads,
    payload bytes this rank sent)."""
    model = small_model(0, dtype=np.float32)
    opt = DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1), comm,
                               bucket_bytes=1 << 30, compression=compression)
    (x, y), = batches(1, 8, seed=comm.rank, dtype=np.float32)
    opt.zero_grad()
    F.cross_entropy(model(nn.Tensor(x)), y).backward()
    local = [p.grad.copy() for p in model.parameters()]
    comm.barrier()
    before = sum(s["bytes_sent"] for s in comm.stats().values())
    opt.synchronize()
    sent = sum(s["bytes_sent"] for s in comm.stats().values()) - before
    return local, [p.grad.copy() for p in model.parameters()], sent


# ---- misuse ----------------------------------------------------------------------------
def too_many_passes(comm):
    model = small_model(0)
    opt = DistributedOptimizer(make_optimizer("sgd", model.parameters()), comm,
                               backward_passes_per_step=2)
    (x, y), = batches(1, 6)
    opt.zero_grad()
    for _ in range(2):
        F.cross_entropy(model(nn.Tensor(x)), y).backward()
    try:
        F.cross_entropy(model(nn.Tensor(x)), y).backward()
    except RuntimeError as exc:
        opt.zero_grad()                 # drains the buckets the second pass started
        return str(exc)
    return None


def mismatched(comm):
    model = small_model(0, hidden=16 if comm.rank != 1 else 24)
    try:
        broadcast_parameters(model, root=0, comm=comm)
    except ValueError as exc:
        return str(exc)
    return None


def optimizer_state(comm):
    model = small_model(0)
    inner = make_optimizer("adam", model.parameters())
    if comm.rank == 0:          # rank 0 alone takes a step: its Adam moments are non-zero
        (x, y), = batches(1, 4)
        F.cross_entropy(model(nn.Tensor(x)), y).backward()
        inner.step()
    opt = DistributedOptimizer(inner, comm)
    broadcast_optimizer_state(opt, root=0)
    st = inner.state_dict()["state"]
    return {i: {k: (v.copy() if hasattr(v, "copy") else v) for k, v in s.items()}
            for i, s in st.items()}


# ---- asynchronous SGD ------------------------------------------------------------------
def digits_model():
    nn.manual_seed(0)
    return nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(8, 16), kernel_size=3,
                    padding=(1, 1), hidden=(32,))


def async_digits(comm, n, epochs, servers, staleness):
    """run_async_sgd on ranks 0..n-1 (the first `servers` serve) over the digits."""
    from commrt.data import DataLoader, load_digits
    from commrt.parallel import run_async_sgd

    group = _group(comm, n)
    if group is None:
        return None
    out = run_async_sgd(group, digits_model, load_digits("train"), epochs=epochs, batch_size=48,
                        lr=0.05, servers=servers, staleness=staleness,
                        test_loader=DataLoader(load_digits("test"), 256))
    out["params"] = [p.data.copy() for p in out.pop("model").parameters()]
    return out


def async_reference(epochs, batch_size, lr=0.05, momentum=0.5, weight_decay=5e-4):
    """What one worker and one server must compute: plain SGD on the worker's
    sampler order with the server's rule and cosine schedule."""
    import math

    from commrt.data import DataLoader, load_digits
    from commrt.parallel import DistributedSampler

    train = load_digits("train")
    model = digits_model()
    opt = optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True,
                    weight_decay=weight_decay)
    sampler = DistributedSampler(train, (0, 1), seed=0)
    loader = DataLoader(train, batch_size, sampler=sampler)
    total, t = epochs * len(loader), 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            opt.param_groups[0]["lr"] = 0.5 * lr * (1 + math.cos(math.pi * t / total))
            opt.zero_grad()
            F.cross_entropy(model(nn.Tensor(images)), labels).backward()
            opt.step()
            t += 1
    return [p.data.copy() for p in model.parameters()]
