"""commrt-launch: start a commrt job on one host or many.

    commrt-launch -n 8 train.py --epochs 3
    commrt-launch -n 8 -m mypkg.train --epochs 3
    commrt-launch -n 8 --hosts node1:4,node2:4 train.py

Everything after the program name goes to the program untouched.
"""
import argparse
import os
import shlex
import sys

from commrt.launcher import hosts as hostmod

EPILOG = """\
environment given to every rank:
  COMMRT_RANK, COMMRT_WORLD_SIZE, COMMRT_LOCAL_RANK, COMMRT_LOCAL_WORLD_SIZE,
  COMMRT_HOST_ID, COMMRT_STORE_ADDR, COMMRT_SECRET_FILE (a fresh job secret in a
  file only you can read, removed when the job ends), RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, PYTHONUNBUFFERED=1 and OMP_NUM_THREADS (this host's cores
  shared among its ranks) unless already set.

failure:
  when a rank exits non-zero or dies by a signal, the others get SIGTERM, then
  SIGKILL after --grace seconds; commrt-launch exits with that rank's code
  (128+N for signal N) and prints which rank failed and the end of its stderr.
  Ctrl-C or SIGTERM to commrt-launch reaches every rank; exit code 124 after
  --timeout.

See docs/launcher.md for multi-host jobs, torchrun/mpirun/Slurm and security.
"""


def build_parser():
    """The argument parser; options are grouped so that later features (e.g.
    --timeline) add their own group without touching the others."""
    parser = argparse.ArgumentParser(
        prog="commrt-launch", description="Start a commrt job: N ranks of a Python program.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    job = parser.add_argument_group("job")
    job.add_argument("-n", "--nprocs", type=_positive_int, required=True, metavar="N",
                     help="number of ranks to start")
    job.add_argument("-m", "--module", action="store_true",
                     help="run PROGRAM as a module, like `python -m PROGRAM`")
    job.add_argument("--no-python", action="store_true",
                     help="run PROGRAM as an executable, not with this Python")
    job.add_argument("--env", action="append", default=[], metavar="K=V", type=_env_pair,
                     help="set K=V in every rank's environment (repeatable)")
    job.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                     help="stop the whole job after SECONDS (exit code 124)")
    job.add_argument("--grace", type=_positive_float, default=2.0, metavar="SECONDS",
                     help="between SIGTERM and SIGKILL when stopping ranks (default 2)")
    where = parser.add_argument_group("hosts")
    where.add_argument("--hosts", metavar="H:SLOTS,...",
                       help="hosts and their slots, e.g. node1:4,node2:4; ranks fill them in "
                            "order (default: all ranks on this host)")
    where.add_argument("--hostfile", metavar="FILE",
                       help="hosts, one a line: `name`, `name:4` or `name slots=4`")
    where.add_argument("--ssh-cmd", default="ssh", metavar="CMD",
                       help="command that runs a command on another host, given the host name "
                            "(default: ssh); e.g. 'ssh -p 2222' or 'ip netns exec'")
    where.add_argument("--bind", metavar="ADDR",
                       help="address the launcher's store listens on (default: 127.0.0.1 for "
                            "one host, all interfaces when other hosts take part); other hosts "
                            "reach it at ADDR, or at this host's name")
    where.add_argument("--store-port", type=_port, default=0, metavar="PORT",
                       help="port of the store (default: any free port; on one host a busy "
                            "PORT falls back to any free port)")
    out = parser.add_argument_group("output")
    out.add_argument("--no-prefix", action="store_true",
                     help="do not prefix each output line with [rank]")
    out.add_argument("--log-dir", metavar="DIR",
                     help="also write each rank's output to DIR/rank.K.log")
    out.add_argument("-v", "--verbose", action="store_true",
                     help="say where the store is and where the ranks go")
    trace = parser.add_argument_group("timeline")
    trace.add_argument("--timeline", metavar="FILE",
                       help="record every rank's compute, communication and waiting spans "
                            "(COMMRT_TIMELINE, one file per rank) and merge them into FILE, "
                            "one Chrome trace (Perfetto, chrome://tracing; pid = rank); draw "
                            "it with `python -m commrt.timeline FILE --png out.png`")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]",
                        help="script (or module with -m) and its arguments, passed untouched")
    return parser


def spec_from_args(args, parser):
    """Turn parsed arguments into a JobSpec, or exit with a usage error."""
    from commrt.launcher.job import JobSpec

    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        parser.error("no program to run: give a script, or -m and a module")
    if args.module and args.no_python:
        parser.error("-m and --no-python do not go together")
    if args.module:
        command = [sys.executable, "-m"] + program
    elif args.no_python:
        command = program
    else:
        command = [sys.executable] + program
    if args.hosts and args.hostfile:
        parser.error("give --hosts or --hostfile, not both")
    try:
        if args.hosts:
            hosts = hostmod.parse_hosts(args.hosts)
        elif args.hostfile:
            hosts = hostmod.parse_hostfile(args.hostfile)
        else:
            hosts = [hostmod.Host("localhost", args.nprocs)]
        hostmod.place(args.nprocs, hosts)
    except hostmod.HostSpecError as exc:
        parser.error(str(exc))
    ssh_cmd = shlex.split(args.ssh_cmd)
    if not ssh_cmd:
        parser.error("--ssh-cmd is empty")
    return JobSpec(nprocs=args.nprocs, command=command, hosts=hosts, ssh_cmd=ssh_cmd,
                   timeout=args.timeout, prefix=not args.no_prefix, log_dir=args.log_dir,
                   env=dict(args.env), bind=args.bind, store_port=args.store_port,
                   grace=args.grace, verbose=args.verbose,
                   timeline=os.path.abspath(args.timeline) if args.timeline else None)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    spec = spec_from_args(args, parser)
    from commrt.launcher import job

    try:
        return job.run(spec)
    except job.LaunchError as exc:
        sys.stderr.write(f"commrt-launch: {exc}\n")
        return 1
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were in place
        return 130


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _port(text):
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return int(text)


def _env_pair(text):
    name, eq, value = text.partition("=")
    if not eq or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


if __name__ == "__main__":
    sys.exit(main())
