"""All-reduce across pretend hosts: network namespaces joined by links shaped with tc.

    python -m commrt.bench hosts [--hosts 2] [--ranks-per-host 2]
        [--rates 1gbit,10gbit] [--sizes 64K,1M,16M,64M]
        [--algos ring,rabenseifner,tree,dbtree,hierarchical,auto] [--mpi] [--mpi-retries 2]
        [--wire] [--streams 1,4] [--rounds 3] [--mtu 9000] [--json out.json]

For each link rate (``tc qdisc ... tbf rate RATE``, both directions of every
host's link; see commrt/bench/_netns.py) and round: one commrt job of
HOSTS x RANKS-PER-HOST ranks started by ``commrt-launch --hosts ... --ssh-cmd
"ip netns exec"`` (shared memory inside a host, TCP between, COMMRT_IFNAME
naming the link), timing every algorithm and size with the collective
benchmarks' loop (``_coll.measure``: float32 SUM, the slowest rank's
average, algorithms taking turns slice by slice); with ``--mpi`` also
mpi4py's Allreduce under OpenMPI's ``mpirun`` across the same namespaces
(``plm_rsh_agent`` an ``ip netns exec`` wrapper, ``btl_tcp_if_include``
the link; OpenMPI's own defaults: shared memory inside a host, TCP between);
a failed mpirun is run again (--mpi-retries) before its round becomes a gap.
With ``--wire`` every rank also reads its host's link counters around each
timed slice (/sys/class/net/cmrt0/statistics, outside the timed loop) and
the report adds the bytes each call put on the busiest host's link, each
way.  With ``--streams 1,4`` each round runs one commrt job per value of
COMMRT_TCP_STREAMS (TCP connections per pair across hosts), in turns, and
the report has a table per rate and value ("1gbit, 4 streams").  Reports per rate what ``auto`` ran at each size (the model's choice, per
round), the median time and busbw per (size, algorithm), auto/best
(target <= 1.10), hierarchical/ring and, with --mpi, commrt's best/OpenMPI.
Needs root and iproute2; the namespaces are removed afterwards.
"""
import argparse
import json
import os
import sys
import tempfile

from commrt.bench import _launch, _netns
from commrt.bench._stats import Summary, fmt_size, parse_size, table

DEFAULT_ALGOS = "ring,rabenseifner,tree,dbtree,hierarchical,auto"


def _spec(args):
    spec = {"kind": "all_reduce", "sizes": [parse_size(s) for s in args.sizes.split(",")],
            "algos": args.algos.split(","), "target_s": args.target_s, "slices": args.slices}
    if getattr(args, "wire", False):
        spec["wire"] = f"/sys/class/net/{_netns.IFNAME}/statistics"
    return spec


def run_commrt(hosts, local, spec, tmp, timeout, streams=None):
    """One commrt job across hosts; rank 0's results (streams: COMMRT_TCP_STREAMS)."""
    path = os.path.join(tmp, "spec.json")
    _launch.write_json(path, spec)
    # the cost cache cannot see tc's rate (its key is the namespace and the
    # interface, the same at every rate here): measure afresh every job
    env = [f"{k}={v}" for k, v in _launch.CHILD_ENV.items()] + [
        f"COMMRT_IFNAME={_netns.IFNAME}", f"COMMRT_TIMEOUT={int(timeout)}", "COMMRT_COST_CACHE="]
    if streams is not None:
        env.append(f"COMMRT_TCP_STREAMS={int(streams)}")
    cmd = hosts.launch_cmd(local, ["-m", "commrt.bench._hosts_rank", "--spec", path, "--out",
                                   tmp], timeout=timeout, env=env)
    _launch.run_procs([cmd], [_launch._child_env({})], timeout + 30, "commrt across hosts")
    return _launch._read_results(tmp, 1, "commrt across hosts")[0]


AGENT = """#!/bin/sh
# plm_rsh_agent of mpirun across namespace hosts: "AGENT HOST CMD..." runs CMD
# in namespace HOST; OpenMPI's shared-memory segments are named after the
# hostname, which the namespaces share, so each host gets its own directory.
ns="$1"; shift
mkdir -p "{dir}/$ns"
exec ip netns exec "$ns" env OMPI_MCA_btl_vader_backing_directory="{dir}/$ns" /bin/sh -c "$*"
"""


def run_mpi(hosts, local, spec, tmp, timeout):
    """mpi4py's Allreduce under mpirun across the same namespaces; rank 0's results."""
    path = os.path.join(tmp, "spec.json")
    _launch.write_json(path, {**spec, "algos": ["default"]})
    agent = os.path.join(tmp, "nsexec")
    with open(agent, "w") as f:
        f.write(AGENT.format(dir=os.path.join(tmp, "vader")))
    os.chmod(agent, 0o755)
    n = local * hosts.count
    host_list = ",".join(f"{ns}:{local}" for ns in hosts.names)
    cmd = hosts.exec(0, _launch.mpirun_cmd(
        n, ["plm_rsh_agent", agent, "btl_tcp_if_include", _netns.IFNAME,
            "oob_tcp_if_include", _netns.IFNAME], ["--host", host_list])
        + [sys.executable, "-m", "commrt.bench._coll_mpi", "--spec", path, "--out", tmp])
    _launch.run_procs([cmd], [_launch._child_env({})], timeout, "mpirun across hosts")
    return _launch._read_results(tmp, n, "mpirun across hosts")[0]


def _streams(args):
    """The --streams values (None: the job's default, one table per rate)."""
    text = getattr(args, "streams", None)
    return [int(x) for x in text.split(",")] if text else [None]


def cases(args):
    """(rate, streams, label) of every table: the label keys the results."""
    return [(rate, s, rate if s is None else f"{rate}, {s} stream{'s' * (s != 1)}")
            for rate in args.rates.split(",") for s in _streams(args)]


def collect(args, log=print):
    spec = _spec(args)
    data = {}   # (label, algo, bytes) -> [seconds per round]; label: see cases()
    with _netns.Hosts(args.hosts, mtu=args.mtu) as hosts:
        for rate in args.rates.split(","):
            hosts.set_rate(rate)
            log(hosts.describe())
            mine = [(s, label) for r8, s, label in cases(args) if r8 == rate]
            for r in range(args.rounds):
                runs = [(label, "commrt", lambda *a, s=s: run_commrt(*a, streams=s))
                        for s, label in mine]
                if args.mpi:
                    runs += [(label, "ompi", run_mpi) for _, label in mine[:1]]
                for label, system, fn in runs[::-1 if r % 2 else 1]:
                    record(data, label, system, _one_run(system, fn, hosts, args, spec, log,
                                                         f"{label}: round {r + 1}"),
                           spec["sizes"])
                log(f"  {rate}: round {r + 1}/{args.rounds} done (load "
                    f"{os.getloadavg()[0]:.1f})")
    return data


def _one_run(label, fn, hosts, args, spec, log, where):
    """One system's job of one round: rank 0's results, or None when OpenMPI failed
    in every try (1 + args.mpi_retries)."""
    tries = 1 + (getattr(args, "mpi_retries", 0) if label == "ompi" else 0)
    for attempt in range(1, tries + 1):
        with tempfile.TemporaryDirectory(prefix="commrt-bench-hosts-") as tmp:
            os.chmod(tmp, 0o755)
            try:
                return fn(hosts, args.ranks_per_host, spec, tmp, args.timeout)
            except _launch.RunFailed as e:
                if label != "ompi":
                    raise
                # OpenMPI 4.1.4's TCP BTL fails now and then on this machine, on one
                # host too ("failed to TCP connect", then readv into a bad address,
                # SIGSEGV; docs/scale.md): a fresh mpirun usually runs; after the
                # last try the round is a gap, not the end of the run
                first = (str(e).strip() or type(e).__name__).splitlines()[0]
                what = ("recorded as a gap" if attempt == tries
                        else f"trying again ({attempt} of {tries})")
                log(f"  {where}: OpenMPI failed, {what}: {first}")
    return None


def record(data, rate, label, res, sizes):
    """Add one round of one system's results to data.

    A failed OpenMPI round (res None) is kept as a gap (None per size), so that
    ratios still pair the rounds that were taken side by side.
    """
    if res is None:
        for size in sizes:
            data.setdefault((rate, "ompi", size), []).append(None)
        return
    for size, algo in res.get("choices", {}).items():
        data.setdefault(("choice", rate, int(size)), []).append(algo)
    for row in res["rows"]:
        algo = "ompi" if label == "ompi" else row["algo"]
        data.setdefault((rate, algo, row["bytes"]), []).append(row["time_s"])
        if "wire" in row:
            data.setdefault(("wire", rate, algo, row["bytes"]), []).append(
                (row["wire"]["tx"], row["wire"]["rx"]))


def _times(v):
    return [x for x in v or () if x is not None]


def _ratio_cell(data, rate, size, num, den):
    a, b = data.get((rate, num, size)), data.get((rate, den, size))
    pairs = [x / y for x, y in zip(a or (), b or ()) if x is not None and y is not None]
    return Summary(pairs).cell() if pairs else "n/a"


def _tally(names):
    """'ring' or 'ring x2, hierarchical x1': what auto ran in the rounds."""
    counts = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    if len(counts) == 1:
        return names[0]
    return ", ".join(f"{n} x{k}" for n, k in sorted(counts.items(), key=lambda x: -x[1]))


def _wire_cell(v):
    if not v:
        return "n/a"
    tx, rx = sorted(x[0] for x in v), sorted(x[1] for x in v)
    return f"{tx[len(tx) // 2] / 2**20:.2f} / {rx[len(rx) // 2] / 2**20:.2f} MiB"


def failed_rounds(data, rate):
    """How many OpenMPI rounds at this rate failed (gaps recorded by record)."""
    v = next((v for k, v in data.items() if k[0] == rate and k[1] == "ompi"), [])
    return sum(x is None for x in v)


def report(args, data):
    n = args.hosts * args.ranks_per_host
    factor = 2 * (n - 1) / n
    lines = []
    wire = {k[1:]: v for k, v in data.items() if k[0] == "wire"}
    choice = {k[1:]: v for k, v in data.items() if k[0] == "choice"}
    data = {k: v for k, v in data.items() if k[0] not in ("wire", "choice")}
    for _, _, rate in cases(args):
        algos = sorted({k[1] for k in data if k[0] == rate},
                       key=lambda a: (a in ("auto", "ompi"), a))
        sizes = sorted({k[2] for k in data if k[0] == rate})
        fixed = [a for a in algos if a not in ("auto", "ompi")]
        rows = []
        for size in sizes:
            row = [fmt_size(size)]
            for a in algos:
                v = _times(data.get((rate, a, size)))
                row.append(f"{Summary([x * 1e6 for x in v]).cell()} us / "
                           f"{size * factor / Summary(v).median / 1e9:.2f} GB/s" if v else "n/a")
            best = min(fixed, key=lambda a: Summary(data[(rate, a, size)]).median)
            row.append(_ratio_cell(data, rate, size, "auto", best) if "auto" in algos else "n/a")
            row.append(_ratio_cell(data, rate, size, "ring", "hierarchical"))
            row.append(_ratio_cell(data, rate, size, "ompi", best) if "ompi" in algos else "n/a")
            rows.append(row)
        lines.append(f"{args.hosts} hosts x {args.ranks_per_host} ranks, links at {rate}: "
                     "time (median [range] over rounds) / busbw")
        lines.append(table(["size"] + algos + ["auto/best", "ring/hier", "ompi/best"], rows))
        took = [f"{fmt_size(size)} {_tally(choice[(rate, size)])}" for size in sizes
                if (rate, size) in choice]
        if took:
            lines.append(f"auto ran at {rate}: " + "; ".join(took))
        if any(k[0] == rate for k in wire):
            lines.append(f"bytes on the busiest host's link per call at {rate}, each way "
                         "(sent / received, median over rounds)")
            lines.append(table(["size"] + algos, [
                [fmt_size(size)] + [_wire_cell(wire.get((rate, a, size))) for a in algos]
                for size in sizes]))
        failed = failed_rounds(data, rate)
        if failed:
            lines.append(f"OpenMPI failed in {failed} round(s) at {rate}; "
                         "its cells are over the rounds it finished")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m commrt.bench hosts",
                                description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--sizes", default="64K,1M,16M,64M")
    p.add_argument("--algos", default=DEFAULT_ALGOS)
    p.add_argument("--mpi", action="store_true", help="also OpenMPI (mpi4py) across the hosts")
    p.add_argument("--mpi-retries", type=int, default=2,
                   help="run a failed OpenMPI job of a round again up to this many times")
    p.add_argument("--wire", action="store_true",
                   help="also the bytes each call puts on a host's link (interface counters)")
    p.add_argument("--streams", help="COMMRT_TCP_STREAMS values to compare, e.g. 1,4 (one "
                   "commrt job per value and round, in turns; default: the job's own)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mtu", type=int, default=9000)
    p.add_argument("--target-s", type=float, default=0.2, help="timed seconds per slice loop")
    p.add_argument("--slices", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", help="also write the raw samples here")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    missing = _netns.missing_tools()
    if missing:
        print(f"bench hosts needs {', '.join(missing)}", file=sys.stderr)
        return 2
    print(f"commrt all-reduce across {args.hosts} namespace hosts x {args.ranks_per_host} "
          f"ranks, {args.rounds} rounds, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    data = collect(args)
    print(report(args, data))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"|".join(map(str, k)): v for k, v in data.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
