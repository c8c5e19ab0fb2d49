"""Every collective against OpenMPI and Gloo in one run (nccl-tests metrics).

    python -m commrt.bench collectives [--kinds broadcast,reduce,...|all|v]
        [--nranks 2,3,4,8] [--sizes 8,1K,64K,1M,16M,64M] [--algos auto|all|a,b]
        [--transport shm|tcp] [--rounds 3] [--interleave kind|run] [--peers] [--plot-dir docs/img]
        [--markdown out.md] [--json out.json] [--counts] [--fresh-inputs] [--fast-state]
        [--buffer-align 64] [--buffer-pages huge|small|allocator] [--busy K]

For every world size and collective, each round launches every backend once
(commrt, with ``--peers`` mpi4py on OpenMPI with its default single-copy (CMA)
and with it disabled, and torch.distributed on Gloo), in turn, the first one
turning round by round, and each launch measures that collective at every
size (``_coll.measure``: float32 SUM, root 0; sizes as nccl-tests count
them), so rounds interleave the systems a few seconds apart: this host
swings between a fast and a slow state every 30-60 s, and systems measured
a whole run apart (``--interleave run``: one launch measures every
collective) met different states by chance (docs/performance-collectives.md).  ``--kinds v``
(or their names) measures the variable-size collectives, all_gatherv,
gatherv, scatterv and all_to_allv, with counts that differ on every rank
(``_coll.VKINDS``), against OpenMPI's Allgatherv, Gatherv, Scatterv and
Alltoallv, and Gloo's all_to_all_single with split sizes (Gloo has no
gathers or scatters of unequal blocks).  Every figure
is the median of the rounds with its range.  busbw = algbw times nccl-tests'
factor: all_reduce 2(N-1)/N; broadcast and reduce 1; all_gather, gather,
reduce_scatter, scatter and all_to_all (N-1)/N; a barrier only has a time.
``vs MPI`` is the better OpenMPI configuration's median time over commrt's
(auto), ``vs Gloo`` Gloo's over commrt's: above 1.00 commrt is faster.
``--algos all`` adds every fixed algorithm and ``auto/best``: the time of the
algorithm the automatic choice took, in its own column, over the best fixed
one's, with its name (auto and its namesake run the same plan; measured
apart, two loops of one 8-byte plan at N = 4 differ by up to 2x from slice
to slice, more than the choices do; the auto column's own time where the
choice is not known, as when COMMRT_<COLLECTIVE>_ALGO forces it).
``--json`` is rewritten after every round of a collective (every system's
launch of it), so a run cut short keeps its samples.  ``--plot-dir`` writes
``collectives-<kind>.png`` (busbw, or time for the barrier, against size, a
line per system, a panel per N); ``--markdown`` the tables as Markdown
(docs/performance-collectives.md).  ``--counts`` adds a table of what a
call cost each system's busiest rank (user and system CPU µs, voluntary and
involuntary context switches per call, medians of the rounds; ``_coll``):
where ranks outnumber cores, how the waiters share them.  ``--fresh-inputs``
writes the input before every call (timed apart, ``_coll``): without it a
single-copy read finds the peer's unchanged input in its own cache, which
flatters single-copy paths (commrt's and OpenMPI's alike).  ``--busy K``
keeps K busy-looping processes running beside every launch of every
system for the whole run (outside load, such as a training job's data
loaders: a waiter that spins or sleeps badly shows there).  ``--fast-state``
runs each round of a collective (every system's launch of it) in the host's
fast state (``hoststate.in_fast_state``: it waits for that state, probes
after, and runs the round again, up to 3 tries, where the state changed
under it; only the last try is filed): the interleaving keeps systems a few
seconds apart, and this keeps a flip from landing between them.  The probes
go into the JSON (``"host"``) and the report says how many rounds were fast
at both ends.  ``--buffer-align`` places every system's buffers (``_coll``:
64 bytes by default, as PyTorch places a tensor; 0 leaves it to NumPy, whose
placement made the kernel's single-copy reads 1.5-5x slower by accident of
each process's allocations).  ``--buffer-pages`` chooses the pages under
every buffer of 2 MiB or more, for every system alike: ``huge`` (default; a
mapping of its own, advised to 2 MiB pages, as NumPy gives a fresh large
array and PyTorch with THP_MEM_ALLOC_ENABLE=1), ``small`` (4 KiB pages, as
PyTorch's default allocator gives where THP is ``madvise``), ``allocator``
(NumPy's, which depends on what the process freed before).  The kernel's
single-copy reads run about 3x slower over small pages.  ``allreduce`` and
the per-collective benchmark names run this with one collective.
"""
import argparse
import contextlib
import json
import subprocess
import sys

from commrt.bench import _coll, _peers, hoststate
from commrt.bench._coll import KINDS, VKINDS
from commrt.bench._stats import Summary, fmt_size, parse_size, table

MPI = ("ompi", "ompi-nocma")


def busbw_factor(kind, n):
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("broadcast", "reduce"):
        return 1.0
    if kind == "barrier":
        return 0.0
    return (n - 1) / n


def algorithms(kind, which):
    if which == "auto":
        return ["auto"]
    if which == "all":
        return every_algorithm(kind) if kind != "barrier" else ["auto"]
    return which.split(",")


def every_algorithm(kind):
    from commrt.collectives import ALGORITHMS

    names = list(ALGORITHMS[kind])
    if kind == "all_reduce":
        names.remove("hierarchical")  # one host: the same as reduce_bcast plus a no-op ring
    return names + ["auto"]


def collect(args, log, counts=None, choices=None, states=None):
    """{n: {kind: {(backend, algo): {bytes: [times]}}}}; with a dict as counts (and
    --counts), it gets the same shape with a COUNTS dict per round for each time;
    with a dict as choices, {n: {kind: {bytes: [the algorithm auto chose, per
    round]}}}; with a list as states (and --fast-state), one entry per round
    of each collective: {"n", "round", "kinds"} and hoststate.in_fast_state's
    probes."""
    data = {}
    for n in args.nranks:
        per = data.setdefault(n, {k: {} for k in args.kinds})
        spec = {"kinds": args.kinds, "sizes": args.sizes, "target_s": args.target_s,
                "slices": args.slices, "counts": counts is not None, "fresh": args.fresh_inputs,
                "align": args.buffer_align, "pages": args.buffer_pages}
        mine = dict(spec, algos={k: algorithms(k, args.algos) for k in args.kinds})
        theirs = dict(spec, algos={k: ["default"] for k in args.kinds})
        jobs = [("commrt", mine, lambda sp, n=n: _peers.run_commrt(n, sp, args.transport,
                                                                    args.timeout))]
        if args.peers:
            jobs += [(name, theirs, job) for name, job in _peers.mpi_jobs(n, args.timeout, log)]
            if _peers.has_module("torch"):
                jobs.append(("gloo", theirs,
                             lambda sp, n=n: _peers.run_gloo(n, sp, args.timeout)))
            else:
                log("torch missing: no Gloo peer")
        groups = [[k] for k in args.kinds] if args.interleave == "kind" else [args.kinds]
        for rnd in range(args.rounds):
            for kinds in groups:
                # who goes first turns round by round: none always follows a switch
                order = jobs[rnd % len(jobs):] + jobs[:rnd % len(jobs)]

                def launches(kinds=kinds, order=order, rnd=rnd):
                    got = []
                    for name, sp, job in order:
                        log(f"N={n} round {rnd + 1}/{args.rounds}: {name} {','.join(kinds)}")
                        try:
                            got.append((name, job(dict(sp, kinds=kinds))))
                        except Exception as exc:  # noqa: BLE001 - report and go on
                            log(f"  {name} failed: {exc}")
                    return got
                if args.fast_state:
                    got, probes = hoststate.in_fast_state(launches, log)
                    if states is not None:
                        states.append({"n": n, "round": rnd, "kinds": kinds, **probes})
                else:
                    got = launches()
                for name, res in got:
                    _take(per, name, res, n, counts, choices)
                if args.json:                   # a run cut short still leaves its samples
                    write_json(args.json, data, choices, states)
    return data


def _take(per, name, res, n, counts, choices):
    """File one launch's rows (collect's shapes)."""
    for row in res["rows"]:
        key = (name, row["algo"])
        per[row["kind"]].setdefault(key, {}).setdefault(row["bytes"], []).append(row["time_s"])
        if choices is not None and row.get("chose"):
            choices.setdefault(n, {}).setdefault(row["kind"], {}).setdefault(
                row["bytes"], []).append(row["chose"])
        if counts is not None and "counts" in row:
            counts.setdefault(n, {}).setdefault(row["kind"], {}).setdefault(
                key, {}).setdefault(row["bytes"], []).append(row["counts"])


def state_line(states):
    """How the rounds met the host's state (--fast-state)."""
    fast = sum(hoststate.steady(s) for s in states)
    again = sum(s["tries"] - 1 for s in states)
    return (f"(host state: {fast} of {len(states)} rounds of a collective fast at both ends; "
            f"{again} run again after the state changed under them)")


def write_json(path, data, choices=None, states=None):
    """{N: {kind: {"backend/algo": {bytes: [times]}, "chose/auto": {bytes: [the
    algorithm auto chose, per round]}}}}, and with --fast-state "host": collect's
    states."""
    out = {str(n): {k: {f"{b}/{a}": v for (b, a), v in per.items()}
                    for k, per in by_kind.items()}
           for n, by_kind in data.items()}
    for n, by_kind in (choices or {}).items():
        for k, by_size in by_kind.items():
            out[str(n)][k]["chose/auto"] = by_size
    if states:
        out["host"] = states
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def _median(per, key, size):
    return Summary(per.get(key, {}).get(size, [])).median


def _mpi_best(per, size):
    """The better OpenMPI configuration's median time at size (None if neither ran)."""
    ts = [t for t in (_median(per, (m, "default"), size) for m in MPI) if t is not None]
    return min(ts) if ts else None


def _ratio(a, b):
    return "n/a" if a is None or b is None or not b else f"{a / b:.2f}"


def _auto_best(med, fixed, chose, mine):
    """auto/best: the time of the algorithm the automatic choice took (its own
    column, measured beside the others: "auto" and its namesake run the same
    plan, and at a few µs two measurements of it differ by more than the
    choices do), over the best fixed algorithm's, with the name it chose; the
    measured auto column's where the choice is not known."""
    best = [med[k].median for k in fixed if med[k].median]
    if not best:
        return "n/a"
    names = [k[1] for k in fixed]
    pick = max(set(chose), key=chose.count) if chose else (names[0] if len(names) == 1
                                                          else None)
    if pick in names and med[("commrt", pick)].median:
        return f"{med[('commrt', pick)].median / min(best):.2f} {pick}"
    return _ratio(mine, min(best))


def kind_tables(args, kind, n, per, chose=None):
    """(time rows, busbw rows, headers) of one collective at one N; chose: {bytes:
    [the algorithm auto chose, per round]} (collect's choices)."""
    keys = sorted(per, key=lambda k: (k[0] != "commrt", k[0], k[1] == "auto", k[1]))
    names = [k[1] if k[0] == "commrt" else k[0] for k in keys]
    fixed = [k for k in keys if k[0] == "commrt" and k[1] != "auto"]
    f = busbw_factor(kind, n)
    sizes = [0] if kind == "barrier" else args.sizes
    rows_t, rows_b = [], []
    for size in sizes:
        med = {k: Summary(per[k].get(size, [])) for k in keys}
        mine = med.get(("commrt", "auto"))
        mine = mine.median if mine else None
        extra = [_ratio(_mpi_best(per, size), mine), _ratio(_median(per, ("gloo", "default"),
                                                                    size), mine)]
        if fixed:
            extra.append(_auto_best(med, fixed, (chose or {}).get(size, []), mine))
        rows_t.append([fmt_size(size)] + [m.cell() if m.median is None else
                                          Summary([t * 1e6 for t in per[k][size]]).cell()
                                          for k, m in med.items()] + extra)
        if f:
            rows_b.append([fmt_size(size)] + [
                "n/a" if med[k].median is None else
                Summary([size / t * f / 1e9 for t in per[k][size]]).cell() for k in keys])
    return rows_t, rows_b, names, ["vs MPI", "vs Gloo"] + (["auto/best"] if fixed else [])


def report(args, data, markdown=False, choices=None):
    out = []
    for kind in args.kinds:
        for n, by_kind in data.items():
            per = by_kind[kind]
            if not per:
                continue
            rows_t, rows_b, names, extra = kind_tables(
                args, kind, n, per, (choices or {}).get(n, {}).get(kind))
            head = ["size"] + names + extra
            title = (f"{kind}, N = {n}, {args.transport}: µs per call, median [min-max] of "
                     f"{args.rounds} rounds")
            out += _section(title, head, rows_t, markdown)
            if rows_b:
                out += _section(f"{kind}, N = {n}: busbw GB/s, median [min-max]",
                                ["size"] + names, rows_b, markdown)
    return "\n".join(out)


def report_counts(args, counts, markdown=False):
    """Per collective and N, a row per system: per call, the medians of the rounds of
    the busiest rank's user and system CPU (µs) and context switches (voluntary,
    involuntary)."""
    from commrt.bench._coll import COUNTS

    out = []
    for kind in args.kinds:
        for n, by_kind in counts.items():
            per = by_kind.get(kind)
            if not per:
                continue
            keys = sorted(per, key=lambda k: (k[0] != "commrt", k[0], k[1] != "auto", k[1]))
            sizes = [0] if kind == "barrier" else args.sizes
            rows = []
            for key in keys:
                name = key[0] if key[1] in ("auto", "default") else f"{key[0]}/{key[1]}"
                for size in sizes:
                    samples = per[key].get(size)
                    if not samples:
                        continue
                    med = [Summary([c[f] for c in samples]).median for f in COUNTS]
                    rows.append([name, fmt_size(size), f"{med[0]:.2f}", f"{med[1]:.2f}",
                                 f"{med[2]:.2f}", f"{med[3]:.2f}"])
            title = (f"{kind}, N = {n}: per call, the busiest rank, median of "
                     f"{args.rounds} rounds")
            out += _section(title, ["system", "size", "user µs", "sys µs", "slept",
                                    "switched"], rows, markdown)
    return "\n".join(out)


def _section(title, head, rows, markdown):
    if not markdown:
        return ["", title, table(head, rows)]
    lines = ["", f"**{title}**", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def plot(args, data, outdir):
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)      # (a run's tables must not end in a missing folder)
    paths = []
    for kind in args.kinds:
        ns = [n for n in data if data[n][kind]]
        if not ns:
            continue
        fig, axes = plt.subplots(1, len(ns), figsize=(5.5 * len(ns), 4.2), squeeze=False)
        for ax, n in zip(axes[0], ns):
            _panel(ax, args, kind, n, data[n][kind])
        fig.tight_layout()
        path = os.path.join(outdir, f"collectives-{kind}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _panel(ax, args, kind, n, per):
    f = busbw_factor(kind, n)
    sizes = [0] if kind == "barrier" else args.sizes
    for key, by_size in sorted(per.items()):
        xs = [s for s in sizes if by_size.get(s)]
        med = [Summary(by_size[s]).median for s in xs]
        ys = [s / t * f / 1e9 for s, t in zip(xs, med)] if f else [t * 1e6 for t in med]
        label = (("commrt" if key[1] == "auto" else f"commrt/{key[1]}") if key[0] == "commrt"
                 else key[0])
        if kind == "barrier":
            ax.bar(label, ys[0] if ys else 0)
            continue
        ax.plot(xs, ys, "-" if key[0] == "commrt" else "--", marker="o", ms=3, label=label,
                lw=2.5 if key == ("commrt", "auto") else 1.2)
    if kind != "barrier":
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.legend(fontsize=7)
    ax.set_ylabel("busbw (GB/s)" if f else "µs per call")
    ax.set_title(f"{kind}, N = {n} ({args.transport})")
    ax.grid(alpha=0.3)


@contextlib.contextmanager
def busy_loops(k):
    """k processes that spin (a pure-Python loop each) until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def parse_args(argv, kinds=None):
    p = argparse.ArgumentParser(prog="python -m commrt.bench collectives", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=kinds or "all",
                   help="comma list of " + ", ".join(KINDS + VKINDS) + "; all: the first "
                        f"{len(KINDS)}; v: the variable-size ones (unequal counts)")
    p.add_argument("--nranks", default="2,3,4,8")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    p.add_argument("--algos", default="auto", help="auto, all, or a comma list")
    p.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interleave", default="kind", choices=("kind", "run"),
                   help="what one launch of a system measures before the next system's: "
                        "one collective (kind) or every one asked for (run)")
    p.add_argument("--slices", type=int, default=5, help="timed slices per loop")
    p.add_argument("--target-s", type=float, default=0.1, help="seconds per timed loop")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--peers", action="store_true", help="also mpi4py/OpenMPI and Gloo")
    p.add_argument("--plot-dir", help="write collectives-<kind>.png here")
    p.add_argument("--markdown", help="write the tables as Markdown here")
    p.add_argument("--json", help="write the raw times here")
    p.add_argument("--counts", action="store_true",
                   help="also CPU time and context switches per call (getrusage)")
    p.add_argument("--fresh-inputs", action="store_true",
                   help="write the input before every call (timed apart), as training does")
    p.add_argument("--buffer-align", type=int, default=_coll.ALIGN, metavar="BYTES",
                   help="every system's buffers start at this alignment (default 64, "
                        "PyTorch's; 0: wherever NumPy puts them)")
    p.add_argument("--buffer-pages", choices=_coll.PAGE_POLICIES, default=_coll.PAGES,
                   help="the pages under every system's buffers of 2 MiB or more: huge "
                        "(default), small (4 KiB), allocator (NumPy's)")
    p.add_argument("--fast-state", action="store_true",
                   help="run each round of a collective (every system's launch) in the "
                        "host's fast state: wait for it, run the round again where it "
                        "changed (bench hoststate)")
    p.add_argument("--busy", type=int, default=0,
                   help="busy-looping processes beside the jobs for the whole run")
    args = p.parse_args(argv)
    groups = {"all": list(KINDS), "v": list(VKINDS)}
    args.kinds = [k for name in args.kinds.split(",") for k in groups.get(name, [name])]
    bad = [k for k in args.kinds if k not in KINDS + VKINDS]
    if bad:
        p.error(f"unknown collective(s) {', '.join(bad)}; expected {', '.join(KINDS + VKINDS)}")
    args.nranks = [int(x) for x in args.nranks.split(",")]
    args.sizes = [parse_size(x) for x in args.sizes.split(",")]
    if args.buffer_align < 0:
        p.error(f"--buffer-align must be 0 (NumPy's placement) or a number of bytes, "
                f"not {args.buffer_align}")
    return args


def main(argv, kinds=None):
    args = parse_args(argv, kinds)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    counts = {} if args.counts else None
    choices, states = {}, []
    with busy_loops(args.busy):
        data = collect(args, log, counts, choices, states)
    if args.busy:
        print(f"(under outside load: {args.busy} busy-looping process(es) beside every job)")
    if args.fast_state:
        print(state_line(states))
    print(report(args, data, choices=choices))
    if counts:
        print(report_counts(args, counts))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report(args, data, markdown=True, choices=choices).lstrip() + "\n")
            if counts:
                f.write(report_counts(args, counts, markdown=True) + "\n")
        print(f"\nmarkdown: {args.markdown}")
    if args.plot_dir:
        for path in plot(args, data, args.plot_dir):
            print(f"plot: {path}")
    if args.json:
        write_json(args.json, data, choices, states)
    return 0
