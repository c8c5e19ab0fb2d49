"""Parallel modes side by side on one model: none, data, model, GPipe, 1F1B (measured).

    python -m commrt.bench modes [--ranks 2] [--batch 64] [--micro-batches 4]
                                 [--steps 20] [--model lenet|resnet] [--timeline DIR]

One model (the digits LeNet by default, float32), one global batch of B
images, trained for --steps steps in each mode on N real ranks (shared
memory):

  none      one process, batch B (the other ranks wait at a barrier)
  data      N replicas on B/N images each, gradients summed by one fused
            all-reduce per step (DistributedOptimizer with a single bucket)
  model     the model split into N stages (by measured layer time, or
            --balance params by parameter count), batch B, one
            micro-batch (train_model_parallel)
  gpipe     N stages, M micro-batches, GPipe schedule
  1f1b      N stages, M micro-batches, 1F1B schedule

Per mode it reports, measured and not asserted: samples each rank processes
per step; payload bytes each rank sends per step (comm.stats()); memory per
rank, as parameter bytes and the peak of what a step allocates
(activations, gradients, messages: tracemalloc, one separate step); compute
seconds per rank per step and the load balance max/mean; the median time
per step; for the pipelines the bubble measured against (K-1)/(M+K-1) and
the peak number of stashed activations per stage.  Results go to
docs/performance-parallel-modes.md by hand.
"""
import argparse
import statistics
import time
import tracemalloc

import numpy as np

MODES = ("none", "data", "model", "gpipe", "1f1b")


def _model(kind):
    from commrt import nn

    nn.manual_seed(0)
    if kind == "resnet":
        return nn.ResNet(in_channels=1, num_classes=10, width=16, blocks=(1, 1, 1))
    return nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(32, 64),
                    kernel_size=3, padding=(1, 1), hidden=(128, 64))


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n)


def _sent(comm):
    return sum(v["bytes_sent"] for v in comm.stats().values())


def _dp_step(model, opt, comm, x, y, total):
    """Forward/backward on this rank's shard, one fused all-reduce, update;
    returns compute seconds."""
    from commrt import nn
    from commrt.nn import functions as F

    t0 = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(nn.Tensor(x)), y) * (len(x) / total)
    loss.backward()
    busy = time.perf_counter() - t0
    params = model.parameters()
    if comm is not None and comm.size > 1:
        flat = np.concatenate([p.grad.reshape(-1) for p in params])
        comm.all_reduce(flat)
        o = 0
        for p in params:
            p.grad = flat[o:o + p.size].reshape(p.shape)
            o += p.size
    t1 = time.perf_counter()
    opt.step()
    return busy + time.perf_counter() - t1


def run_mode(comm, mode, kind, batch, m, steps, costs=None):
    """Run ``steps`` steps of ``mode`` on this rank; returns its measurements."""
    from commrt import optim
    from commrt.parallel import model_parallel as mp
    from commrt.parallel import pipeline as pl

    x, y = _batch(batch)
    def make_opt(ps):
        return optim.SGD(ps, lr=0.01, momentum=0.9)
    row = {"rank": comm.rank, "mode": mode}
    if mode in ("none", "data"):
        active = mode == "data" or comm.rank == 0
        comm.barrier()
        if not active:
            comm.barrier()
            return None
        model = _model(kind)
        opt = make_opt(model.parameters())
        if mode == "data":
            xs, ys = np.array_split(x, comm.size)[comm.rank], np.array_split(y, comm.size)[comm.rank]
        else:
            xs, ys = x, y
        dcomm = comm if mode == "data" else None

        def step():
            return _dp_step(model, opt, dcomm, xs, ys, batch)
        row["samples"] = len(xs)
    else:
        k = comm.size
        layers = pl.model_layers(_model(kind))
        stages = mp.split_layers(layers, k, costs)
        model = stages[comm.rank]
        pipe = pl.Pipeline(model, comm, schedule="gpipe" if mode == "model" else mode,
                           micro_batches=1 if mode == "model" else m, optimizer=make_opt)

        def step():
            pipe.train_step(x if comm.rank == 0 else None, y)
            return pipe.last["busy_ns"] / 1e9
        row["samples"] = batch
        comm.barrier()
    step()                                         # warm-up (JIT, first allocations)
    step()
    if mode not in ("none",):
        comm.barrier()
    sent0 = _sent(comm)
    times, busy, bubbles, stash = [], [], [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        busy.append(step())
        times.append(time.perf_counter() - t0)
        if mode in ("model", "gpipe", "1f1b"):
            st = pl.gather_stats(pipe)
            bubbles.append(st["bubble"])
            stash = st["peak_stash"]
            formula, simulated = st["bubble_formula"], st["bubble_simulated"]
    row["bytes_per_step"] = (_sent(comm) - sent0) / steps
    if mode in ("model", "gpipe", "1f1b"):
        # gather_stats moves a little pickled traffic too: measure it alone and take it out
        s0 = _sent(comm)
        pl.gather_stats(pipe)
        row["bytes_per_step"] -= _sent(comm) - s0
        row.update(bubble=statistics.median(bubbles), bubble_formula=formula,
                   bubble_simulated=simulated, peak_stash=stash)
    row["param_bytes"] = sum(p.data.nbytes for p in model.parameters())
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    step()
    row["peak_step_bytes"] = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    row["step_s"] = statistics.median(times)
    row["compute_s"] = statistics.median(busy)
    if mode == "none":
        comm.barrier()
    return row


def measure_costs(comm, kind, batch):
    from commrt.parallel import model_parallel as mp
    from commrt.parallel import pipeline as pl

    if comm.rank != 0:
        return None
    return mp.layer_costs(pl.model_layers(_model(kind)), _batch(batch)[0], repeats=7)


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def table(results, batch):
    lines = ["| mode | samples/rank/step | bytes sent/rank/step | params/rank | peak step memory/rank "
             "| compute s/rank (max/mean) | time/step | images/s | bubble (formula) | peak stash |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, rows in results.items():
        rows = [r for r in rows if r is not None]
        comp = [r["compute_s"] for r in rows]
        balance = max(comp) / (sum(comp) / len(comp))
        step = max(r["step_s"] for r in rows)
        bubble = (f"{rows[0]['bubble']:.2f} ({rows[0]['bubble_formula']:.2f}; sim "
                  f"{rows[0]['bubble_simulated']:.2f})" if "bubble" in rows[0] else "-")
        lines.append(
            f"| {mode} | {'/'.join(str(r['samples']) for r in rows)} "
            f"| {'/'.join(_fmt_bytes(r['bytes_per_step']) for r in rows)} "
            f"| {'/'.join(_fmt_bytes(r['param_bytes']) for r in rows)} "
            f"| {'/'.join(_fmt_bytes(r['peak_step_bytes']) for r in rows)} "
            f"| {'/'.join(f'{c * 1e3:.1f}ms' for c in comp)} ({balance:.2f}) "
            f"| {step * 1e3:.1f} ms | {batch / step:.0f} "
            f"| {bubble} | {rows[0].get('peak_stash', '-')} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench modes", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", choices=("lenet", "resnet"), default="lenet")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--balance", choices=("time", "params"), default="time",
                   help="split the stages by measured layer time or by parameter count")
    a = p.parse_args(argv)
    import os

    from commrt.testing import World

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    results = {}
    with World(a.ranks, transport="shm", env=env, timeout=600) as w:
        costs = None
        if a.balance == "time":     # measured once, on rank 0: every mode gets the same split
            costs = w.run(measure_costs, a.model, a.batch, timeout=600)[0]
            from commrt.parallel.model_parallel import partition

            print("layer ms:", " ".join(f"{c * 1e3:.2f}" for c in costs),
                  "-> stage boundaries", partition(costs, a.ranks))
        for mode in a.modes.split(","):
            results[mode] = w.run(run_mode, mode, a.model, a.batch, a.micro_batches, a.steps,
                                  costs, timeout=600)
    print(f"model {a.model}, batch {a.batch}, {a.ranks} ranks, M = {a.micro_batches}, "
          f"{a.steps} steps, stages balanced by {a.balance}; per-rank values separated by /")
    print(table(results, a.batch))
    return 0
