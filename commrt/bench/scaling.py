"""Data-parallel scaling at N = 1, 2, 4, 8: speed-up, efficiency, Amdahl and Gustafson fits.

    python -m commrt.bench scaling [--sizes 1,2,4,8] [--rounds 3] [--steps 10]
                                   [--model lenet] [--plot scaling.png]

Weak scaling: the same batch per rank (``--batch``), so N ranks do N times
the work per step; scaled speed-up S_w(N) = N * t(1) / t(N), efficiency
t(1) / t(N).  Strong scaling: the same global batch (``--global-batch``)
split over the ranks; speed-up S_s(N) = t(1) / t(N), efficiency S_s / N.

Fits (least squares over the measured N > 1):
  Amdahl     S_s(N) = 1 / (f + (1 - f) / N)      f: serial fraction
  Gustafson  S_w(N) = N - f (N - 1)               f: serial fraction of the scaled run
Runs are interleaved (every N once per round, rounds repeated), one thread
per rank; figures are medians over rounds with [min-max].  With more ranks
than cores the ranks share cores and the curves say so.
"""
import argparse
import os
import statistics
import sys

from commrt.bench._stats import Summary, fmt_num, table
from commrt.bench.dp import CHILD_ENV, WORKLOADS, train_steps


def fit_amdahl(ns, speedups):
    """Serial fraction f of Amdahl's law fitted to strong-scaling speed-ups."""
    a = [1 - 1 / n for n in ns]
    b = [1 / s - 1 / n for n, s in zip(ns, speedups)]
    den = sum(x * x for x in a)
    return sum(x * y for x, y in zip(a, b)) / den if den else None


def fit_gustafson(ns, scaled):
    """Serial fraction f of Gustafson's law fitted to weak-scaling (scaled) speed-ups."""
    a = [n - 1 for n in ns]
    b = [n - s for n, s in zip(ns, scaled)]
    den = sum(x * x for x in a)
    return sum(x * y for x, y in zip(a, b)) / den if den else None


def amdahl(n, f):
    return 1 / (f + (1 - f) / n)


def gustafson(n, f):
    return n - f * (n - 1)


def run(sizes, rounds, steps, model, batch, global_batch, algorithm=None, log=print):
    from commrt.testing import World

    times = {}            # (mode, n) -> [median step seconds per round]
    worlds = {}
    try:
        for n in sizes:
            worlds[n] = World(n, env=CHILD_ENV, timeout=900)
            worlds[n].start()
        for r in range(rounds):
            for n in sizes:
                t = worlds[n].run(train_steps, model, batch, steps, True, 1024,
                                  algorithm=algorithm, timeout=900)
                times.setdefault(("weak", n), []).append(statistics.median(t[0]))
                per_rank = max(1, global_batch // n)
                t = worlds[n].run(train_steps, model, per_rank, steps, True, 1024,
                                  algorithm=algorithm, timeout=900)
                times.setdefault(("strong", n), []).append(statistics.median(t[0]))
            log(f"  round {r + 1}/{rounds} done")
    finally:
        for w in worlds.values():
            w.close()
    return times


def analyse(times, sizes):
    base_w, base_s = times[("weak", 1)], times[("strong", 1)]
    out = {"weak": {}, "strong": {}}
    for n in sizes:
        w = [n * a / b for a, b in zip(base_w, times[("weak", n)])]
        s = [a / b for a, b in zip(base_s, times[("strong", n)])]
        out["weak"][n] = {"step": Summary(times[("weak", n)]), "speedup": Summary(w),
                          "eff": Summary([x / n for x in w])}
        out["strong"][n] = {"step": Summary(times[("strong", n)]), "speedup": Summary(s),
                            "eff": Summary([x / n for x in s])}
    ns = [n for n in sizes if n > 1]
    out["amdahl"] = fit_amdahl(ns, [out["strong"][n]["speedup"].median for n in ns])
    out["gustafson"] = fit_gustafson(ns, [out["weak"][n]["speedup"].median for n in ns])
    return out


def report(a, sizes, model, batch, global_batch):
    rows = []
    for n in sizes:
        w, s = a["weak"][n], a["strong"][n]
        rows.append([str(n), fmt_num(w["step"].median * 1e3), w["speedup"].cell(), w["eff"].cell(),
                     fmt_num(s["step"].median * 1e3), s["speedup"].cell(), s["eff"].cell()])
    head = ["N", "weak step ms", "scaled speed-up", "weak eff", "strong step ms", "speed-up",
            "strong eff"]
    fa, fg = a["amdahl"], a["gustafson"]
    fits = (f"Amdahl fit (strong): serial fraction f = {fmt_num(fa)}; predicted speed-up "
            + ", ".join(f"N={n}: {fmt_num(amdahl(n, fa))}" for n in sizes) + "\n"
            f"Gustafson fit (weak): serial fraction f = {fmt_num(fg)}; predicted scaled speed-up "
            + ", ".join(f"N={n}: {fmt_num(gustafson(n, fg))}" for n in sizes))
    return (f"{model}: weak = {batch} images per rank, strong = {global_batch} images split "
            f"over the ranks\n" + table(head, rows) + "\n" + fits)


def plot(a, sizes, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    dense = [1 + i * (max(sizes) - 1) / 100 for i in range(101)]
    ax.plot(dense, dense, ":", color="gray", label="ideal")
    ax.plot(sizes, [a["weak"][n]["speedup"].median for n in sizes], "o", color="C0",
            label="weak (scaled speed-up)")
    ax.plot(dense, [gustafson(n, a["gustafson"]) for n in dense], "-", color="C0",
            label=f"Gustafson f={a['gustafson']:.2f}")
    ax.plot(sizes, [a["strong"][n]["speedup"].median for n in sizes], "s", color="C1",
            label="strong (speed-up)")
    ax.plot(dense, [amdahl(n, a["amdahl"]) for n in dense], "-", color="C1",
            label=f"Amdahl f={a['amdahl']:.2f}")
    ax.set_xlabel("ranks N")
    ax.set_ylabel("speed-up")
    ax.set_xticks(list(sizes))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench scaling",
                                description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", choices=sorted(WORKLOADS), default="lenet")
    p.add_argument("--batch", type=int, default=None, help="weak scaling: images per rank")
    p.add_argument("--global-batch", type=int, default=256, help="strong scaling: images per step")
    p.add_argument("--algorithm", default=None, help="all-reduce algorithm (default: cost model)")
    p.add_argument("--plot", metavar="PNG", help="draw speed-ups and fits to this file")
    args = p.parse_args(argv)
    sizes = sorted({1} | {int(s) for s in args.sizes.split(",")})
    batch = args.batch or WORKLOADS[args.model]["batch"]
    print(f"commrt scaling, {args.model}, {args.rounds} rounds x {args.steps} steps, one thread "
          f"per rank, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    times = run(sizes, args.rounds, args.steps, args.model, batch, args.global_batch,
                args.algorithm)
    a = analyse(times, sizes)
    print(report(a, sizes, args.model, batch, args.global_batch))
    if args.plot:
        plot(a, sizes, args.plot, f"commrt data parallel, {args.model}, {os.cpu_count()} cores")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
