"""Point-to-point latency and bandwidth (OSU method), shm and TCP, beside OpenMPI and Gloo.

    python -m commrt.bench p2p                      # commrt over shm and TCP, 2 ranks
    python -m commrt.bench p2p --peers --rounds 3   # ... interleaved with mpi4py/OpenMPI and Gloo
    python -m commrt.bench p2p --overlap --ring 8 --memory --peers
    python -m commrt.bench p2p --sizes 8,1K,1M --iters 100 --rounds 1   # quick

Measurements (the OSU micro-benchmarks' methods, loops in ``_kernels``):

* latency: half the ping-pong round trip, rank 0 <-> rank 1;
* bandwidth: a window of 64 isends (matched by 64 irecvs), then a small
  acknowledgement, repeated; MB/s = 10^6 bytes per second;
* --overlap: a 64 MiB isend/irecv beside ~100 ms of NumPy matmuls: time of
  both over the longer of the two alone (target <= 1.15);
* --ring N: N ranks pass 8 bytes round a ring on however few cores there
  are: µs per hop (OpenMPI runs with --oversubscribe);
* --memory: what the transport reports of its memory (comm.memory_info(),
  comm.stats()), then a soak of mixed messages: resident memory, open file
  descriptors and /dev/shm before and after.

Backends run in the same invocation, interleaved round by round (forward
order in even rounds, reverse in odd ones), because the cores this runs on
drift between fast and slow states for seconds to minutes: every cell is
the median over rounds with [min-max].  Ratios are commrt / peer.
"""
import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time

from commrt.bench import _launch
from commrt.bench._stats import Summary, fmt_num, fmt_size, parse_size, ratio, table

DEFAULT_SIZES = [8, 64, 512, 4 << 10, 16 << 10, 32 << 10, 128 << 10,
                 1 << 20, 4 << 20, 16 << 20, 64 << 20]
ALL_SIZES = [1 << k for k in range(3, 27)]

_TCP_LO = ["btl_tcp_if_include", "lo"]

# name -> how to run it.  "group" pairs each peer with the commrt transport it
# is compared against in the tables.
BACKENDS = {
    "commrt-shm": {"kind": "commrt", "transport": "shm", "group": "shm",
                   "label": "commrt shm"},
    "commrt-tcp": {"kind": "commrt", "transport": "tcp", "group": "tcp",
                   "label": "commrt tcp"},
    "mpi-sm": {"kind": "mpi", "group": "shm", "label": "OpenMPI sm (CMA)",
               "mca": ["pml", "ob1", "btl", "self,vader"]},
    "mpi-sm-nocma": {"kind": "mpi", "group": "shm", "label": "OpenMPI sm (no single copy)",
                     "mca": ["pml", "ob1", "btl", "self,vader",
                             "btl_vader_single_copy_mechanism", "none"]},
    "mpi-tcp": {"kind": "mpi", "group": "tcp", "label": "OpenMPI tcp",
                "mca": ["pml", "ob1", "btl", "self,tcp"] + _TCP_LO},
    "gloo": {"kind": "torch", "group": "tcp", "label": "Gloo (torch)"},
}
GROUP_TITLES = {"shm": "shared memory", "tcp": "TCP over loopback"}


# -- availability -------------------------------------------------------------

def _has(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def availability(name):
    """None if the backend can run here, else why not."""
    kind = BACKENDS[name]["kind"]
    if kind == "commrt":
        if not _has("commrt.comm"):
            return "commrt.comm is not built yet"
        if not (_has("commrt.rendezvous.store") or _launch.world_available()):
            return "neither commrt.rendezvous.store nor commrt.testing exists"
        return None
    if kind == "mpi":
        if not shutil.which("mpirun"):
            return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
        if not _has("mpi4py"):
            return "mpi4py not installed"
        return None
    if kind == "torch":
        return None if _has("torch") else "torch not installed"
    return "unknown backend"


def _starter(choice):
    if choice == "auto":
        return "world" if _launch.world_available() else "spawn"
    return choice


# -- one run -------------------------------------------------------------------

def run_backend(name, nranks, spec, args, oversubscribe=False):
    """Run spec on one backend; (results by rank, seconds)."""
    b = BACKENDS[name]
    spec = dict(spec, timeout_s=args.timeout)
    t0 = time.perf_counter()
    if b["kind"] == "commrt":
        res = _launch.run_commrt(nranks, b["transport"], spec, args.timeout,
                                 starter=_starter(args.starter), label=name)
    elif b["kind"] == "mpi":
        extra = ["--oversubscribe"] if oversubscribe else []
        res = _launch.run_mpi(nranks, b["mca"], spec, args.timeout, extra=extra, label=name)
    else:
        res = _launch.run_torch(nranks, spec, args.timeout, label=name)
    return res, time.perf_counter() - t0


def interleaved(names, rounds, job, log):
    """Run job(name, round) for every backend, round by round; the records."""
    records = []
    for rnd in range(rounds):
        order = names if rnd % 2 == 0 else list(reversed(names))
        for name in order:
            rec = {"backend": name, "round": rnd, "loadavg_before": _loadavg()}
            try:
                rec["ranks"], rec["wall_s"] = job(name, rnd)
                rec["ok"] = True
                log(f"  round {rnd + 1}/{rounds} {name:<13} {rec['wall_s']:6.1f} s")
            except Exception as exc:            # keep measuring the others
                rec["ok"], rec["error"] = False, f"{type(exc).__name__}: {exc}"
                log(f"  round {rnd + 1}/{rounds} {name:<13} FAILED: {rec['error']}")
            rec["loadavg_after"] = _loadavg()
            records.append(rec)
    return records


def _loadavg():
    """The 1-minute load average: other work on the machine shows up here."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def load_note(records):
    """One line: the 1-minute load average seen around these runs."""
    loads = [x for r in records for x in (r.get("loadavg_before"), r.get("loadavg_after"))
             if x is not None]
    if not loads:
        return ""
    return (f"\n\n(1-minute load average around these runs: {min(loads):.2f}-{max(loads):.2f} "
            f"on {os.cpu_count()} cores; above ~1 other work shared the cores)")


def _samples(records, name, key, size):
    out = []
    for rec in records:
        if rec["backend"] == name and rec["ok"]:
            v = rec["ranks"][0].get(key, {}).get(str(size))
            if v is not None:
                out.append(v)
    return out


# -- latency and bandwidth -----------------------------------------------------

def p2p_tables(records, names, sizes, tasks):
    """The text tables and a summary dict for latency and bandwidth."""
    texts, summary = [], {}
    for group in ("shm", "tcp"):
        members = [n for n in names if BACKENDS[n]["group"] == group]
        if not members:
            continue
        main = f"commrt-{group}"
        peers = [n for n in members if n != main]
        for task, key, unit, better in (
                ("latency", "latency_us", "µs, half round trip", "< 1 means commrt is faster"),
                ("bandwidth", "bw_MBps", "MB/s, window of 64", "> 1 means commrt is faster")):
            if task not in tasks:
                continue
            headers = ["size", BACKENDS[main]["label"]]
            for p in peers:
                headers += [BACKENDS[p]["label"], "ratio"]
            rows = []
            for size in sizes:
                m = Summary(_samples(records, main, key, size))
                row = [fmt_size(size), m.cell()]
                summary.setdefault(f"{task}/{main}", {})[size] = m.as_dict()
                for p in peers:
                    s = Summary(_samples(records, p, key, size))
                    summary.setdefault(f"{task}/{p}", {})[size] = s.as_dict()
                    row += [s.cell(), ratio(m.median, s.median)]
                rows.append(row)
            title = (f"{task}, {GROUP_TITLES[group]} ({unit}); median [min-max] over rounds; "
                     f"ratio = commrt / peer, {better}")
            texts.append(title + "\n" + table(headers, rows))
    return "\n\n".join(texts), summary


# -- overlap ---------------------------------------------------------------------

def overlap_table(records, names):
    import statistics

    rows, summary = [], {}
    for name in names:
        reps = []
        for rec in records:
            if rec["backend"] == name and rec["ok"]:
                per_rank = [r["overlap"] for r in rec["ranks"] if "overlap" in r]
                for i in range(min(len(x) for x in per_rank)):
                    reps.append({k: max(x[i][k] for x in per_rank)
                                 for k in ("comp", "comm", "both")})
        if not reps:
            rows.append([BACKENDS[name]["label"], "n/a", "n/a", "n/a", "n/a"])
            continue
        med = {k: statistics.median(r[k] for r in reps) for k in ("comp", "comm", "both")}
        per_rep = [r["both"] / max(r["comp"], r["comm"]) for r in reps]
        # the ratio of each repetition (its three timings are seconds apart, in
        # one machine state), then the median: steadier than a ratio of medians
        value = statistics.median(per_rep)
        summary[name] = {"median_s": med, "ratio": value, "ratio_per_rep": per_rep}
        rows.append([BACKENDS[name]["label"], fmt_num(med["comp"] * 1e3),
                     fmt_num(med["comm"] * 1e3), fmt_num(med["both"] * 1e3),
                     f"{value:.2f} [{min(per_rep):.2f}-{max(per_rep):.2f}]"])
    headers = ["backend", "compute alone ms", "64 MiB transfer alone ms", "both ms",
               "both / longer (target <= 1.15)"]
    title = ("overlap: 64 MiB isend/irecv beside ~100 ms of NumPy matmul (1 BLAS thread); "
             "medians over rounds x repetitions of the max over the 2 ranks; the ratio is "
             "the median [min-max] of each repetition's ratio")
    return title + "\n" + table(headers, rows), summary


# -- ring --------------------------------------------------------------------------

def ring_table(records, names, nranks):
    rows, summary, hops = [], {}, {}

    def values(name, key):
        return [rec["ranks"][0].get(key) for rec in records if rec["backend"] == name and rec["ok"]]

    for name in names:
        hops[name] = Summary(values(name, "ring_us_per_hop"))
    for name in names:
        hop = hops[name]
        p99 = Summary(values(name, "ring_lap_us_p99"))
        worst = Summary(values(name, "ring_lap_us_max"))
        summary[name] = {"us_per_hop": hop.as_dict(), "lap_p99_us": p99.as_dict(),
                         "lap_max_us": worst.as_dict()}
        main = f"commrt-{BACKENDS[name]['group']}"
        cmp = ""
        if BACKENDS[name]["kind"] != "commrt" and main in hops:
            cmp = ratio(hops[main].median, hop.median)
        rows.append([BACKENDS[name]["label"], hop.cell(), p99.cell(), worst.cell(), cmp])
    headers = ["backend", "µs per hop", "lap p99 µs", "slowest lap µs", "commrt / peer"]
    title = (f"ring: {nranks} ranks on {os.cpu_count()} cores pass 8 bytes round a ring; "
             f"median [min-max] over rounds; lower is better; commrt / peer compares the "
             f"same transport (< 1 means commrt is faster); OpenMPI runs with --oversubscribe")
    return title + "\n" + table(headers, rows), summary


# -- memory and soak -----------------------------------------------------------------

def _dev_shm():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _unowned(names):
    """Those of the /dev/shm names that no live process maps or holds open.

    Other jobs on the machine create and remove their own entries while we
    run; an entry some live process still uses is not one left behind."""
    names = set(names)
    if not names:
        return []
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        used.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split()[0])
        except OSError:
            continue
    return sorted(n for n in names if n not in used and os.path.exists(f"/dev/shm/{n}"))


def memory_table(records, names, left_by):
    rows, summary, notes = [], {}, []
    mib = 1 << 20
    for name in names:
        for rec in records:
            if rec["backend"] != name:
                continue
            if not rec["ok"]:
                rows.append([BACKENDS[name]["label"], "-", "FAILED"] + [""] * 8)
                continue
            for r in rec["ranks"]:
                if "soak_checkpoints" not in r:
                    continue
                cps = {int(k): v for k, v in r["soak_checkpoints"].items()}
                keys = sorted(cps)
                warm = cps[keys[1]] if len(keys) > 2 else cps[keys[0]]
                end = cps[keys[-1]]
                proc = r.get("proc", {})
                pre, post = proc.get("before_init"), proc.get("after_init")
                closed = proc.get("after_close")
                growth = (end["rss"] - warm["rss"]) / warm["rss"] * 100
                init_rss = (post["rss"] - pre["rss"]) / mib if pre and post else None
                fds = "/".join(str(x) for x in (
                    pre["fds"] if pre else "?", post["fds"] if post else "?", warm["fds"],
                    end["fds"], closed["fds"] if closed else "-"))
                reported = _reported_per_peer(r.get("transport_info"))
                rows.append([BACKENDS[name]["label"], r["rank"],
                             fmt_num(reported / mib if reported is not None else None),
                             fmt_num(init_rss), fmt_num(end["shm_mapped"] / mib),
                             fmt_num(warm["rss"] / mib), fmt_num(end["rss"] / mib),
                             f"{growth:+.1f}%", fds, fmt_num(r["soak_messages"] / r["soak_s"]),
                             len(r.get("soak_errors", []))])
                summary.setdefault(name, []).append({
                    "rank": r["rank"], "rss_growth_pct": growth, "import_init_rss_mib": init_rss,
                    "fds": fds, "checkpoints": cps, "errors": r.get("soak_errors"),
                    "transport_info": r.get("transport_info")})
                info = (r.get("transport_info") or {}).get("memory_info")
                if info:
                    notes.append(f"  {name} rank {r['rank']}: comm.memory_info() = "
                                 f"{json.dumps(info, default=repr)[:400]}")
                for e in r.get("soak_errors", []):
                    notes.append(f"  {name} rank {r['rank']} soak error: {e}")
    headers = ["backend", "rank", "reported/peer MiB", "import+init RSS MiB", "shm mapped MiB",
               "RSS@10% MiB",
               "RSS end MiB", "growth", "fds pre/init/10%/end/closed", "msgs/s", "errors"]
    title = ("memory: soak of mixed messages (0 B-1 MiB; blocking, bidirectional, bursts over 8 "
             "tags); growth = RSS end vs RSS after 10% (target within 5%); reported/peer = the "
             "largest per-peer figure of comm.memory_info() (target <= 8 MiB)")
    text = title + "\n" + table(headers, rows)
    left = {n: v for n, v in left_by.items() if v}
    text += ("\n/dev/shm entries left behind: " + ("none" if not left else "; ".join(
        f"after {n}: {v}" for n, v in left.items()))
        + "  (new entries after each run that no live process uses)")
    if notes:
        text += "\n" + "\n".join(notes)
    else:
        text += "\ncomm.memory_info(): not available"
    return text, summary, left


def _reported_per_peer(info):
    """The largest per-peer byte count in comm.memory_info(), or None."""
    per = ((info or {}).get("memory_info") or {})
    per = per.get("per_peer") if isinstance(per, dict) else None
    if isinstance(per, dict):
        vals = [v for v in per.values() if isinstance(v, (int, float))]
        return max(vals) if vals else None
    return None


# -- machine -----------------------------------------------------------------------------

def machine_info():
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    for mod in ("mpi4py", "torch"):
        if _has(mod):
            try:
                info[mod] = importlib.import_module(mod).__version__
            except Exception:
                pass
    if shutil.which("ompi_info"):
        try:
            out = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True,
                                 timeout=20).stdout
            info["openmpi"] = out.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        info["commit"] = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _out(*parts):
    print(*parts, flush=True)


# -- command line ------------------------------------------------------------------------

def _sizes(text):
    if text == "default":
        return DEFAULT_SIZES
    if text == "all":
        return ALL_SIZES
    return sorted({parse_size(t) for t in text.split(",") if t.strip()})


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m commrt.bench p2p", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sel = p.add_argument_group("what to measure (default: --latency --bandwidth)")
    sel.add_argument("--latency", action="store_true", help="ping-pong latency")
    sel.add_argument("--bandwidth", action="store_true", help="windowed bandwidth")
    sel.add_argument("--overlap", action="store_true", help="64 MiB isend/irecv beside compute")
    sel.add_argument("--ring", type=int, nargs="?", const=8, metavar="N",
                     help="N ranks (default 8) passing 8 bytes round a ring")
    sel.add_argument("--memory", action="store_true", help="memory report and soak")
    sel.add_argument("--all", action="store_true", help="every measurement above")
    p.add_argument("--transports", default="shm,tcp", help="commrt transports (default shm,tcp)")
    p.add_argument("--peers", action="store_true",
                   help="also mpi4py/OpenMPI (sm with and without CMA, tcp) and Gloo")
    p.add_argument("--backends", help="exact comma list of backends instead: "
                   + ",".join(BACKENDS))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--sizes", type=_sizes, default=DEFAULT_SIZES,
                   help="comma list (8,1K,4M), 'default' (8 B-64 MiB subset) or 'all' "
                        "(powers of 2, 8 B-64 MiB)")
    p.add_argument("--iters", type=int, help="fixed timed iterations per size "
                   "(default: as many as fill --target-time)")
    p.add_argument("--target-time", type=float, default=0.1,
                   help="seconds of timed iterations per size and run (default 0.1)")
    p.add_argument("--window", type=int, default=64, help="bandwidth window (default 64)")
    p.add_argument("--no-check", action="store_true", help="skip the data check per size")
    p.add_argument("--overlap-bytes", type=parse_size, default=64 << 20,
                   help="overlap transfer size (64M)")
    p.add_argument("--compute-ms", type=float, default=100.0, help="overlap compute (100)")
    p.add_argument("--reps", type=int, default=8, help="overlap repetitions per run (8)")
    p.add_argument("--ring-time", type=float, default=2.0, help="seconds per ring run")
    p.add_argument("--messages", type=int, default=100000, help="soak messages (default 10^5)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds before a run is killed (default 180)")
    p.add_argument("--starter", choices=("auto", "spawn", "world"), default="spawn",
                   help="how commrt ranks start: spawn (own starter with commrt's store), "
                        "world (commrt.testing.World), auto (world if present)")
    p.add_argument("--json", metavar="FILE", help="save raw results and summaries")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    if args.all:
        args.latency = args.bandwidth = args.overlap = args.memory = True
        args.ring = args.ring or 8
    if not (args.latency or args.bandwidth or args.overlap or args.ring or args.memory):
        args.latency = args.bandwidth = True
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def _select(args, log):
    if args.backends:
        names = [n.strip() for n in args.backends.split(",") if n.strip()]
        unknown = [n for n in names if n not in BACKENDS]
        if unknown:
            raise SystemExit(f"unknown backends {unknown}; known: {', '.join(BACKENDS)}")
    else:
        names = [f"commrt-{t.strip()}" for t in args.transports.split(",") if t.strip()]
        for n in names:
            if n not in BACKENDS:
                raise SystemExit(f"unknown transport in {args.transports!r}")
        if args.peers:
            names += ["mpi-sm", "mpi-sm-nocma", "mpi-tcp", "gloo"]
    usable, missing = [], {}
    for n in names:
        why = availability(n)
        if why:
            log(f"skipping {n}: {why}")
            missing[n] = why
        else:
            usable.append(n)
    # commrt and its peers side by side: shm group first, then tcp
    order = ["commrt-shm", "mpi-sm", "mpi-sm-nocma", "commrt-tcp", "mpi-tcp", "gloo"]
    return [n for n in order if n in usable], missing


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    names, missing = _select(args, log)
    machine = machine_info()
    _out(f"machine: {machine.get('cpu', '?')}, {machine['cpus']} cores, "
          f"{machine.get('mem_gib', '?')} GiB, {machine['platform']}, Python {machine['python']}"
          + (f", {machine['openmpi']}" if "openmpi" in machine else "")
          + (f", mpi4py {machine['mpi4py']}" if "mpi4py" in machine else "")
          + (f", torch {machine['torch']}" if "torch" in machine else ""))
    _out(f"command: python -m commrt.bench p2p {' '.join(sys.argv[1:] if argv is None else argv)}")
    out = {"machine": machine, "args": {k: v for k, v in vars(args).items()},
           "backends": names, "runs": {}, "summary": {}}
    failed = False

    tasks = [t for t in ("latency", "bandwidth") if getattr(args, t)]
    if tasks and names:
        spec = {"tasks": tasks, "sizes": args.sizes, "iters": args.iters,
                "target_s": args.target_time, "window": args.window,
                "check": not args.no_check}
        log(f"latency/bandwidth: {', '.join(names)}; {args.rounds} rounds, "
            f"{len(args.sizes)} sizes")
        recs = interleaved(names, args.rounds,
                           lambda n, r: run_backend(n, 2, spec, args), log)
        text, summ = p2p_tables(recs, names, args.sizes, tasks)
        _out("\n" + text + load_note(recs))
        out["runs"]["p2p"], out["summary"]["p2p"] = recs, summ
        failed |= _report_failures(recs)

    if args.overlap:
        ov = [n for n in names if n in ("commrt-shm", "commrt-tcp", "mpi-sm", "gloo")]
        if ov:
            spec = {"tasks": ["overlap"], "overlap_bytes": args.overlap_bytes,
                    "compute_s": args.compute_ms / 1e3, "reps": args.reps}
            log(f"overlap: {', '.join(ov)}")
            recs = interleaved(ov, args.rounds, lambda n, r: run_backend(n, 2, spec, args), log)
            text, summ = overlap_table(recs, ov)
            _out("\n" + text + load_note(recs))
            out["runs"]["overlap"], out["summary"]["overlap"] = recs, summ
            failed |= _report_failures(recs)

    if args.ring:
        rg = [n for n in names if n in ("commrt-shm", "commrt-tcp", "mpi-sm", "mpi-tcp")]
        if rg:
            spec = {"tasks": ["ring"], "ring_s": args.ring_time}
            log(f"ring of {args.ring}: {', '.join(rg)}")
            recs = interleaved(rg, args.rounds, lambda n, r: run_backend(
                n, args.ring, spec, args, oversubscribe=True), log)
            text, summ = ring_table(recs, rg, args.ring)
            _out("\n" + text + load_note(recs))
            out["runs"]["ring"], out["summary"]["ring"] = recs, summ
            failed |= _report_failures(recs)

    if args.memory:
        mem = [n for n in names if n in ("commrt-shm", "commrt-tcp", "mpi-sm", "gloo")]
        if mem:
            spec = {"tasks": ["soak"], "messages": args.messages}
            log(f"memory/soak ({args.messages} messages): {', '.join(mem)}")
            def soak_run(name, rnd):
                before = _dev_shm()
                try:
                    return run_backend(name, 2, spec, args)
                finally:
                    time.sleep(0.2)
                    left_by[name] = _unowned(_dev_shm() - before)

            left_by = {}
            recs = interleaved(mem, 1, soak_run, log)
            text, summ, left = memory_table(recs, mem, left_by)
            _out("\n" + text + load_note(recs))
            out["runs"]["memory"], out["summary"]["memory"] = recs, summ
            out["summary"]["dev_shm_left"] = left
            failed |= _report_failures(recs)

    for name, why in missing.items():
        _out(f"\nnot measured: {name} ({why})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_launch.jsonable(out), f, indent=1)
        log(f"raw results: {args.json}")
    return 1 if failed else 0


def _report_failures(records):
    bad = [r for r in records if not r["ok"]]
    for r in bad:
        _out(f"\n{r['backend']} round {r['round'] + 1} failed:\n{r['error']}")
    return bool(bad)


if __name__ == "__main__":
    sys.exit(main())
