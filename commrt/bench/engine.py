"""Training engine beside PyTorch CPU: a LeNet training step and Conv2d forward+backward.

    python -m commrt.bench engine [--rounds 5] [--iters 10] [--threads N] [--no-torch]
                                  [--native-blas]

Both engines run in this process with the same thread count (BLAS, Numba and
PyTorch's intra-op pool), alternating round by round (A B A B ...) so that a
machine that drifts between fast and slow states hurts both alike.  Each
round times ``--iters`` repetitions after a warm-up and a short idle pause
(so that neither engine's spinning thread pool eats into the other's round);
the table gives the median per repetition over rounds with its min-max, our
median divided by PyTorch's, and the median of the per-round ratios.

``--native-blas`` re-runs the benchmark in a child process with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (both
together, in that command alone), so that NumPy's OpenBLAS picks the kernels
for this processor instead of the ones the environment pins; PyTorch does not
use that OpenBLAS either way.  The header line names the OpenBLAS kernel set
in use (threadpoolctl's ``architecture``).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np


def _set_threads(n):
    # through commrt's own import: it selects Numba's fork-safe workqueue layer,
    # whose idle threads sleep; Numba's default (OpenMP) would spin beside BLAS
    from commrt.kernels._jit import numba
    numba.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except ImportError:                 # BLAS keeps its own default
        pass


# ---- the workloads: (name, make_ours, make_torch); each make_* returns a step() --------

def _lenet_ours(batch):
    from commrt import nn, optim
    from commrt.data import synthetic_batch
    from commrt.nn import functions as F
    nn.manual_seed(0)
    model = nn.LeNet()
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = synthetic_batch(batch, (1, 28, 28))

    def step():
        loss = F.cross_entropy(model(nn.Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _lenet_torch(batch):
    import torch
    from commrt.data import synthetic_batch
    tnn = torch.nn
    torch.manual_seed(0)
    model = tnn.Sequential(
        tnn.Conv2d(1, 6, 5, padding=2), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(6, 16, 5), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Flatten(),
        tnn.Linear(400, 120), tnn.ReLU(), tnn.Linear(120, 84), tnn.ReLU(), tnn.Linear(84, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = (torch.from_numpy(a) for a in synthetic_batch(batch, (1, 28, 28)))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _conv_ours(shape):
    from commrt import nn
    n, cin, cout, size = shape
    nn.manual_seed(0)
    conv = nn.Conv2d(cin, cout, 3, padding=1)
    x = nn.Tensor(np.random.default_rng(0).standard_normal((n, cin, size, size), dtype=np.float32),
                  requires_grad=True)
    grad = np.ones((n, cout, size, size), np.float32)

    def step():
        x.grad = None
        conv.zero_grad()
        conv(x).backward(grad)
    return step


def _conv_torch(shape):
    import torch
    n, cin, cout, size = shape
    conv = torch.nn.Conv2d(cin, cout, 3, padding=1)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((n, cin, size, size),
                                                                  dtype=np.float32))
    x.requires_grad_()
    grad = torch.ones((n, cout, size, size))

    def step():
        x.grad = None
        conv.zero_grad()
        conv(x).backward(grad)
    return step


WORKLOADS = [
    ("LeNet train step, batch 64, 1x28x28", lambda: _lenet_ours(64), lambda: _lenet_torch(64)),
    ("Conv2d fwd+bwd, 32x16x32x32 -> 32 ch, 3x3", lambda: _conv_ours((32, 16, 32, 32)),
     lambda: _conv_torch((32, 16, 32, 32))),
]


def _time(step, iters):
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - start) / iters


def _cell(samples):
    if not samples:
        return "n/a"
    ms = [s * 1e3 for s in samples]
    return f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})"


def run(rounds=5, iters=10, threads=None, with_torch=True, warmup=3, pause=0.2):
    """{workload: {"ours": [seconds per step, one per round], "torch": [...]}}."""
    from commrt.nn.backend import keep_freed_memory
    keep_freed_memory()                  # process-wide: both engines allocate alike
    threads = threads or os.cpu_count()
    _set_threads(threads)
    if with_torch:
        try:
            import torch
            torch.set_num_threads(threads)
        except ImportError:
            with_torch = False
    results = {}
    for name, make_ours, make_torch in WORKLOADS:
        steps = {"ours": make_ours()}
        if with_torch:
            steps["torch"] = make_torch()
        for step in steps.values():
            for _ in range(warmup):
                step()
        samples = {k: [] for k in steps}
        for _ in range(rounds):                      # interleaved: A B A B ...
            for key, step in steps.items():
                # idle thread pools spin for a while after their last task
                # (OpenBLAS ~0.1 s, OpenMP ms): let the other engine's settle
                time.sleep(pause)
                samples[key].append(_time(step, iters))
        results[name] = samples
    return results, threads


def table(results):
    """Markdown table.  'ratio' divides the medians; 'per-round ratio' is the
    median of each round's ours/theirs, which cancels drift between rounds."""
    lines = ["| workload | commrt ms, median (min-max) | PyTorch ms, median (min-max) | ratio "
             "| per-round ratio |", "|---|---|---|---|---|"]
    for name, s in results.items():
        ours, theirs = s["ours"], s.get("torch", [])
        ratio = paired = "n/a"
        if theirs:
            ratio = f"{statistics.median(ours) / statistics.median(theirs):.2f}x"
            paired = f"{statistics.median(a / b for a, b in zip(ours, theirs)):.2f}x"
        lines.append(f"| {name} | {_cell(ours)} | {_cell(theirs)} | {ratio} | {paired} |")
    return "\n".join(lines)


_PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _blas_kernels():
    """OpenBLAS's kernel set (e.g. 'Haswell', 'SkylakeX'), or 'unknown'."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    for pool in threadpool_info():
        if pool.get("internal_api") == "openblas":
            return pool.get("architecture") or "unknown"
    return "unknown"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench engine",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--iters", type=int, default=10, help="steps timed per round (default 10)")
    p.add_argument("--threads", type=int, default=None, help="threads for both (default: all cores)")
    p.add_argument("--no-torch", action="store_true", help="time commrt alone")
    p.add_argument("--pause", type=float, default=0.2,
                   help="seconds of idle before each timed round (default 0.2)")
    p.add_argument("--native-blas", action="store_true",
                   help="re-run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (see above)")
    args = p.parse_args(argv)
    if args.native_blas and any(k in os.environ for k in _PINNED):
        import subprocess
        env = {k: v for k, v in os.environ.items() if k not in _PINNED}
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--native-blas"]
        if rest[:1] == ["engine"]:
            rest = rest[1:]
        return subprocess.call([sys.executable, "-m", "commrt.bench", "engine", *rest], env=env)
    results, threads = run(args.rounds, args.iters, args.threads, not args.no_torch,
                           pause=args.pause)
    print(f"engine benchmark: {threads} threads, {args.rounds} rounds x {args.iters} steps, "
          f"numpy {np.__version__} (OpenBLAS {_blas_kernels()} kernels), torch {_torch_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(table(results))
    return 0


def _torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "not installed"
