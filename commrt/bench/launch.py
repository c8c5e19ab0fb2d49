"""Job start-up: wall time of commrt-launch -n 8 beside mpirun -np 8 and torchrun.

    python -m commrt.bench launch                 # 8 ranks, 5 interleaved rounds
    python -m commrt.bench launch -n 4 --rounds 3 --no-peers

Each launcher runs a job whose ranks initialise, do one barrier and exit:
``commrt.init()`` + ``comm.barrier()`` (a ring exchange if the collectives
are missing), mpi4py's ``COMM_WORLD.Barrier()`` under ``mpirun -np N``, and
Gloo's ``init_process_group`` + ``barrier`` under ``torchrun
--nproc-per-node N --standalone``.  The wall time is that of the launcher
command, from exec to exit.  Launchers run in the same invocation,
interleaved round by round (forward order in even rounds, reverse in odd
ones); each cell is the median over rounds with [min-max].  Python
launchers are started as ``python -m`` so that no wrapper (a pyenv shim,
say) is timed.  Targets: commrt <= 1.0x mpirun and <= 0.5x torchrun.
"""
import argparse
import os
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


def launchers(nprocs, workdir, peers):
    """name -> argv of each launcher that is installed."""
    def job(name, text):
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    found = {"commrt-launch": [sys.executable, "-m", "commrt.launcher", "-n", str(nprocs),
                               job("commrt_job.py", COMMRT_JOB)]}
    if not peers:
        return found
    if shutil.which("mpirun") and _importable("mpi4py"):
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        found["mpirun"] = ["mpirun", *root, "--oversubscribe", "-np", str(nprocs),
                           sys.executable, job("mpi_job.py", MPI_JOB)]
    if _importable("torch"):
        found["torchrun"] = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", str(nprocs), job("torch_job.py", TORCH_JOB)]
    return found


def _importable(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def time_once(argv, timeout):
    """Seconds from start to exit, or None (with the reason printed) on failure."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {argv[0]} ... timed out after {timeout:g} s", file=sys.stderr)
        return None
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        tail = "\n    ".join((out.stderr or out.stdout).strip().splitlines()[-5:])
        print(f"  {' '.join(argv[:4])} ... exited {out.returncode}:\n    {tail}", file=sys.stderr)
        return None
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m commrt.bench launch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nprocs", type=int, default=8, help="ranks per job (default 8)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--no-peers", action="store_true", help="only commrt-launch")
    parser.add_argument("--timeout", type=float, default=120.0, help="per job, seconds")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="commrt-bench-launch-") as workdir:
        commands = launchers(args.nprocs, workdir, not args.no_peers)
        samples = {name: [] for name in commands}
        time_once(commands["commrt-launch"], args.timeout)  # warm the page cache, once
        for rnd in range(args.rounds):
            order = list(commands) if rnd % 2 == 0 else list(reversed(commands))
            for name in order:
                samples[name].append(time_once(commands[name], args.timeout))
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{n} {fmt_num(samples[n][-1])} s" for n in order), file=sys.stderr)

    summaries = {name: Summary(s) for name, s in samples.items()}
    ours = summaries["commrt-launch"].median
    rows = [[name, s.cell(), ratio(ours, s.median) if name != "commrt-launch" else "1.00"]
            for name, s in summaries.items()]
    print(f"\nJob start-up, {args.nprocs} ranks: init + one barrier + exit "
          f"(seconds, median [min-max] of {args.rounds}; {os.cpu_count()} cores)\n")
    print(table(["launcher", "wall s", "commrt / this"], rows))
    targets = {"mpirun": 1.0, "torchrun": 0.5}
    for name, limit in targets.items():
        if name in summaries and summaries[name].median and ours:
            met = ours / summaries[name].median <= limit
            print(f"target commrt <= {limit:.1f}x {name}: {'met' if met else 'NOT met'}")
    return 0 if ours is not None else 1


if __name__ == "__main__":
    sys.exit(main())
