"""Rank functions of the model-parallel, pipeline and timeline tests (run in
spawned worlds: module level, importable)."""
import numpy as np

from commrt import nn, optim
from commrt.nn import functions as F
from commrt.parallel import model_parallel as mp
from commrt.parallel import pipeline as pl

# ---- models and data ---------------------------------------------------------------------


def resnet(seed=0):
    nn.manual_seed(seed)
    return nn.ResNet(in_channels=2, num_classes=5, width=4, blocks=(1, 1, 1), dtype=np.float64)


def mlp(seed=0, widths=(6, 12, 10, 8, 5)):
    nn.manual_seed(seed)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b, dtype=np.float64), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batch(n=8, seed=1, shape=(2, 8, 8), classes=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + shape), rng.integers(0, classes, n)


def grads_of(module):
    return {name: (None if p.grad is None else p.grad.copy()) for name, p in module.named_parameters()}


def _stage_index(layers, k):
    stages = mp.split_layers(layers, k)
    return stages


def reference_microbatched(model, x, y, m):
    """Gradients and losses of one process running the M micro-batches one
    after the other, each loss scaled by its share of the batch."""
    model.zero_grad()
    bounds = [int(b) for b in np.linspace(0, len(x), m + 1).round().astype(int)]
    losses = []
    for i in range(m):
        lo, hi = bounds[i], bounds[i + 1]
        loss = F.cross_entropy(model(nn.Tensor(x[lo:hi])), y[lo:hi])
        losses.append(loss.item())
        (loss * ((hi - lo) / len(x))).backward()
    return losses


# ---- model parallel ------------------------------------------------------------------------

def split_resnet_grads(comm, k_per_rank=1):
    """Split a float64 ResNet into comm.size * k_per_rank stages (stage j on
    rank j % size: with 2 per rank the activation goes round the ranks
    twice, joined on each rank by the delegate); compare loss and every
    gradient bit for bit with the unsplit model on the same rank."""
    model = resnet()
    x, y = batch()
    ref_loss = F.cross_entropy(model(nn.Tensor(x)), y)
    ref_loss.backward()
    ref = {id(p): p.grad.copy() for p in model.parameters()}
    model.zero_grad()

    k = comm.size * k_per_rank
    stages = mp.split_layers(mp.resnet_layers(model), k)
    mine = [j for j in range(k) if j % comm.size == comm.rank]
    h, loss = None, None
    for j in mine:
        prev, nxt = (j - 1) % comm.size, (j + 1) % comm.size
        if j == 0:
            inp = nn.Tensor(x)
        else:
            inp = mp.recv_forward(comm, prev, tag=j - 1, delegate=h)
        out = stages[j](inp)
        if j == k - 1:
            loss = F.cross_entropy(out, y)
            h = loss
        else:
            h = mp.send_forward(out, comm, nxt, tag=j)
    h.backward()
    mp.wait_sends()
    checked, mismatched = 0, []
    for j in mine:
        for name, p in stages[j].named_parameters():
            checked += 1
            if p.grad is None or not np.array_equal(p.grad, ref[id(p)]):
                mismatched.append((j, name))
    return {"loss": None if loss is None else loss.item(), "ref_loss": ref_loss.item(),
            "checked": checked, "mismatched": mismatched, "stages": mine}


def no_grad_and_ints(comm):
    """Forward under no_grad sends no gradient back; non-float tensors travel
    without a graph; shapes and dtypes survive."""
    out = {}
    if comm.rank == 0:
        with nn.no_grad():
            mp.send_forward(nn.Tensor(np.arange(12.0).reshape(3, 4)), comm, 1, tag=5)
        mp.send_forward(nn.Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)), comm, 1, tag=6)
        mp.send_forward(nn.Tensor(np.zeros((0, 3), np.float32)), comm, 1, tag=7)
        mp.wait_sends()
    else:
        a = mp.recv_forward(comm, 0, tag=5)
        b = mp.recv_forward(comm, 0, tag=6)
        c = mp.recv_forward(comm, 0, tag=7)
        out = {"a": (a.data.tolist(), a.requires_grad), "b": (b.data.dtype.str, b.data.tolist(),
                                                               b.requires_grad),
               "c": (c.shape, c.dtype.str, c.requires_grad)}
    # both sides must be in step afterwards: a later exchange still matches
    if comm.rank == 0:
        d = mp.send_forward(nn.Tensor(np.ones(3), requires_grad=True) * 2.0, comm, 1, tag=8)
        d.backward()
        mp.wait_sends()
    else:
        r = mp.recv_forward(comm, 0, tag=8)
        F.sum(r * 3.0).backward()
        mp.wait_sends()
    return out


# ---- pipeline --------------------------------------------------------------------------------

def pipeline_vs_reference(comm, schedule, m, model_kind="resnet", n=8):
    """One training step of a comm.size-stage pipeline; gradients bit for bit
    against one process running the same micro-batches; then one SGD update
    and the parameters again."""
    build = resnet if model_kind == "resnet" else mlp
    x, y = batch(n) if model_kind == "resnet" else batch(n, shape=(6,))
    ref_model = build()
    ref_losses = reference_microbatched(ref_model, x, y, m)
    ref_grads = [p.grad.copy() for p in ref_model.parameters()]
    ref_stages = mp.split_layers(pl.model_layers(ref_model), comm.size)
    index = {id(p): i for i, p in enumerate(ref_model.parameters())}
    my_ref = [ref_grads[index[id(p)]] for p in ref_stages[comm.rank].parameters()]

    model = build()
    stages = mp.split_layers(pl.model_layers(model), comm.size)
    pipe = pl.Pipeline(stages[comm.rank], comm, schedule=schedule, micro_batches=m,
                       optimizer=lambda ps: optim.SGD(ps, lr=0.1))
    grads = {}
    orig_update = pipe._update

    def capture():
        grads["g"] = [p.grad.copy() for p in stages[comm.rank].parameters()]
        orig_update()
    pipe._update = capture
    loss = pipe.train_step(x if comm.rank == 0 else None, y)
    stats = pl.gather_stats(pipe)
    same = [bool(np.array_equal(a, b)) for a, b in zip(grads["g"], my_ref)]
    # the update: the reference with the same rule
    ref_opt = optim.SGD(ref_stages[comm.rank].parameters(), lr=0.1)
    ref_opt.step()
    params_same = [bool(np.array_equal(p.data, q.data)) for p, q in
                   zip(stages[comm.rank].parameters(), ref_stages[comm.rank].parameters())]
    ref_loss = sum(l * (hi - lo) for l, (lo, hi) in zip(
        ref_losses, _pairs(np.linspace(0, n, m + 1).round().astype(int)))) / n
    return {"same": same, "params_same": params_same, "loss": loss, "ref_loss": ref_loss,
            "peak_stash": pipe.last["peak_stash"], "stats": stats}


def _pairs(b):
    return [(int(b[i]), int(b[i + 1])) for i in range(len(b) - 1)]


def pipedream_vs_reference(comm, m, lr=0.1):
    """The asynchronous schedule (an update per micro-batch, weight stashing)
    against a one-process replay in which stage s's forward and backward of
    micro-batch i use its weights after max(0, i-(K-s-1)) updates."""
    K = comm.size
    x, y = batch(2 * m, shape=(6,))
    bounds = _pairs(np.linspace(0, len(x), m + 1).round().astype(int))
    # the replay
    ref_model = mlp()
    ref_stages = mp.split_layers(pl.model_layers(ref_model), K)
    history = [[[p.data.copy() for p in st.parameters()]] for st in ref_stages]
    opts = [optim.SGD(st.parameters(), lr=lr) for st in ref_stages]
    for i, (lo, hi) in enumerate(bounds):
        for s, st in enumerate(ref_stages):
            v = max(0, i - (K - s - 1))
            for p, a in zip(st.parameters(), history[s][v]):
                p.data = a.copy()
        ref_model.zero_grad()
        loss = F.cross_entropy(ref_model(nn.Tensor(x[lo:hi])), y[lo:hi]) * ((hi - lo) / len(x))
        loss.backward()
        for s, st in enumerate(ref_stages):       # W_s^(i+1) = W_s^(i) - lr g_s(i)
            grads = [p.grad.copy() for p in st.parameters()]
            for p, a, g in zip(st.parameters(), history[s][i], grads):
                p.data = a.copy()
                p.grad = g
            opts[s].step()
            history[s].append([p.data.copy() for p in st.parameters()])
    # the pipeline
    model = mlp()
    stages = mp.split_layers(pl.model_layers(model), K)
    pipe = pl.Pipeline(stages[comm.rank], comm, schedule="pipedream", micro_batches=m,
                       optimizer=lambda ps: optim.SGD(ps, lr=lr))
    pipe.train_step(x if comm.rank == 0 else None, y)
    final = [p.data for p in stages[comm.rank].parameters()]
    same = [bool(np.array_equal(a, b)) for a, b in zip(final, history[comm.rank][m])]
    # and it is not simply synchronous SGD: the stale versions matter
    return {"same": same, "versions": pipe.last["peak_weight_versions"],
            "peak_stash": pipe.last["peak_stash"]}


def hybrid_vs_single(comm, stages_per_pipe, m, steps=2):
    """train_hybrid on comm.size ranks against one process on the whole batch
    (same micro-batches per replica shard, gradients summed): parameters after
    ``steps`` SGD steps agree to float64 rounding."""
    x, y = batch(12, shape=(6,))
    data = [(x, y)] * steps
    res = pl.train_hybrid(comm, lambda k: mp.split_layers(pl.model_layers(mlp()), k), data,
                          stages=stages_per_pipe, schedule="1f1b", micro_batches=m,
                          optimizer=lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                          progress=False, epochs=1)
    pipe = res["pipeline"]
    replicas = comm.size // stages_per_pipe
    ref = mlp()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        ref.zero_grad()
        for shard_x, shard_y in zip(np.array_split(x, replicas), np.array_split(y, replicas)):
            for lo, hi in _pairs(np.linspace(0, len(shard_x), m + 1).round().astype(int)):
                loss = F.cross_entropy(ref(nn.Tensor(shard_x[lo:hi])), shard_y[lo:hi])
                (loss * ((hi - lo) / len(x))).backward()
        ref_opt.step()
    ref_stage = mp.split_layers(pl.model_layers(ref), stages_per_pipe)[res["stage"]]
    diffs = [float(np.max(np.abs(p.data - q.data))) for p, q in
             zip(pipe.module.parameters(), ref_stage.parameters())]
    return {"max_diff": max(diffs), "stage": res["stage"], "replica": res["replica"],
            "losses": res["losses"]}


def train_small(comm, schedule, stages=None):
    """The entry point end to end on a learnable problem, with evaluation."""
    from commrt.data import DataLoader, Subset, SyntheticImages

    images = SyntheticImages(384, shape=(1, 8, 8), num_classes=4, noise=0.5, seed=0)
    loader = DataLoader(Subset(images, np.arange(256)), 32, shuffle=True, seed=0)
    test = DataLoader(Subset(images, np.arange(256, 384)), 64)

    def build(k):
        nn.manual_seed(0)
        model = nn.LeNet(in_channels=1, num_classes=4, image_size=8, channels=(4, 8),
                         kernel_size=3, padding=(1, 1), hidden=(32,))
        return mp.split_layers(pl.model_layers(model), k)
    kw = dict(epochs=3, eval_data=test, progress=False, measure=True,
              optimizer=lambda ps: optim.SGD(ps, lr=0.02, momentum=0.9))
    if stages is None:
        res = pl.train_pipeline(comm, build, loader, schedule=schedule, micro_batches=4, **kw)
    else:
        res = pl.train_hybrid(comm, build, loader, stages=stages, schedule=schedule,
                              micro_batches=4, **kw)
    return {"losses": res["losses"], "accuracy": res["accuracy"], "steps": res["steps"],
            "bubble": [s["bubble"] for s in res["step_stats"]]}


# ---- timeline ------------------------------------------------------------------------------------

def pipeline_with_timeline(comm, path_pattern):
    """A few 1F1B steps recorded to a per-rank timeline file."""
    from commrt.parallel import timeline

    timeline.start(path_pattern.replace("{rank}", str(comm.rank)), comm.rank)
    try:
        pipeline_vs_reference(comm, "1f1b", 4, model_kind="mlp")
    finally:
        path = timeline.stop()
    return path
