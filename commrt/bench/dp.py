"""Data parallel: overlap on/off, weak scaling at N=2, beside PyTorch DDP (Gloo).

    python -m commrt.bench dp [--rounds 3] [--steps 20] [--sizes 2,4] [--no-torch]

Workloads (one thread per rank, float32, synthetic data):
  mlp    MLP 1024-1024-1024-1024-10, batch 16 per rank: 3.1 M parameters (12.6
         MB of gradients) for little compute, so averaging is a large share of
         a step: the model for the overlap target.
  lenet  LeNet-5 on 1x28x28, batch 64 per rank: compute-heavy, small gradients.

Per round, interleaved: commrt with overlap, commrt without overlap (every
all-reduce after backward), PyTorch DDP over Gloo (same shapes, batch,
threads; DDP's default 25 MB buckets, overlapped), and for weak scaling one
rank alone.  Each run times ``--steps`` steps after 3 warm-up steps; the
figure is the median step time of rank 0 (the ranks are synchronous).
Tables print the median over rounds with [min-max] and the ratios.

    python -m commrt.bench dp --link 800mbit [--mtu 9000] [--bucket-kb 64]

runs the overlap comparison on two pretend hosts instead: two network
namespaces joined by a veth pair whose two directions are each shaped to
RATE by tc's token-bucket filter (``tc qdisc add dev VETH root tbf rate
RATE burst BURST latency 50ms``), one rank in each, started by
``commrt-launch --hosts A:1,B:1 --ssh-cmd "ip netns exec"``; the ranks talk
TCP over the link.  There gradient averaging waits on the wire, not on the
CPU, as it does between the machines of a cluster, and overlap has
something to hide.  Needs root and iproute2; the namespaces are removed
afterwards.  Per round, interleaved: overlap, no overlap (in alternating
order) and rank 0 training alone (for the averaging share).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from commrt.bench import _launch, _netns
from commrt.bench._stats import Summary, fmt_num, table

CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "NUMBA_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

WORKLOADS = {
    "mlp": {"batch": 16, "shape": (1024,), "widths": (1024, 1024, 1024, 1024, 10)},
    "lenet": {"batch": 64, "shape": (1, 28, 28)},
}


# ---- commrt side (a rank function for commrt.testing.World) --------------------------
def _model_ours(name):
    from commrt import nn

    nn.manual_seed(0)
    if name == "mlp":
        w = WORKLOADS["mlp"]["widths"]
        layers = []
        for a, b in zip(w, w[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])
    return nn.LeNet()


def _data(name, batch, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + WORKLOADS[name]["shape"]).astype(np.float32)
    return x, rng.integers(0, 10, batch)


def train_steps(comm, name, batch, steps, overlap=True, bucket_kb=1024, warmup=3,
                algorithm=None):
    """Time `steps` data-parallel steps on this rank; returns seconds per step (list)."""
    from commrt import nn, optim
    from commrt.bench.engine import _set_threads
    from commrt.nn import functions as F
    from commrt.parallel import DistributedOptimizer, broadcast_parameters

    _set_threads(1)
    nn.backend.keep_freed_memory()
    model = _model_ours(name)
    broadcast_parameters(model, comm=comm)
    opt = DistributedOptimizer(optim.SGD(model.parameters(), lr=0.01, momentum=0.9), comm,
                               bucket_bytes=bucket_kb << 10, overlap=overlap,
                               algorithm=algorithm)
    x, y = _data(name, batch, comm.rank)
    times = []
    comm.barrier()
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(nn.Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    opt.close()
    return times[warmup:]


def comm_share(comm, name, batch, steps=10, bucket_kb=1024, algorithm=None):
    """Fraction of a no-overlap step spent averaging gradients (rank 0's view)."""
    full = statistics.median(train_steps(comm, name, batch, steps, False, bucket_kb,
                                         algorithm=algorithm))
    alone = comm.split(0 if comm.rank == 0 else None)
    if comm.rank == 0:
        compute = statistics.median(train_steps(alone, name, batch, steps))
    comm.barrier()
    return (full - compute) / full if comm.rank == 0 else None


# ---- PyTorch DDP side (a subprocess per rank) ----------------------------------------
def _torch_rank(rank, world, init, name, batch, steps, warmup=3):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    if name == "mlp":
        w = WORKLOADS["mlp"]["widths"]
        layers = []
        for a, b in zip(w, w[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
    else:
        t = torch.nn
        model = t.Sequential(t.Conv2d(1, 6, 5, padding=2), t.ReLU(), t.MaxPool2d(2),
                             t.Conv2d(6, 16, 5), t.ReLU(), t.MaxPool2d(2), t.Flatten(),
                             t.Linear(400, 120), t.ReLU(), t.Linear(120, 84), t.ReLU(),
                             t.Linear(84, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x, y = (torch.from_numpy(a) for a in _data(name, batch, rank))
    times = []
    dist.barrier()
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return times[warmup:]


def run_torch(world, name, batch, steps, timeout=300):
    """Rank 0's step times of a PyTorch DDP run with `world` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        env = {**os.environ, **CHILD_ENV}
        procs = [subprocess.Popen(
            [sys.executable, "-m", "commrt.bench.dp", "--torch-rank", str(r), "--world",
             str(world), "--init", init, "--model", name, "--batch", str(batch), "--steps",
             str(steps), "--out", f"{tmp}/r{r}.json"], env=env)
            for r in range(world)]
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                rc = p.wait(max(1.0, deadline - time.monotonic()))
                if rc:
                    raise RuntimeError(f"PyTorch DDP rank exited with code {rc}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        with open(f"{tmp}/r0.json") as f:
            return json.load(f)


# ---- two hosts joined by a rate-limited link -------------------------------------------
class Link:
    """Two network namespaces A and B joined by a veth pair, each direction shaped
    to ``rate`` (tc tbf), MTU ``mtu``: two hosts whose link, not the CPU, limits
    communication.  A context manager (needs root and iproute2); on exit it kills
    whatever is left in the namespaces and removes them (_netns's helpers; H
    hosts through a bridge: _netns.Hosts)."""

    def __init__(self, rate="800mbit", mtu=9000, burst=None, latency="50ms"):
        self.rate, self.mtu, self.latency = rate, int(mtu), latency
        # the bucket must hold a whole packet; a few packets keep the rate exact
        self.burst = burst or f"{max(4 * self.mtu, 32 * 1024)}b"
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"crtdp{tag}a", f"crtdp{tag}b")
        self.dev = (f"vdp{tag}a", f"vdp{tag}b")
        net = f"10.253.{os.getpid() % 250}"
        self.addr = (f"{net}.1", f"{net}.2")

    def describe(self):
        return (f"two network namespaces joined by a veth pair, MTU {self.mtu}, each direction "
                f"shaped by `tc qdisc add dev VETH root tbf rate {self.rate} burst {self.burst} "
                f"latency {self.latency}`; one rank per namespace, TCP between them")

    @staticmethod
    def _run(*cmd):
        _netns.run(*cmd)

    def __enter__(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            raise RuntimeError("--link needs root and iproute2 (ip, tc)")
        a, b = self.ns
        try:
            self._run("ip", "netns", "add", a)
            self._run("ip", "netns", "add", b)
            self._run("ip", "link", "add", self.dev[0], "netns", a, "type", "veth", "peer",
                      "name", self.dev[1], "netns", b)
            for ns, dev, addr in zip(self.ns, self.dev, self.addr):
                self._run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                self._run("ip", "-n", ns, "link", "set", dev, "mtu", str(self.mtu))
                self._run("ip", "-n", ns, "link", "set", dev, "up")
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
                _netns.shape(ns, dev, self.rate, self.burst, self.latency)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        _netns.remove(self.ns)

    def launch(self, args, timeout, extra_env=None):
        """Run ``python -m commrt.bench.dp ARGS`` as a 2-rank job, rank 0 in A, rank 1 in B."""
        a, b = self.ns
        rank_env = {**CHILD_ENV, **(extra_env or {})}
        env = {**os.environ, **rank_env}
        cmd = ["ip", "netns", "exec", a, sys.executable, "-m", "commrt.launcher", "-n", "2",
               "--hosts", f"{a}:1,{b}:1", "--ssh-cmd", "ip netns exec", "--bind", self.addr[0],
               "--timeout", str(int(timeout))]
        for k, v in rank_env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd += ["-m", "commrt.bench.dp"] + list(args)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 30)
        if out.returncode:
            raise RuntimeError(f"the job on the link failed ({out.returncode}):\n"
                               f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
        return out.stdout


def _link_rank(models, steps, bucket_kb, algorithm, out, round_index=0):
    """One round on the link (a rank of a commrt-launch job): per model, overlap and
    no overlap, in alternating order, then rank 0 alone; rank 0 writes the medians."""
    import commrt

    comm = commrt.init()
    res = {}
    flip = round_index % 2
    for name in models:
        batch = WORKLOADS[name]["batch"]
        for kind, overlap in [("overlap", True), ("no overlap", False)][::-1 if flip else 1]:
            t = train_steps(comm, name, batch, steps, overlap, bucket_kb, algorithm=algorithm)
            res[f"{name}|2|{kind}"] = _med(t)
        alone = comm.split(0 if comm.rank == 0 else None)
        if comm.rank == 0:
            res[f"{name}|1|alone"] = _med(train_steps(alone, name, batch, steps))
        comm.barrier()
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    comm.close()


def run_link(link, rounds=3, steps=20, models=("lenet",), bucket_kb=64, algorithm=None,
             log=print, extra_env=None, variants=()):
    """Overlap on/off across ``link`` (a Link): {(model, n, kind, variant): [seconds per
    round]}.  ``variants``: extra rank environments ({K: V}), each run as its own job
    in every round, interleaved with the plain one (variant "")."""
    results = {}
    configs = [("", {})] + [(" ".join(f"{k}={v}" for k, v in e.items()), e) for e in variants]
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        for r in range(rounds):
            for label, env in configs:
                out = f"{tmp}/round{r}.json"
                args = ["--link-rank", str(r), "--models", ",".join(models), "--steps",
                        str(steps), "--bucket-kb", str(bucket_kb), "--out", out]
                if algorithm:
                    args += ["--algorithm", algorithm]
                link.launch(args, timeout=600, extra_env={**(extra_env or {}), **env})
                with open(out) as f:
                    for key, v in json.load(f).items():
                        name, n, kind = key.split("|")
                        results.setdefault((name, int(n), kind, label), []).append(v)
            log(f"  round {r + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})")
    return results


def report_link(results):
    lines = []
    for name, label in sorted({(k[0], k[3]) for k in results}):
        ov, no = results[(name, 2, "overlap", label)], results[(name, 2, "no overlap", label)]
        alone = results[(name, 1, "alone", label)]
        share = [(n - a) / n for n, a in zip(no, alone)]
        lines.append(f"{name} (batch {WORKLOADS[name]['batch']} per rank)"
                     + (f", ranks with {label}" if label else "")
                     + f"; gradient averaging is {Summary([100 * x for x in share]).cell()}% "
                       "of a no-overlap step")
        ms = lambda v: Summary([x * 1e3 for x in v]).cell()  # noqa: E731
        lines.append(table(["N", "overlap ms", "no overlap ms", "overlap/no", "rank 0 alone ms"],
                           [["2", ms(ov), ms(no), Summary(_ratios(ov, no)).cell(), ms(alone)]]))
        lines.append("")
    return "\n".join(lines)


# ---- the benchmark --------------------------------------------------------------------
def _med(times):
    return statistics.median(times)


def run(rounds=3, steps=20, sizes=(2, 4), with_torch=True, models=("mlp", "lenet"), log=print,
        bucket_kb=1024, algorithm=None, extra_env=None):
    from commrt.testing import World

    results = {}      # (model, n, kind) -> [median step seconds per round]
    shares = {}
    env = {**CHILD_ENV, **(extra_env or {})}
    worlds = {n: World(n, env=env, timeout=600) for n in sorted(set(sizes) | {1})}
    try:
        for w in worlds.values():
            w.start()
        for name in models:
            batch = WORKLOADS[name]["batch"]
            if 2 in worlds:
                shares[name] = worlds[2].run(comm_share, name, batch, 10, bucket_kb, algorithm,
                                             timeout=600)[0]
            for r in range(rounds):
                for n in sorted(sizes):
                    kinds = [("overlap", True), ("no overlap", False)]
                    for kind, overlap in kinds:
                        t = worlds[n].run(train_steps, name, batch, steps, overlap, bucket_kb,
                                          algorithm=algorithm, timeout=600)
                        results.setdefault((name, n, kind), []).append(_med(t[0]))
                    if with_torch:
                        results.setdefault((name, n, "torch DDP"), []).append(
                            _torch_med(n, name, batch, steps, log))
                    if n == 2:
                        t = worlds[1].run(train_steps, name, batch, steps, True, timeout=600)
                        results.setdefault((name, 1, "overlap"), []).append(_med(t[0]))
                        if with_torch:      # the same weak-scaling ratio for PyTorch
                            results.setdefault((name, 1, "torch DDP"), []).append(
                                _torch_med(1, name, batch, steps, log))
                log(f"  {name}: round {r + 1}/{rounds} done")
    finally:
        for w in worlds.values():
            w.close()
    return results, shares


def _torch_med(n, name, batch, steps, log):
    """Median step of a PyTorch DDP run, or None (reported as missing) if it failed twice."""
    try:
        return _med(run_torch(n, name, batch, steps))
    except RuntimeError as exc:
        log(f"  PyTorch DDP N={n} {name}: {exc}; this round has no PyTorch figure")
        return None


def _cell(values):
    return Summary(values).cell() if values else "n/a"


def _ratios(a, b):
    """Round-by-round ratios, skipping rounds where either side is missing (None)."""
    return [x / y for x, y in zip(a, b) if x is not None and y is not None]


def report(results, shares, sizes=(2, 4)):
    lines = []
    for name in sorted({k[0] for k in results}):
        rows = []
        for n in sorted(sizes):
            ov, no = results.get((name, n, "overlap")), results.get((name, n, "no overlap"))
            th = results.get((name, n, "torch DDP"))
            rows.append([str(n), _cell(_ratios(ov or [], no or [])),
                         _cell(_ratios(ov or [], th or []))])
        ms = {k: [v * 1e3 for v in vals if v is not None] for k, vals in results.items()}
        rows_ms = []
        for row, n in zip(rows, sorted(sizes)):
            ov, no = ms.get((name, n, "overlap")), ms.get((name, n, "no overlap"))
            th = ms.get((name, n, "torch DDP"))
            rows_ms.append([row[0], _cell(ov), _cell(no), row[1], _cell(th), row[2]])
        share = shares.get(name)
        lines.append(f"{name} (batch {WORKLOADS[name]['batch']} per rank); gradient averaging "
                     f"is {fmt_num(100 * share) if share is not None else 'n/a'}% of a "
                     "no-overlap step at N=2")
        lines.append(table(["N", "overlap ms", "no overlap ms", "overlap/no", "torch DDP ms",
                            "commrt/DDP"], rows_ms))
        one, two = results.get((name, 1, "overlap")), results.get((name, 2, "overlap"))
        if one and two:
            eff = _ratios(one, two)
            lines.append(f"weak scaling efficiency at N=2 (t1/t2, same per-rank batch): "
                         f"{Summary(eff).cell()}   (N=1 step {Summary([v * 1e3 for v in one]).cell()} ms)")
        one, two = results.get((name, 1, "torch DDP")), results.get((name, 2, "torch DDP"))
        if one and two:
            lines.append(f"  the same for PyTorch DDP: {_cell(_ratios(one, two))}   "
                         f"(N=1 step {_cell([v * 1e3 for v in one if v is not None])} ms)")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench dp", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sizes", default="2,4")
    p.add_argument("--models", default="mlp,lenet")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--bucket-kb", type=int, default=1024)
    p.add_argument("--algorithm", default=None, help="all-reduce algorithm (default: cost model)")
    p.add_argument("--json", help="also write the raw samples here")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment of every commrt rank (repeatable), e.g. "
                        "COMMRT_SPIN_MAX_US=50")
    p.add_argument("--link", metavar="RATE",
                   help="overlap across two network namespaces joined by a link shaped to RATE "
                        "(tc tbf, e.g. 800mbit); needs root")
    p.add_argument("--mtu", type=int, default=9000, help="MTU of the --link (default 9000)")
    p.add_argument("--link-variant", action="append", default=[], metavar="K=V[,K=V]",
                   help="also run every --link round with this rank environment, interleaved "
                        "(repeatable), e.g. COMMRT_SPIN_MAX_US=50")
    # a rank on the link (internal)
    p.add_argument("--link-rank", type=int, metavar="ROUND", help=argparse.SUPPRESS)
    # a PyTorch DDP rank (internal)
    p.add_argument("--torch-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.torch_rank is not None:
        times = _torch_rank(args.torch_rank, args.world, args.init, args.model, args.batch,
                            args.steps)
        with open(args.out, "w") as f:
            json.dump(times, f)
        _launch.end_gloo_rank()
    models = tuple(args.models.split(","))
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    if args.link_rank is not None:
        _link_rank(models, args.steps, args.bucket_kb, args.algorithm, args.out, args.link_rank)
        return 0
    if args.link:
        link = Link(args.link, mtu=args.mtu)
        print(f"commrt data parallel across a {args.link} link, {args.rounds} rounds x "
              f"{args.steps} steps, one thread per rank, buckets of {args.bucket_kb} KiB, "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
              + (f", {' '.join(args.env)}" if args.env else ""), flush=True)
        print(link.describe(), flush=True)
        with link:
            variants = [dict(kv.split("=", 1) for kv in v.split(",")) for v in args.link_variant]
            results = run_link(link, args.rounds, args.steps, models, args.bucket_kb,
                               args.algorithm, extra_env=extra_env, variants=variants)
        print(report_link(results))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"|".join(map(str, k)): v for k, v in results.items()}, f, indent=1)
        return 0
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(f"commrt data parallel, {args.rounds} rounds x {args.steps} steps, one thread per "
          f"rank, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
          + (f", {' '.join(args.env)}" if args.env else ""), flush=True)
    results, shares = run(args.rounds, args.steps, sizes, not args.no_torch, models,
                          bucket_kb=args.bucket_kb, algorithm=args.algorithm, extra_env=extra_env)
    print(report(results, shares, sizes))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"|".join(map(str, k)): v for k, v in results.items()} | {"shares": shares},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
