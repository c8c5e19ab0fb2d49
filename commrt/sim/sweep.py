"""The simulator's sweep (every schedule, sizes x world sizes) and the crossover against NCCL.

    python -m commrt.sim sweep [--ranks 2,4,...,16384] [--sizes 8,32,...,1G]
        [--ranks-per-node 1] [--algos NAME,...] [--json F] [--png F] [link options]
    python -m commrt.sim crossover [--ranks 16,...,16384] [--ranks-per-node 8]
        [--bus 12.5] [--json F]

``sweep`` runs each all-reduce with a ``schedule`` (sim.schedules; the others
are listed as not simulated) through the engine at every world size and
message size: time, bus bandwidth (2(N−1)/N·K/t, as nccl-tests and ``bench
allreduce`` report it), whether the exact symmetry shortcut ran (engine.py),
the cost model's prediction and its pick.  ``crossover`` is the ring-against-
tree size at each N from commrt's cost model (ring against dbtree, the
double binary tree that NCCL's tree is; the simulator's own where both have
schedules) and from NCCL's tuning model (commrt/sim/nccl.py) with the same
bus bandwidth as commrt's network (β_net), and commrt's own picks.  The PNG
(matplotlib) shows simulated bus bandwidth against size and both crossovers
against N.
"""
import argparse
import json
import sys
import time

from commrt.bench._stats import fmt_size, parse_size, table
from commrt.sim import nccl, schedules
from commrt.sim.engine import ScheduleError, Topology, run

RANKS = tuple(2 ** i for i in range(1, 15))                 # 2 .. 16,384
SIZES = tuple(2 ** i for i in range(3, 31, 2)) + (1 << 30,)  # 8 B .. 1 GiB, x4
CROSS_RANKS = (16, 64, 128, 256, 1024, 4096, 16384)
CROSS_SIZES = tuple(2 ** i for i in range(3, 31))            # x2, for the crossover


def topology(ranks, per_node, links):
    return Topology(ranks // per_node, per_node, links["alpha_shm"], links["beta_shm"],
                    links["alpha_net"], links["beta_net"], links["gamma"], links["segment"])


def busbw(n, nbytes, t):
    return nbytes * 2 * (n - 1) / n / t / 1e9 if t > 0 else None


def simulable(algos, n):
    """(algorithms whose schedule runs at n ranks, {algorithm: why not})."""
    ok, why = [], {}
    for algo in algos:
        try:
            schedules.steps_of(algo, n, 1)
            ok.append(algo)
        except ScheduleError as exc:
            why[algo] = str(exc)
    return ok, why


def sweep(ranks, sizes, algos, per_node, links, log=None):
    """Rows {algo, ranks, bytes, time_s, busbw_GBps, shortcut, model_s, model_pick}."""
    from commrt.sim.__main__ import predict

    rows, skipped = [], {}
    for n in ranks:
        if n % per_node:
            continue
        topo = topology(n, per_node, links)
        ok, why = simulable(algos, n)
        if n // per_node == 1 or per_node == 1:   # as the cost model: for several hosts
            for algo in [a for a in ok if getattr(schedules.module(a), "LINKS", False)]:
                ok.remove(algo)                    # of several ranks only (hierarchical)
                why.setdefault(algo, "needs several nodes of several ranks")
        for algo, reason in why.items():
            skipped.setdefault(algo, reason)
        for k in sizes:
            pred = predict(topo, k)
            for algo in ok:
                t0 = time.perf_counter()
                try:
                    t, short = run(topo, schedules.steps_of(algo, n, max(1, k // 4),
                                                            ranks_per_node=per_node),
                                   itemsize=4)
                except ScheduleError as exc:   # past the simulator's bound, say
                    skipped.setdefault(algo, f"from N={n}, {fmt_size(k)}: {exc}")
                    continue
                rows.append({"algo": algo, "ranks": n, "bytes": k, "time_s": t,
                             "busbw_GBps": busbw(n, k, t), "shortcut": short,
                             "model_s": pred.get(algo), "model_pick": min(pred, key=pred.get),
                             "cpu_s": time.perf_counter() - t0})
            if log:
                log(f"  N={n} {fmt_size(k)} done")
    return rows, skipped


def model_crossover(n, per_node, links, sizes, a="ring", b="dbtree"):
    """The smallest size from which commrt's model has a beat b at every larger size."""
    from commrt.sim.__main__ import predict

    topo = topology(n, per_node, links)
    wins = []
    for k in sizes:
        pred = predict(topo, k)
        wins.append(pred[a] < pred[b])
    return nccl.first_of_last_run(sizes, wins)


# the simulated crossover looks up to this size (beyond, a 1 GiB tree pass is
# thousands of segments per rank: minutes per world size), at every other size
# (x4), and up to SIM_CROSS_RANKS ranks (with several ranks to a node the ring
# runs in full: 4·N² messages a size)
SIM_CROSS_MAX = 64 << 20
SIM_CROSS_RANKS = 256


def sim_crossover(n, per_node, links, sizes, a="ring", b="dbtree"):
    """The same from the simulator over sizes up to SIM_CROSS_MAX, where both
    algorithms have schedules and fit the simulator's bound (else None)."""
    sizes = [k for k in sizes if k <= SIM_CROSS_MAX][::2]
    if n > SIM_CROSS_RANKS:
        return None
    ok, _ = simulable([a, b], n)
    if len(ok) < 2:
        return None
    topo = topology(n, per_node, links)
    wins = []
    try:
        for k in sizes:
            ta = run(topo, schedules.steps_of(a, n, max(1, k // 4), ranks_per_node=per_node))[0]
            tb = run(topo, schedules.steps_of(b, n, max(1, k // 4), ranks_per_node=per_node))[0]
            wins.append(ta < tb)
    except ScheduleError:   # past the simulator's bound: not simulated at this N
        return None
    return nccl.first_of_last_run(sizes, wins)


def picks(n, per_node, links, sizes):
    """commrt's cost-model choice at each size: [(first size, algorithm), ...] runs."""
    from commrt.sim.__main__ import predict

    topo = topology(n, per_node, links)
    out = []
    for k in sizes:
        pred = predict(topo, k)
        pick = min(pred, key=pred.get)
        if not out or out[-1][1] != pick:
            out.append((k, pick))
    return out


def crossovers(ranks, per_node, links, bus, sizes=CROSS_SIZES, simulate=True):
    rows = []
    for n in ranks:
        if n % per_node:
            continue
        rows.append({
            "ranks": n, "nodes": n // per_node,
            "commrt_model": model_crossover(n, per_node, links, sizes),
            "commrt_sim": sim_crossover(n, per_node, links, sizes) if simulate else None,
            "nccl": nccl.crossover(n, n // per_node, bus, sizes),
            "nccl_simple": nccl.crossover(n, n // per_node, bus, sizes, ("Simple",)),
            "commrt_picks": picks(n, per_node, links, sizes)})
    return rows


def _size(k, sizes):
    if k is None:
        return f"> {fmt_size(sizes[-1])}"
    return fmt_size(k) if k != sizes[0] else f"<= {fmt_size(k)}"


def crossover_table(rows, sizes=CROSS_SIZES):
    body = [[str(r["ranks"]), str(r["nodes"]), _size(r["commrt_model"], sizes),
             "not simulated" if r["commrt_sim"] is None else _size(r["commrt_sim"], sizes),
             _size(r["nccl"], sizes), _size(r["nccl_simple"], sizes),
             ", ".join(f"{a} from {fmt_size(k)}" for k, a in r["commrt_picks"])]
            for r in rows]
    return table(["N", "nodes", "commrt model ring>dbtree",
                  f"simulated (x4 to {fmt_size(SIM_CROSS_MAX)}, N <= {SIM_CROSS_RANKS})",
                  "NCCL ring>tree",
                  "NCCL (Simple)", "commrt's picks"], body, "rrrrrrl")


def simulated_best(rows):
    """{N: [(first size, algorithm), ...]}: the simulated fastest algorithm's runs over
    sizes, and the cost model's pick beside it, per world size."""
    out = {}
    for n in sorted({r["ranks"] for r in rows}):
        sim, model = [], []
        for k in sorted({r["bytes"] for r in rows if r["ranks"] == n}):
            cell = [r for r in rows if r["ranks"] == n and r["bytes"] == k]
            fastest = min(cell, key=lambda r: r["time_s"])["algo"]
            if not sim or sim[-1][1] != fastest:
                sim.append((k, fastest))
            if not model or model[-1][1] != cell[0]["model_pick"]:
                model.append((k, cell[0]["model_pick"]))
        out[n] = {"simulated": sim, "model": model}
    return out


def best_table(rows):
    def runs(seq):
        return ", ".join(f"{a} from {fmt_size(k)}" for k, a in seq)
    body = [[str(n), runs(b["simulated"]), runs(b["model"])]
            for n, b in simulated_best(rows).items()]
    return table(["N", "fastest simulated", "the cost model picks (all algorithms)"], body,
                 "rll")


def sweep_table(rows):
    body = [[str(r["ranks"]), r["algo"], fmt_size(r["bytes"]), f"{r['time_s'] * 1e6:.1f}",
             f"{r['busbw_GBps']:.3f}", "yes" if r["shortcut"] else "no",
             "-" if r["model_s"] is None else f"{r['model_s'] * 1e6:.1f}", r["model_pick"]]
            for r in rows]
    return table(["N", "algorithm", "size", "sim us", "busbw GB/s", "rank 0 only", "model us",
                  "model picks"], body, "rllrrlrl")


def plot(rows, cross, path, links, per_node, cross_per_node):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    shown = sorted({r["ranks"] for r in rows})
    shown = [n for n in shown if n in (2, 16, 128, 1024, 16384)] or shown[-3:]
    # one colour per N; per algorithm a line style and a marker (legend: both keys)
    styles = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))
    markers = "os^vDx+*"
    for i, algo in enumerate(sorted({r["algo"] for r in rows})):
        for j, n in enumerate(shown):
            pts = [(r["bytes"], r["busbw_GBps"]) for r in rows
                   if r["algo"] == algo and r["ranks"] == n]
            if pts:
                left.plot(*zip(*pts), marker=markers[i % len(markers)], ms=4,
                          ls=styles[i % len(styles)], color=f"C{j}",
                          label=algo if j == 0 else None)
    for j, n in enumerate(shown):
        left.plot([], [], color=f"C{j}", label=f"N={n}")
    left.set(xscale="log", yscale="log", xlabel="bytes", ylabel="simulated bus bandwidth GB/s",
             title=f"simulated all-reduce, {per_node} rank(s)/node, net "
                   f"{links['alpha_net'] * 1e6:g} us, {1 / links['beta_net'] / 1e9:g} GB/s")
    left.legend(fontsize=7, ncol=2, loc="lower right")
    big = 2 * CROSS_SIZES[-1]   # "never" drawn above the largest size
    for key, label in (("commrt_model", "commrt model: ring beats dbtree from"),
                       ("commrt_sim", "commrt simulator: ring beats dbtree from"),
                       ("nccl", "NCCL model: ring beats tree from"),
                       ("nccl_simple", "NCCL model, Simple only")):
        pts = [(r["ranks"], r[key] or big) for r in cross
               if r[key] is not None or key != "commrt_sim"]
        if pts:
            right.plot(*zip(*pts), marker="o", label=label)
    right.axhline(big, color="grey", lw=0.5, ls=":")
    right.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="crossover size (bytes)",
              title=f"ring vs tree crossover ({cross_per_node} ranks/node; top line: never "
                    f"up to {fmt_size(CROSS_SIZES[-1])})")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _link_args(p):
    p.add_argument("--alpha-shm", type=float, default=1e-6)
    p.add_argument("--beta-shm", type=float, default=1 / 20e9)
    p.add_argument("--alpha-net", type=float, default=5e-6)
    p.add_argument("--beta-net", type=float, default=1 / 12.5e9)
    p.add_argument("--gamma", type=float, default=1 / 10e9)
    p.add_argument("--segment", default="1M")


def _links(args):
    return {"alpha_shm": args.alpha_shm, "beta_shm": args.beta_shm, "alpha_net": args.alpha_net,
            "beta_net": args.beta_net, "gamma": args.gamma, "segment": parse_size(args.segment)}


def _ints(text):
    return [int(x) for x in text.split(",")]


def _sizes(text):
    return [parse_size(x) for x in text.split(",")]


def main_sweep(argv):
    p = argparse.ArgumentParser(prog="python -m commrt.sim sweep",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default=",".join(map(str, RANKS)))
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--algos", default=None, help="default: every all-reduce algorithm")
    p.add_argument("--cross-ranks", default=",".join(map(str, CROSS_RANKS)))
    p.add_argument("--cross-ranks-per-node", type=int, default=8)
    p.add_argument("--bus", type=float, default=None,
                   help="NCCL's bus bandwidth GB/s (default: 1/β_net)")
    p.add_argument("--json")
    p.add_argument("--png")
    _link_args(p)
    args = p.parse_args(argv)
    links = _links(args)
    algos = args.algos.split(",") if args.algos else list(schedules.names())
    log = (lambda s: print(s, file=sys.stderr))
    rows, skipped = sweep(_ints(args.ranks), _sizes(args.sizes), algos, args.ranks_per_node,
                          links, log)
    bus = args.bus or 1 / links["beta_net"] / 1e9
    cross = crossovers(_ints(args.cross_ranks), args.cross_ranks_per_node, links, bus)
    print(sweep_table(rows))
    for algo, why in sorted(skipped.items()):
        print(f"not simulated: {algo}: {why}")
    print()
    print(best_table(rows))
    print()
    print(crossover_table(cross))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"links": links, "ranks_per_node": args.ranks_per_node,
                       "cross_ranks_per_node": args.cross_ranks_per_node, "nccl_bus_GBps": bus,
                       "rows": rows, "not_simulated": skipped, "crossovers": cross,
                       "simulated_best": simulated_best(rows)}, f, indent=1)
    if args.png:
        plot(rows, cross, args.png, links, args.ranks_per_node, args.cross_ranks_per_node)
    return 0


def main_crossover(argv):
    p = argparse.ArgumentParser(prog="python -m commrt.sim crossover",
                                description="ring against tree: commrt's model and NCCL's")
    p.add_argument("--ranks", default=",".join(map(str, CROSS_RANKS)))
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--bus", type=float, default=None)
    p.add_argument("--json")
    _link_args(p)
    args = p.parse_args(argv)
    links = _links(args)
    cross = crossovers(_ints(args.ranks), args.ranks_per_node, links,
                       args.bus or 1 / links["beta_net"] / 1e9)
    print(crossover_table(cross))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cross, f, indent=1)
    return 0
