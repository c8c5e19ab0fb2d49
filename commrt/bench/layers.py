"""LeNet training step per layer: one process alone against two at once (no communication).

    python -m commrt.bench layers [--rounds 4] [--steps 40] [--env K=V ...]

What a second rank costs the engine itself, before any communication: each
round runs the LeNet step of ``commrt.bench dp`` (batch 64, 1x28x28, one
thread, the ranks' environment) in one process alone, then in two identical
processes started together on a shared start time, neither talking to the
other.  Every ``Function``'s forward and backward is timed (wall clock,
``time.perf_counter``) and so is the whole step; a process reports its
medians over ``--steps`` steps after 5 warm-up steps.  The table gives, per
layer in call order, the median over rounds of process 0's medians alone
and beside the other, the difference and the ratio (alone / both: 1.0 means
no loss), and the step's per-round ratios.  ``--env K=V`` sets a variable in
both arms (e.g. COMMRT_CONV_CHUNK_BYTES=0 for the whole-batch convolutions).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _child(start_at, steps, out):
    from commrt import nn, optim
    from commrt.bench.dp import _data
    from commrt.bench.engine import _set_threads
    from commrt.nn import functions as F
    from commrt.nn.tensor import Function

    _set_threads(1)
    nn.backend.keep_freed_memory()
    times, calls = {}, [0]

    def timed(cls):
        forward, backward = cls.forward, cls.backward

        def fwd(self, *xs):
            self._bench_key = f"{calls[0]:02d} {cls.__name__}"
            calls[0] += 1
            t0 = time.perf_counter()
            y = forward(self, *xs)
            times.setdefault(self._bench_key + " forward", []).append(time.perf_counter() - t0)
            return y

        def bwd(self, gy):
            t0 = time.perf_counter()
            g = backward(self, gy)
            times.setdefault(self._bench_key + " backward", []).append(time.perf_counter() - t0)
            return g
        cls.forward, cls.backward = fwd, bwd

    pending, seen = [Function], set()
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
    for cls in seen:
        if "forward" in cls.__dict__:
            timed(cls)

    nn.manual_seed(0)
    model = nn.LeNet()
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = _data("lenet", 64, 0)

    def step():
        calls[0] = 0
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(nn.Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.setdefault("step", []).append(time.perf_counter() - t0)

    for _ in range(5):
        step()
    times.clear()
    while time.time() < start_at:
        time.sleep(0.001)
    for _ in range(steps):
        step()
    with open(out, "w") as f:
        json.dump({k: statistics.median(v) for k, v in times.items()}, f)


def _run(n, steps, env, tmp):
    """Process 0's per-layer medians, with n processes started together."""
    from commrt.bench.dp import CHILD_ENV
    full = {**os.environ, **CHILD_ENV, **env}
    start = time.time() + 3.0                       # after every child's imports and warm-up
    procs = [subprocess.Popen([sys.executable, "-m", "commrt.bench.layers", "--child",
                               str(start), "--steps", str(steps), "--out", f"{tmp}/p{r}.json"],
                              env=full) for r in range(n)]
    for p in procs:
        if p.wait(600):
            raise RuntimeError(f"a layers benchmark process exited with code {p.returncode}")
    with open(f"{tmp}/p0.json") as f:
        return json.load(f)


def run(rounds=4, steps=40, env=None, log=print):
    """[(alone, both)] per round, each {key: seconds}."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            out.append((_run(1, steps, env or {}, tmp), _run(2, steps, env or {}, tmp)))
            log(f"  round {r + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})")
    return out


def report(results, min_ms=0.02):
    def key(k):                                     # layers in call order, the step last
        return (k == "step", k)
    lines = [f"{'layer':28s} {'alone ms':>9s} {'both ms':>9s} {'loss ms':>8s} {'alone/both':>10s}"]
    for k in sorted(results[0][0], key=key):
        a = statistics.median(r[0][k] for r in results) * 1e3
        b = statistics.median(r[1][k] for r in results) * 1e3
        if max(a, b) >= min_ms or k == "step":
            lines.append(f"{k:28s} {a:9.3f} {b:9.3f} {b - a:8.3f} {a / b:10.3f}")
    lines.append("step alone/both per round: "
                 + ", ".join(f"{r[0]['step'] / r[1]['step']:.3f}" for r in results))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench layers",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment of both arms (repeatable)")
    p.add_argument("--child", type=float, metavar="START", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.steps, args.out)
        return 0
    env = dict(kv.split("=", 1) for kv in args.env)
    print(f"LeNet step per layer, one process alone against two at once, {args.rounds} rounds x "
          f"{args.steps} steps, one thread each, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}" + (f", {' '.join(args.env)}" if args.env else ""), flush=True)
    print(report(run(args.rounds, args.steps, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
