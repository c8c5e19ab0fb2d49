"""Collective bandwidth and latency per algorithm, with OpenMPI and Gloo (nccl-tests metrics).

    python -m commrt.bench allreduce [--kind all_reduce|broadcast|reduce|gather|scatter|
                                      all_gather|reduce_scatter|all_to_all|barrier]
        [--nranks 2,4,8] [--sizes 8,1K,64K,1M,16M,64M] [--algos ring,tree,...,auto]
        [--transport shm|tcp] [--rounds 3] [--peers] [--plot out.png] [--json out.json]

For every world size, size and algorithm (``auto`` is the cost model's
choice), the time of one float32 SUM collective (slowest rank's average over
a timed loop), algbw = size / time and busbw as nccl-tests define it:
all_reduce algbw·2(N-1)/N, broadcast algbw, all_gather and reduce_scatter
algbw·(N-1)/N (size = the N-block buffer); the others as in ``collectives``,
the one command for every collective at once.  ``--peers`` adds, in the same
run and interleaved round by round, mpi4py on OpenMPI (default settings and
with single-copy disabled) and torch.distributed on Gloo.  Every number is
the median of ``--rounds`` rounds, with its range.  ``auto/best`` is the
automatic choice's time over the best fixed algorithm's (target <= 1.10).
"""
import argparse
import json
import os
import sys
import tempfile

from commrt.bench import _launch
from commrt.bench._stats import Summary, fmt_size, parse_size, table

from commrt.bench._coll import KINDS  # noqa: E402
PEERS = {
    "ompi": ["pml", "ob1", "btl", "self,vader"],
    "ompi-nocma": ["pml", "ob1", "btl", "self,vader", "btl_vader_single_copy_mechanism", "none"],
}


def algorithms(kind):
    from commrt.collectives import ALGORITHMS

    names = list(ALGORITHMS[kind])
    if kind == "all_reduce":
        names.remove("hierarchical")  # one host: the same as reduce_bcast plus a no-op ring
    return names + ["auto"]


def busbw_factor(kind, n):
    from commrt.bench.collectives import busbw_factor as factor

    return factor(kind, n)


def run_commrt(n, spec, transport, timeout):
    from commrt.bench import _coll

    return _launch.run_in_world(n, transport, _coll.commrt_entry, spec, timeout, timeout)[0]


def run_mpi(n, mca, spec, timeout, label):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        path = os.path.join(tmp, "spec.json")
        _launch.write_json(path, spec)
        cmd = _launch.mpirun_cmd(n, mca, ["--oversubscribe"]) + [
            sys.executable, "-m", "commrt.bench._coll_mpi", "--spec", path, "--out", tmp]
        _launch.run_procs([cmd], [_launch._child_env({})], timeout, label)
        return _launch._read_results(tmp, n, label)[0]


def run_gloo(n, spec, timeout):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        path = os.path.join(tmp, "spec.json")
        _launch.write_json(path, spec)
        init = "file://" + os.path.join(tmp, "store")
        cmds = [[sys.executable, "-m", "commrt.bench._coll_torch", "--spec", path, "--out", tmp,
                 "--rank", str(r), "--world", str(n), "--init", init,
                 "--parent", str(os.getpid())] for r in range(n)]
        envs = [_launch._child_env({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
                for _ in range(n)]
        _launch.run_procs(cmds, envs, timeout, "gloo")
        return _launch._read_results(tmp, n, "gloo")[0]


def _has(mod):
    import importlib.util

    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def collect(args, log):
    """{n: {(backend, algo): {bytes: [times]}}}"""
    data = {}
    for n in args.nranks:
        per = data.setdefault(n, {})
        spec = {"kind": args.kind, "sizes": args.sizes, "target_s": args.target_s}
        jobs = [("commrt", lambda n=n: run_commrt(n, dict(spec, algos=args.algos), args.transport,
                                                   args.timeout))]
        if args.peers:
            import shutil

            if shutil.which("mpirun") and _has("mpi4py"):
                for name, mca in PEERS.items():
                    jobs.append((name, lambda n=n, mca=mca, name=name: run_mpi(
                        n, mca, dict(spec, algos=["default"]), args.timeout, name)))
            else:
                log("mpirun or mpi4py missing: no OpenMPI peer")
            if _has("torch"):
                jobs.append(("gloo", lambda n=n: run_gloo(n, dict(spec, algos=["default"]),
                                                          args.timeout)))
            else:
                log("torch missing: no Gloo peer")
        for rnd in range(args.rounds):
            for name, job in jobs:
                log(f"N={n} round {rnd + 1}/{args.rounds}: {name}")
                try:
                    res = job()
                except Exception as exc:  # noqa: BLE001 - report and go on
                    log(f"  {name} failed: {exc}")
                    continue
                for row in res["rows"]:
                    key = (name, row["algo"])
                    per.setdefault(key, {}).setdefault(row["bytes"], []).append(row["time_s"])
    return data


def report(args, data):
    lines = []
    for n, per in data.items():
        keys = sorted(per, key=lambda k: (k[0] != "commrt", k[0], k[1] == "auto", k[1]))
        names = [k[1] if k[0] == "commrt" else k[0] for k in keys]
        f = busbw_factor(args.kind, n)
        rows_t, rows_b = [], []
        for size in args.sizes:
            med = {k: Summary(per[k].get(size, [])) for k in keys}
            rows_t.append([fmt_size(size)] + [
                "n/a" if med[k].median is None else f"{med[k].median * 1e6:.1f}" for k in keys])
            cells = []
            for k in keys:
                s = med[k]
                if s.median is None:
                    cells.append("n/a")
                    continue
                bw = Summary([size / t * f / 1e9 for t in per[k][size]])
                cells.append(bw.cell())
            fixed = [med[k].median for k in keys
                     if k[0] == "commrt" and k[1] != "auto" and med[k].median]
            auto = med.get(("commrt", "auto"))
            ratio = (f"{auto.median / min(fixed):.2f}" if auto and auto.median and fixed else "n/a")
            rows_b.append([fmt_size(size)] + cells + [ratio])
        lines.append(f"\n{args.kind}, N = {n}, {args.transport}: time per call (µs, median)")
        lines.append(table(["size"] + names, rows_t))
        lines.append(f"\n{args.kind}, N = {n}: busbw GB/s, median [min-max] of {args.rounds} rounds")
        lines.append(table(["size"] + names + ["auto/best"], rows_b))
    return "\n".join(lines)


def plot(args, data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4.5), squeeze=False)
    for ax, (n, per) in zip(axes[0], data.items()):
        f = busbw_factor(args.kind, n)
        for key, by_size in sorted(per.items()):
            xs = [s for s in args.sizes if by_size.get(s)]
            ys = [s / Summary(by_size[s]).median * f / 1e9 for s in xs]
            label = key[1] if key[0] == "commrt" else key[0]
            style = "-" if key[0] == "commrt" else "--"
            ax.plot(xs, ys, style, marker="o", ms=3, label=label,
                    lw=2.5 if key[1] == "auto" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{args.kind}, N = {n} ({args.transport})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv, kind=None):
    p = argparse.ArgumentParser(prog=f"python -m commrt.bench {kind or 'allreduce'}",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", default=kind or "all_reduce", choices=KINDS)
    p.add_argument("--nranks", default="2,4,8")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    p.add_argument("--algos", default=None, help="comma list; default: all and auto")
    p.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-s", type=float, default=0.15, help="seconds per timed loop")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--peers", action="store_true", help="also mpi4py/OpenMPI and Gloo")
    p.add_argument("--plot", help="write busbw against size to this PNG")
    p.add_argument("--json", help="write the raw times here")
    args = p.parse_args(argv)
    args.nranks = [int(x) for x in args.nranks.split(",")]
    args.sizes = [parse_size(x) for x in args.sizes.split(",")]
    args.algos = args.algos.split(",") if args.algos else algorithms(args.kind)
    return args


def main(argv, kind=None):
    args = parse_args(argv, kind)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    data = collect(args, log)
    print(report(args, data))
    if args.plot:
        plot(args, data, args.plot)
        print(f"\nplot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(n): {f"{k[0]}/{k[1]}": v for k, v in per.items()}
                       for n, per in data.items()}, f, indent=1)
    return 0
