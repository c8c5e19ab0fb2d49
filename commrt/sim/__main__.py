"""python -m commrt.sim allreduce: predicted time of an all-reduce on a modelled cluster.

(``python -m commrt.sim validate``: the simulator against measurements here,
see commrt/sim/validate.py; ``sweep`` and ``crossover``: every schedule over
sizes and world sizes, and the ring-against-tree crossover beside NCCL's
model, see commrt/sim/sweep.py.)

    python -m commrt.sim allreduce --algo auto|rabenseifner|... --ranks N
        --ranks-per-node R --size 1M [--calibrated] [--json]
        [--alpha-shm S] [--beta-shm S/B] [--alpha-net S] [--beta-net S/B]
        [--gamma S/B] [--segment BYTES] [--bisection B/s] [--cores PER_NODE]

Runs the algorithm's own ``schedule`` in the discrete-event model of
commrt/sim/engine.py.  ``auto`` is the algorithm commrt's cost model picks
for these parameters (collectives/cost.py, the same formulas and link
classes as a job's first call).  ``--calibrated`` takes α, β, γ from this
machine: commrt's calibration of a 2-rank job over shared memory (the shm
class) and over TCP on loopback (the net class, a stand-in: this machine has
no network).  Defaults describe a generic cluster: shared memory 1 µs and
20 GB/s, network 5 µs and 12.5 GB/s, γ 10 GB/s.
"""
import argparse
import json
import sys

from commrt.bench._stats import fmt_size, parse_size
from commrt.sim import schedules
from commrt.sim.calibrate import calibrated
from commrt.sim.engine import ScheduleError, Topology, simulate


def model_params(topo):
    """The cost model's Params for this topology (both link classes)."""
    from commrt.collectives.cost import Params

    return Params(alpha=topo.alpha_shm, beta=topo.beta_shm, gamma=topo.gamma,
                  alpha_busy=topo.alpha_shm, segment=topo.segment,
                  cores=topo.cores or topo.ranks_per_node,
                  local=topo.ranks_per_node, alpha_net=topo.alpha_net,
                  beta_net=topo.beta_net, hosts=topo.nodes)


def predict(topo, nbytes):
    """{algorithm: the cost model's seconds} as a job on this topology would see them."""
    p, n, r = model_params(topo), topo.ranks, topo.ranks_per_node
    groups = [list(range(h * r, (h + 1) * r)) for h in range(topo.nodes)]
    out = {}
    for name in schedules.names():
        mod = schedules.module(name)
        if name == "hierarchical":
            if topo.nodes > 1 and r > 1:
                out[name] = mod.cost(n, nbytes, p, groups=groups)
        elif not getattr(mod, "LINKS", False):
            share = getattr(mod, "NET_SHARE", 1 if name == "ring" else r)
            out[name] = mod.cost(n, nbytes, p.net(share))
    return out


def run(args):
    topo = Topology(args.ranks // args.ranks_per_node, args.ranks_per_node, args.alpha_shm,
                    args.beta_shm, args.alpha_net, args.beta_net, args.gamma,
                    parse_size(args.segment), args.bisection, args.cores)
    if args.calibrated:
        c = calibrated()
        topo.alpha_shm, topo.beta_shm, topo.gamma = c["shm"]
        topo.alpha_net, topo.beta_net = c["tcp"][:2]
    nbytes = parse_size(args.size)
    pred = predict(topo, nbytes)
    pick = min(pred, key=pred.get)
    algo = pick if args.algo == "auto" else args.algo
    count = max(1, nbytes // 4)
    t = simulate(topo, schedules.steps_of(algo, topo.ranks, count,
                                          ranks_per_node=topo.ranks_per_node), itemsize=4)
    n = topo.ranks
    return {"collective": "all_reduce", "algo": algo, "auto_picks": pick, "ranks": n,
            "ranks_per_node": topo.ranks_per_node, "bytes": nbytes, "time_s": t,
            "busbw_GBps": nbytes * 2 * (n - 1) / n / t / 1e9 if t > 0 else None,
            "model_s": pred.get(algo), "params": vars(topo)}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "validate":
        from commrt.sim import validate
        return validate.main(argv[1:])
    if argv and argv[0] in ("sweep", "crossover"):
        from commrt.sim import sweep
        return (sweep.main_sweep if argv[0] == "sweep" else sweep.main_crossover)(argv[1:])
    if not argv or argv[0] != "allreduce":
        print("usage: python -m commrt.sim allreduce --algo NAME --ranks N ...  (all-reduce "
              "only for now)\n       python -m commrt.sim validate [--ranks 2,4,8] ...  "
              "(against measurements here)\n       python -m commrt.sim sweep [--ranks ...] "
              "[--sizes ...] [--json F] [--png F]\n       python -m commrt.sim crossover "
              "[--ranks ...] [--ranks-per-node 8]  (ring vs tree, commrt's and NCCL's model)",
              file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="python -m commrt.sim allreduce",
                                description=__doc__.splitlines()[0])
    p.add_argument("--algo", default="auto")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--size", default="1M")
    p.add_argument("--calibrated", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--alpha-shm", type=float, default=1e-6)
    p.add_argument("--beta-shm", type=float, default=1 / 20e9)
    p.add_argument("--alpha-net", type=float, default=5e-6)
    p.add_argument("--beta-net", type=float, default=1 / 12.5e9)
    p.add_argument("--gamma", type=float, default=1 / 10e9)
    p.add_argument("--segment", default="1M")
    p.add_argument("--bisection", type=float, default=None)
    p.add_argument("--cores", type=int, default=None,
                   help="cores per node, when ranks share them (default: a core per rank)")
    args = p.parse_args(argv[1:])
    if args.ranks < 1 or args.ranks_per_node < 1 or args.ranks % args.ranks_per_node:
        p.error("--ranks must be a positive multiple of --ranks-per-node")
    try:
        res = run(args)
    except ScheduleError as exc:
        print(f"commrt.sim: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res))
    else:
        print(f"all_reduce {res['algo']} ({'auto: ' if args.algo == 'auto' else 'auto picks '}"
              f"{res['auto_picks']}), {res['ranks']} ranks ({res['ranks_per_node']} per node), "
              f"{fmt_size(res['bytes'])}: {res['time_s'] * 1e6:.1f} us, busbw "
              f"{res['busbw_GBps']:.2f} GB/s (cost model {res['model_s'] * 1e6:.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
