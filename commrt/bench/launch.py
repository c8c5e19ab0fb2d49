"""Job start-up: wall time of commrt-launch -n 8 beside mpirun -np 8 and torchrun.

    python -m commrt.bench launch                 # 8 ranks, 5 interleaved rounds
    python -m commrt.bench launch -n 4 --rounds 3 --no-peers
    python -m commrt.bench launch --peers mpirun   # leave torchrun out (~15 s a job)

Each launcher runs a job whose ranks initialise, do one barrier and exit:
``commrt.init()`` + ``comm.barrier()`` (a ring exchange if the collectives
are missing), mpi4py's ``COMM_WORLD.Barrier()`` under ``mpirun -np N``, and
Gloo's ``init_process_group`` + ``barrier`` under ``torchrun
--nproc-per-node N --standalone``.  The wall time is that of the launcher
command, from exec to exit.  Launchers run in the same invocation,
interleaved round by round (forward order in even rounds, reverse in odd
ones); each cell is the median over rounds with [min-max].  Python
launchers are started as ``python -m`` so that no wrapper (a pyenv shim,
say) is timed.  Beside the wall time, the CPU time (user + system) of the
whole job: the launcher and every process it started, as getrusage counts
the children it reaped; on a loaded machine it is the steadier figure.
Targets: commrt <= 1.0x mpirun and <= 0.5x torchrun (wall time).
"""
import argparse
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from commrt.bench._stats import Summary, fmt_num, ratio, table

COMMRT_JOB = """\
import commrt
comm = commrt.init()
comm.barrier()
comm.close()
"""

MPI_JOB = """\
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
"""

TORCH_JOB = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def launchers(nprocs, workdir, peers=("mpirun", "torchrun")):
    """name -> argv of commrt-launch and of each launcher of `peers` that is installed."""
    def job(name, text):
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    found = {"commrt-launch": [sys.executable, "-m", "commrt.launcher", "-n", str(nprocs),
                               job("commrt_job.py", COMMRT_JOB)]}
    if not peers:
        return found
    if "mpirun" in peers and shutil.which("mpirun") and _importable("mpi4py"):
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        found["mpirun"] = ["mpirun", *root, "--oversubscribe", "-np", str(nprocs),
                           sys.executable, job("mpi_job.py", MPI_JOB)]
    if "torchrun" in peers and _importable("torch"):
        found["torchrun"] = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", str(nprocs), job("torch_job.py", TORCH_JOB)]
    return found


def _importable(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_once(argv, timeout):
    """(wall seconds, CPU seconds of the job) from start to exit, or (None, None)
    (with the reason printed) on failure."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cpu0, start = _children_cpu(), time.perf_counter()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {argv[0]} ... timed out after {timeout:g} s", file=sys.stderr)
        return None, None
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if out.returncode != 0:
        tail = "\n    ".join((out.stderr or out.stdout).strip().splitlines()[-5:])
        print(f"  {' '.join(argv[:4])} ... exited {out.returncode}:\n    {tail}", file=sys.stderr)
        return None, None
    return elapsed, cpu


def stale_bytecode():
    """commrt's modules without up-to-date bytecode, when nothing will write it
    (PYTHONDONTWRITEBYTECODE): every rank then compiles them from source."""
    if not sys.dont_write_bytecode:
        return []
    stale = []
    for root in {os.path.dirname(importlib.util.find_spec(m).origin)
                 for m in ("commrt.comm", "commrt.launcher.cli", "commrt.kernels")}:
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py") and not _fresh_bytecode(os.path.join(folder, name)):
                    stale.append(os.path.join(folder, name))
    return stale


def _fresh_bytecode(path):
    try:
        with open(importlib.util.cache_from_source(path), "rb") as f:
            head = f.read(16)
        st = os.stat(path)
    except OSError:
        return False
    flags = int.from_bytes(head[4:8], "little")
    if flags:  # hash-based bytecode: checked by hash, assume fresh
        return True
    return (int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m commrt.bench launch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nprocs", type=int, default=8, help="ranks per job (default 8)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--no-peers", action="store_true", help="only commrt-launch")
    parser.add_argument("--peers", default="mpirun,torchrun",
                        help="launchers to time beside commrt-launch (default mpirun,torchrun)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per job, seconds")
    args = parser.parse_args(argv)
    peers = () if args.no_peers else tuple(p for p in args.peers.split(",") if p)
    unknown = sorted(set(peers) - {"mpirun", "torchrun"})
    if unknown:
        parser.error(f"--peers: unknown launcher(s) {', '.join(unknown)} (known: mpirun, torchrun)")

    stale = stale_bytecode()
    if stale:
        print(f"note: {len(stale)} of commrt's modules have no up-to-date bytecode and "
              f"PYTHONDONTWRITEBYTECODE is set, so every rank compiles them from source "
              f"(e.g. {os.path.relpath(stale[0])}); `pip install -e .` again, or `python -m "
              f"compileall -q commrt kernels launcher`, writes it", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="commrt-bench-launch-") as workdir:
        commands = launchers(args.nprocs, workdir, peers)
        samples = {name: [] for name in commands}
        cpu = {name: [] for name in commands}
        time_once(commands["commrt-launch"], args.timeout)  # warm the page cache, once
        for rnd in range(args.rounds):
            order = list(commands) if rnd % 2 == 0 else list(reversed(commands))
            for name in order:
                wall, used = time_once(commands[name], args.timeout)
                samples[name].append(wall)
                cpu[name].append(used)
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{n} {fmt_num(samples[n][-1])} s (CPU {fmt_num(cpu[n][-1])} s)" for n in order),
                file=sys.stderr)

    summaries = {name: Summary(s) for name, s in samples.items()}
    cpu_summaries = {name: Summary(s) for name, s in cpu.items()}
    ours = summaries["commrt-launch"].median
    ours_cpu = cpu_summaries["commrt-launch"].median
    rows = [[name, s.cell(), ratio(ours, s.median) if name != "commrt-launch" else "1.00",
             cpu_summaries[name].cell(),
             ratio(ours_cpu, cpu_summaries[name].median) if name != "commrt-launch" else "1.00"]
            for name, s in summaries.items()]
    print(f"\nJob start-up, {args.nprocs} ranks: init + one barrier + exit "
          f"(seconds, median [min-max] of {args.rounds}; {os.cpu_count()} cores; CPU: user + "
          f"system of the launcher and all it started)\n")
    print(table(["launcher", "wall s", "commrt / this", "CPU s", "commrt / this (CPU)"], rows))
    targets = {"mpirun": 1.0, "torchrun": 0.5}
    for name, limit in targets.items():
        if name in summaries and summaries[name].median and ours:
            met = ours / summaries[name].median <= limit
            print(f"target commrt <= {limit:.1f}x {name}: {'met' if met else 'NOT met'}")
    return 0 if ours is not None else 1


if __name__ == "__main__":
    sys.exit(main())
