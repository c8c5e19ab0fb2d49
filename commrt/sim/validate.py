"""The simulator against commrt's own measurements on this machine (shared memory).

    python -m commrt.sim validate [--ranks 2,4,8] [--sizes 64K,1M,16M]
        [--algos NAME,...] [--rounds 3] [--json out.json]
    python -m commrt.sim validate --hosts 2 --ranks-per-host 2 --rates 1gbit,10gbit ...

Per world size N: α, β and γ come from commrt's calibration of an N-rank job
(cost.params: an 8-byte and a 1 MiB exchange between two ranks, reduce_into
on rank 0, in cache and out of it (γ_mem): point-to-point and kernel numbers
only, never α_busy, which the cost model takes from an 8-byte collective);
the all-reduces are then measured with the collective benchmarks' loop (``bench allreduce``'s
``run_commrt``) and simulated from the algorithms' schedules with those
parameters, one node of N ranks.  The fit never sees a collective's time.
Reports measured and simulated time and their ratio (target: within 25%).
With ``--hosts``, the same across network namespace hosts at each link rate
(``bench hosts``'s job, whose calibration gives both link classes: α, β
inside a host, α_net, β_net between).  Figures are for a quiet machine.
"""
import argparse
import json
import sys

from commrt.bench._stats import Summary, fmt_size, parse_size, table
from commrt.sim import schedules
from commrt.sim.engine import ScheduleError, Topology, simulate


# algorithms for several hosts only: not measured on one
MULTI_HOST = ("hierarchical",)


def _params(comm):
    from commrt.collectives import cost

    p = cost.params(comm)
    return {"alpha": p.alpha, "beta": p.beta, "gamma": p.gamma, "gamma_mem": p.gamma_mem,
            "segment": p.segment}


# message sizes of the β curve: an exchange of each between ranks 0 and 1
BETA_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def _exchange_time(comm, peer, nbytes, reps=7):
    """Lower quartile of reps sendrecvs of nbytes with peer (both send at once,
    as a step of an exchange; point to point, no collective) after two warm-ups."""
    import time

    import numpy as np

    out, into = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        comm.sendrecv(out, peer, into, peer, timeout=60)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 4]


def _beta_curve(comm, alpha, sizes=BETA_SIZES):
    """((size, β), ...): ranks 0 and 1 exchange each size, β = (time - α) / size;
    the others wait in the broadcast that spreads the figures."""
    curve = None
    if comm.rank < 2:
        curve = [(k, max(1e-12, (_exchange_time(comm, 1 - comm.rank, k) - alpha) / k))
                 for k in sizes]
    return tuple(tuple(x) for x in comm.broadcast_obj(curve, 0))


def _hop(comm):
    """µs of one hop of an 8-byte ring pass round every rank (bench p2p --ring's
    loop): a message's cost where the ranks outnumber the cores, each woken in turn."""
    from commrt.bench import _kernels
    from commrt.bench._p2p_commrt import ops_for

    got = _kernels.ring(ops_for(comm), target_s=0.5)
    return comm.broadcast_obj(got.get("ring_us_per_hop") if comm.rank == 0 else None, 0)


def _params_cores(comm):
    p = _params(comm)
    from commrt.collectives.cost import _cores
    p["cores"] = _cores()
    if comm.size == 2:   # the pair alone: with more ranks their waiting skews it
        p["beta_at"] = _beta_curve(comm, p["alpha"])
    if comm.size > p["cores"]:
        p["alpha_oversub"] = _hop(comm) * 1e-6
    return p


def calibrate(n, pair=None):
    """The simulator's parameters for n ranks on this host: the cost model's
    calibration of an n-rank job, the ring-pass hop where n ranks outnumber the
    cores, and the β curve of a two-rank job (``pair``: one measured before)."""
    from commrt.testing import World

    with World(n, env={"COMMRT_COST_CACHE": ""}, timeout=300) as w:
        p = w.run(_params_cores)[0]
    if "beta_at" not in p:
        p["beta_at"] = (pair or calibrate(2))["beta_at"]
    return p


def measure(n, sizes, algos, timeout=600):
    from commrt.bench import _peers as bench

    spec = {"kind": "all_reduce", "sizes": list(sizes), "algos": list(algos)}
    rows = bench.run_commrt(n, spec, "shm", timeout)["rows"]
    return {(row["algo"], row["bytes"]): row["time_s"] for row in rows}


def predicted(n, nbytes, algo, p):
    topo = Topology(1, n, p["alpha"], p["beta"], p["alpha"], p["beta"], p["gamma"],
                    p["segment"], cores=p["cores"] if n > p["cores"] else None,
                    gamma_mem=p.get("gamma_mem"), beta_at=tuple(map(tuple, p.get("beta_at", ()))),
                    alpha_oversub=p.get("alpha_oversub"))
    return simulate(topo, schedules.steps_of(algo, n, max(1, nbytes // 4), ranks_per_node=n),
                    itemsize=4)


def run(ranks, sizes, algos, rounds, log=print):
    data = {}    # (n, algo, bytes) -> {"measured": [...], "simulated": [...]}
    for r in range(rounds):
        pair = calibrate(2)
        for n in ranks:
            p = pair if n == 2 else calibrate(n, pair)
            runnable = []
            for algo in algos:
                try:
                    schedules.steps_of(algo, n, 1)
                    runnable.append(algo)
                except ScheduleError as exc:
                    log(f"  N={n} {algo}: not simulated ({exc})")
            if not runnable:
                continue
            got = measure(n, sizes, runnable)
            for algo in runnable:
                for k in sizes:
                    cell = data.setdefault((n, algo, k), {"measured": [], "simulated": []})
                    cell["measured"].append(got[(algo, k)])
                    cell["simulated"].append(predicted(n, k, algo, p))
        log(f"  round {r + 1}/{rounds} done")
    return data


def run_hosts(hosts, local, rates, sizes, algos, rounds, log=print):
    """The same across namespace hosts: {(rate, algo, bytes): {...}}."""
    import os
    import tempfile

    from commrt.bench import _netns
    from commrt.bench.hosts import run_commrt

    n = hosts * local
    runnable = []
    for algo in algos:
        try:
            schedules.steps_of(algo, n, 1)
            runnable.append(algo)
        except ScheduleError as exc:
            log(f"  {algo}: not simulated ({exc})")
    spec = {"kind": "all_reduce", "sizes": list(sizes), "algos": runnable}
    data = {}
    with _netns.Hosts(hosts, mtu=9000) as h:
        for rate in rates:
            h.set_rate(rate)
            for r in range(rounds):
                with tempfile.TemporaryDirectory(prefix="commrt-sim-validate-") as tmp:
                    os.chmod(tmp, 0o755)
                    res = run_commrt(h, local, spec, tmp, 600)
                p = res["params"]
                topo = Topology(hosts, local, p["alpha"], p["beta"], p["alpha_net"],
                                p["beta_net"], p["gamma"], p["segment"],
                                cores=p["cores"] if local > p["cores"] else None,
                                gamma_mem=p.get("gamma_mem"))
                for row in res["rows"]:
                    k, algo = row["bytes"], row["algo"]
                    cell = data.setdefault((rate, algo, k), {"measured": [], "simulated": []})
                    cell["measured"].append(row["time_s"])
                    cell["simulated"].append(simulate(
                        topo, schedules.steps_of(algo, n, max(1, k // 4), ranks_per_node=local),
                        itemsize=4))
                log(f"  {rate}: round {r + 1}/{rounds} done")
    return data


def report(data, first="N"):
    rows = []
    for (n, algo, k), cell in sorted(data.items()):
        m, s = Summary(cell["measured"]), Summary(cell["simulated"])
        ratio = Summary([b / a for a, b in zip(cell["measured"], cell["simulated"])])
        rows.append([str(n), algo, fmt_size(k), f"{m.median * 1e6:.1f}", f"{s.median * 1e6:.1f}",
                     ratio.cell()])
    return table([first, "algorithm", "size", "measured us", "simulated us", "sim/measured"],
                 rows, "llrrrr")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.sim validate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--algos", default=None,
                   help="default: every all-reduce algorithm with a schedule")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hosts", type=int, help="namespace hosts instead of one (root)")
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--json")
    args = p.parse_args(argv)
    algos = (args.algos.split(",") if args.algos else
             [a for a in schedules.names() if schedules.has_schedule(a)
              and (args.hosts or a not in MULTI_HOST)])
    sizes = [parse_size(x) for x in args.sizes.split(",")]
    if args.hosts:
        data = run_hosts(args.hosts, args.ranks_per_host, args.rates.split(","), sizes,
                         algos, args.rounds)
        print(f"{args.hosts} namespace hosts x {args.ranks_per_host} ranks")
        print(report(data, "link"))
    else:
        ranks = [int(x) for x in args.ranks.split(",")]
        data = run(ranks, sizes, algos, args.rounds)
        print(report(data))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{n}|{a}|{k}": v for (n, a, k), v in data.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
