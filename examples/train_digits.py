"""Train the LeNet-style CNN on scikit-learn's 8x8 handwritten digits, on one
process or many.

    commrt-launch -n 4 examples/train_digits.py            # data parallel (default)
    commrt-launch -n 4 examples/train_digits.py --mode async   # parameter server, no barrier
    commrt-launch -n 2 examples/train_digits.py --mode gpipe   # model/gpipe/1f1b/hybrid
    python examples/train_digits.py [--epochs 30] [--batch-size 32] [--lr 0.05]

Modes: ``dp`` synchronous data parallel (DistributedOptimizer, a
DistributedSampler shard per rank; ``--batch-size`` is the global batch, so
the run follows the single-process one), ``async`` asynchronous SGD with a
parameter server (rank 0 serves, the others train), ``model`` / ``gpipe`` /
``1f1b`` / ``hybrid`` the model split into stages (commrt.parallel.pipeline).
Without a launcher it runs as one process.  Rank 0 shows a progress bar and
prints one summary line: test accuracy, loss, images per second, ranks.
The pieces (``build_model``, ``load_data``, ``train_epoch``, ``evaluate``)
are importable.
"""
import argparse
import os
import sys
import time

import numpy as np

from commrt import nn, optim
from commrt.data import DataLoader, load_digits
from commrt.nn import functions as F


def build_model(seed=0):
    """LeNet adapted to 8x8 images: padded 3x3 convolutions, 2x2 pooling."""
    nn.manual_seed(seed)
    return nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(32, 64),
                    kernel_size=3, padding=(1, 1), hidden=(128, 64))


def load_data(batch_size=32, seed=0, sampler=None):
    """(train_loader, test_loader) over a fixed stratified 80/20 split."""
    train, test = load_digits("train", seed=seed), load_digits("test", seed=seed)
    train_loader = DataLoader(train, batch_size, shuffle=sampler is None, seed=seed,
                              sampler=sampler)
    return train_loader, DataLoader(test, 256)


def augment(images, rng, shift=1):
    """Translate each image by up to ``shift`` pixels (zero fill): the 1438
    training digits are few, and small shifts are the variation they lack."""
    n, _, h, w = images.shape
    padded = np.pad(images, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
    dy, dx = rng.integers(0, 2 * shift + 1, size=(2, n))
    rows = (dy[:, None] + np.arange(h))[:, None, :, None]
    cols = (dx[:, None] + np.arange(w))[:, None, None, :]
    return padded[np.arange(n)[:, None, None, None], np.arange(images.shape[1])[:, None, None],
                  rows, cols]


def train_epoch(model, loader, optimizer, progress=None, rng=None):
    """One pass over ``loader`` (augmented when ``rng`` is given); returns
    (mean loss, images seen)."""
    model.train()
    total, seen = 0.0, 0
    for images, labels in loader:
        if rng is not None:
            images = augment(images, rng)
        loss = F.cross_entropy(model(nn.Tensor(images)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        seen += len(labels)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{total / seen:.4f}", refresh=False)
    return total / max(seen, 1), seen


@nn.no_grad()
def evaluate(model, loader):
    """(mean loss, accuracy) of ``model`` over ``loader``."""
    model.eval()
    total, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        logits = model(nn.Tensor(images))
        total += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.data.argmax(axis=1) == labels).sum())
        seen += len(labels)
    return total / seen, correct / seen


def warm_up(comm, seed=0):
    """Compile the Numba kernels on rank 0 first, then let the other ranks
    load them from Numba's on-disk cache: on a fresh install, four ranks
    compiling the same kernels at once on two cores took ~45 s."""
    if comm is None or comm.size == 1:
        return

    def one_step():
        from commrt.kernels import reduce_into

        model = build_model(seed)
        images, labels = next(iter(load_data(8, seed)[0]))
        F.cross_entropy(model(nn.Tensor(images)), labels).backward()
        reduce_into(np.ones(16, np.float32), np.ones(16, np.float32), "sum")

    if comm.rank == 0:
        one_step()
    comm.barrier()
    if comm.rank != 0:
        one_step()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="dp", help="how the ranks share the work")
    p.add_argument("--epochs", type=int, default=None,
                   help="default 30 on one process, 40 on several ranks (60 for async SGD)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch, split over the ranks; default 32 on one process, 64 on "
                        "several (each rank's share must stay worth its communication)")
    p.add_argument("--lr", type=float, default=None,
                   help="default 0.05; 0.03 for async SGD (stale gradients act as extra momentum)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    dp = p.add_argument_group("data parallel")
    dp.add_argument("--bucket-kb", type=int, default=256, help="gradient bucket size")
    dp.add_argument("--compression", choices=["none", "fp16"], default="none")
    dp.add_argument("--no-overlap", action="store_true",
                    help="all-reduce after backward instead of during it")
    a = p.add_argument_group("async SGD")
    a.add_argument("--servers", type=int, default=1, help="parameter-server ranks")
    a.add_argument("--staleness", type=int, default=None,
                   help="bound: a worker this many versions behind waits (default: unbounded)")
    m = p.add_argument_group("model / pipeline parallel")
    m.add_argument("--micro-batches", type=int, default=4)
    m.add_argument("--stages", type=int, default=2, help="pipeline stages per replica (hybrid)")
    return p.parse_args(argv)


MODES = ("dp", "async", "model", "gpipe", "1f1b", "hybrid")


def init_comm():
    """The world communicator under a launcher (commrt-launch, torchrun, mpirun,
    Slurm), or None for a plain single process."""
    launched = any(k in os.environ for k in ("COMMRT_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                             "PMI_RANK", "SLURM_PROCID"))
    if not launched:
        return None
    import commrt

    return commrt.init()


def make_optimizer(model, args):
    return optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                     weight_decay=5e-4)


def shard_loader(loader, comm):
    """The test loader's samples of this rank (rank r takes r, r + n, ...)."""
    from commrt.data import Subset

    ds = loader.dataset
    return DataLoader(Subset(ds, np.arange(comm.rank, len(ds), comm.size)), loader.batch_size)


def evaluate_distributed(model, test_loader, comm):
    """(loss, accuracy) over the whole test set, each rank evaluating its shard."""
    if comm is None or comm.size == 1:
        return evaluate(model, test_loader)
    shard = shard_loader(test_loader, comm)
    loss, acc = evaluate(model, shard) if len(shard.dataset) else (0.0, 0.0)
    n = len(shard.dataset)
    parts = comm.all_gather_obj((loss * n, acc * n, n))
    seen = sum(p[2] for p in parts)
    return sum(p[0] for p in parts) / seen, sum(p[1] for p in parts) / seen


def train_data_parallel(args, comm, bar):
    """Synchronous data parallel (or plain single-process) training.
    Returns (model, train loss, images trained on by all ranks, train seconds)."""
    from commrt.parallel import (DistributedOptimizer, DistributedSampler,
                                 broadcast_optimizer_state, broadcast_parameters)

    size = 1 if comm is None else comm.size
    rank = 0 if comm is None else comm.rank
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the "
                         f"{size} ranks (it is the global batch)")
    model = build_model(args.seed)
    optimizer = make_optimizer(model, args)
    sampler = None
    if comm is not None:
        broadcast_parameters(model, root=0, comm=comm)
        optimizer = DistributedOptimizer(optimizer, comm, bucket_bytes=args.bucket_kb << 10,
                                         compression=args.compression,
                                         overlap=not args.no_overlap)
        broadcast_optimizer_state(optimizer, root=0)
        sampler = DistributedSampler(load_digits("train", seed=args.seed), comm, seed=args.seed)
    train_loader, _ = load_data(args.batch_size // size, args.seed, sampler=sampler)
    schedule = optim.CosineAnnealingLR(optimizer.optimizer if comm is not None else optimizer,
                                       T_max=args.epochs)
    rng = np.random.default_rng(args.seed if comm is None else [args.seed, rank])
    images, train_time = 0, 0.0
    bar.reset(total=args.epochs * len(train_loader))
    for epoch in range(args.epochs):
        train_loader.set_epoch(epoch)
        bar.set_description(f"epoch {epoch + 1}/{args.epochs}")
        start = time.perf_counter()
        train_loss, seen = train_epoch(model, train_loader, optimizer, bar, rng)
        train_time += time.perf_counter() - start
        images += seen * size
        schedule.step()
    if comm is not None:
        train_loss = float(np.mean(comm.all_gather_obj(train_loss)))
    return model, train_loss, images, train_time


def train_async(args, comm, bar):
    """Asynchronous SGD with a parameter server (commrt.parallel.param_server)."""
    from commrt.parallel import run_async_sgd

    train = load_digits("train", seed=args.seed)
    test_loader = load_data(args.batch_size, args.seed)[1]
    return run_async_sgd(comm, lambda: build_model(args.seed), train, epochs=args.epochs,
                         batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         servers=args.servers, staleness=args.staleness,
                         augment=augment, progress=bar, test_loader=test_loader)


def build_stages(k, seed=0):
    """The digits LeNet cut into k contiguous stages of about equal cost."""
    from commrt.parallel.model_parallel import split_layers

    model = build_model(seed)
    return split_layers(list(model.features) + list(model.classifier), k)


def train_split(args, comm):
    """Model, pipeline and hybrid modes (commrt.parallel.pipeline): ``model`` is
    GPipe with one micro-batch, ``gpipe``/``1f1b`` one pipeline of all the
    ranks, ``hybrid`` data parallel over ``size // --stages`` pipelines (1F1B).
    Returns the pipeline's result dict with ``images`` and ``seconds`` added."""
    from commrt.parallel.pipeline import train_hybrid, train_pipeline

    if comm is None:
        raise SystemExit(f"--mode {args.mode} needs several ranks: commrt-launch -n 2 ...")
    train_loader, test_loader = load_data(args.batch_size, args.seed)
    kw = dict(epochs=args.epochs, progress=not args.no_progress, eval_data=test_loader)
    build = lambda k: build_stages(k, args.seed)  # noqa: E731
    start = time.perf_counter()
    if args.mode == "hybrid":
        result = train_hybrid(comm, build, train_loader, stages=args.stages, schedule="1f1b",
                              micro_batches=args.micro_batches, **kw)
    else:
        schedule, micro = ("gpipe", 1) if args.mode == "model" else (args.mode, args.micro_batches)
        result = train_pipeline(comm, build, train_loader, schedule=schedule,
                                micro_batches=micro, **kw)
    result["seconds"] = time.perf_counter() - start
    result["images"] = args.epochs * len(train_loader.dataset)
    return result


class _NoBar:
    """Stands in for tqdm where it is not installed (``pip install commrt[train]``)."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def main(argv=None):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = _NoBar

    args = parse_args(argv)
    nn.backend.keep_freed_memory()          # reuse activation memory step after step
    comm = init_comm()
    warm_up(comm, args.seed)
    size = 1 if comm is None else comm.size
    rank = 0 if comm is None else comm.rank
    if args.epochs is None:     # async SGD's stale gradients need more passes for the same accuracy
        args.epochs = 30 if size == 1 else (60 if args.mode == "async" else 40)
    if args.batch_size is None:
        args.batch_size = 32 if size == 1 else 64
    if args.lr is None:
        args.lr = 0.03 if args.mode == "async" else 0.05
    try:
        if args.mode in ("model", "gpipe", "1f1b", "hybrid"):
            result = train_split(args, comm)
            if rank == 0:
                print(f"test accuracy {result['accuracy']:.2%}  test loss "
                      f"{result['test_loss']:.4f}  train loss {result['losses'][-1]:.4f}  "
                      f"{result['images'] / result['seconds']:.0f} images/s  ({args.epochs} "
                      f"epochs, {result['seconds']:.1f} s, {size} ranks, {args.mode})", flush=True)
            return result["accuracy"]
        with tqdm(total=1, desc="training", unit="batch", file=sys.stderr,
                  disable=args.no_progress or rank != 0) as bar:
            if args.mode == "async":
                if comm is None or comm.size < 2:
                    raise SystemExit("--mode async needs at least 2 ranks (a server and a worker)")
                out = train_async(args, comm, bar)
                test_loss, accuracy = out["test_loss"], out["accuracy"]
                if rank == 0:
                    print(f"staleness (versions behind when a gradient arrived): "
                          f"{out['staleness_summary']}", flush=True)
                train_loss, images, train_time = out["train_loss"], out["images"], out["seconds"]
            else:
                model, train_loss, images, train_time = train_data_parallel(args, comm, bar)
                test_loss, accuracy = evaluate_distributed(model, load_data(256, args.seed)[1],
                                                           comm)
        if rank == 0:
            print(f"test accuracy {accuracy:.2%}  test loss {test_loss:.4f}  train loss "
                  f"{train_loss:.4f}  {images / train_time:.0f} images/s  ({args.epochs} epochs, "
                  f"{train_time:.1f} s, {size} rank{'s' * (size > 1)}, {args.mode})", flush=True)
        return accuracy
    finally:
        if comm is not None:
            comm.close()


if __name__ == "__main__":
    main()
