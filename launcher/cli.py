"""commrt-launch: start a commrt job on one host or many.

    commrt-launch -n 8 train.py --epochs 3
    commrt-launch -np 4 python train.py                 # horovodrun's and mpirun's form
    commrt-launch -np 4 -H localhost:2,hostb:2 python train.py
    commrt-launch --standalone --nproc-per-node 8 train.py    # torchrun's form
    commrt-launch -n 8 -m mypkg.train --epochs 3

The launcher's options come first; the first word that is not one of them
(or follows ``--``) is PROGRAM, and everything after it goes to PROGRAM
untouched.
"""
import argparse
import os
import shlex
import shutil
import sys

from commrt.launcher import hosts as hostmod

EPILOG = """\
PROGRAM is read, in order: with -m, a module (python -m PROGRAM); with
--no-python, an executable; a file ending in .py, run with this Python;
otherwise a command found on PATH (`python train.py`, `pytest`, `bash -c ...`),
as under mpirun and horovodrun.  Anything else is an error naming it.

environment given to every rank:
  COMMRT_RANK, COMMRT_WORLD_SIZE, COMMRT_LOCAL_RANK, COMMRT_LOCAL_WORLD_SIZE,
  COMMRT_HOST_ID, COMMRT_STORE_ADDR, COMMRT_SECRET_FILE (a fresh job secret in a
  file only you can read, removed when the job ends), RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK,
  HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME,
  COMMRT_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0, then 1, 2, ... after
  --max-restarts restarts), TORCHELASTIC_MAX_RESTARTS, COMMRT_IFNAME with
  --network-interface, PYTHONUNBUFFERED=1, OMP_NUM_THREADS (this host's cores
  shared among its ranks) and THP_MEM_ALLOC_ENABLE=1 (PyTorch's large tensors on
  huge pages: faster single-copy reads) unless already set.

failure:
  when a rank exits non-zero or dies by a signal, the others get SIGTERM, then
  SIGKILL after --grace seconds; commrt-launch exits with that rank's code
  (128+N for signal N) and prints which rank failed and the end of its stderr,
  unless --max-restarts allows another attempt of the whole job.  Ctrl-C or
  SIGTERM to commrt-launch reaches every rank; exit code 124 after --timeout.

See docs/launcher.md for multi-host jobs, torchrun/mpirun/Slurm and security.
"""


def build_parser():
    """The argument parser.  Options are grouped so that later features (the
    elastic driver's --min-np/--max-np/--host-discovery-script, --timeline)
    add their own group here without touching the others.  Every option takes
    one value or none: split_command_line relies on it."""
    parser = argparse.ArgumentParser(
        prog="commrt-launch", description="Start a commrt job: N ranks of a program.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="commrt-launch [options] PROGRAM [ARGS...]")
    job = parser.add_argument_group("job")
    job.add_argument("-n", "-np", "--nprocs", "--num-proc", dest="nprocs", type=_positive_int,
                     metavar="N", help="number of ranks (default: the hosts' slots in all, or "
                                       "--nproc-per-node on each host)")
    job.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                     type=_per_node, metavar="K",
                     help="ranks per host, as torchrun's (an integer, or `auto`/`cpu`: this "
                          "host's usable cores); with -H, every host gets K slots")
    job.add_argument("--standalone", action="store_true",
                     help="torchrun's single-host job: every rank on this host (the default "
                          "without -H; refused with hosts that are not this one)")
    job.add_argument("-m", "--module", action="store_true",
                     help="PROGRAM is a module, run as `python -m PROGRAM`")
    job.add_argument("--no-python", action="store_true",
                     help="PROGRAM is an executable, run as it is")
    job.add_argument("--env", action="append", default=[], metavar="K=V", type=_env_pair,
                     help="set K=V in every rank's environment (repeatable)")
    job.add_argument("-x", action="append", default=[], dest="export", metavar="NAME[=VALUE]",
                     type=_export,
                     help="mpirun's -x: set NAME=VALUE, or pass this shell's NAME, to every rank")
    job.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                     help="stop the whole job after SECONDS (exit code 124), restarts included")
    job.add_argument("--start-timeout", type=_positive_float, metavar="SECONDS",
                     help="every rank must have reached the store (commrt.init) or ended "
                          "within SECONDS of its start, else the job stops naming the ranks "
                          "that did not (exit code 124); default: no limit but COMMRT_TIMEOUT's")
    job.add_argument("--max-restarts", type=_count, default=0, metavar="N",
                     help="restart the whole job up to N times when a rank fails, as torchrun's "
                          "(COMMRT_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT tell the attempt)")
    job.add_argument("--grace", type=_positive_float, default=2.0, metavar="SECONDS",
                     help="between SIGTERM and SIGKILL when stopping ranks (default 2)")
    job.add_argument("--check-build", action="store_true",
                     help="print what this commrt offers (frameworks, transports, "
                          "operations), as horovodrun --check-build does, and exit")
    where = parser.add_argument_group("hosts")
    where.add_argument("-H", "--host", "--hosts", dest="hosts", metavar="H:SLOTS,...",
                       help="hosts and their slots, e.g. node1:4,node2:4 (slots default to 1); "
                            "ranks fill them in order (default: all ranks on this host)")
    where.add_argument("--hostfile", "-hostfile", dest="hostfile", metavar="FILE",
                       help="hosts, one a line: `name`, `name:4` or `name slots=4`; # comments")
    where.add_argument("--ssh-cmd", metavar="CMD",
                       help="command that runs a command on another host, given the host name "
                            "(default: ssh); e.g. 'ip netns exec'")
    where.add_argument("-p", "--ssh-port", type=_port, metavar="PORT",
                       help="port of sshd on the other hosts (ssh -p PORT)")
    where.add_argument("--ssh-identity-file", metavar="FILE",
                       help="private key ssh logs in with (ssh -i FILE)")
    where.add_argument("--network-interface", metavar="IF[,IF...]",
                       help="network interface(s) of the ranks' data plane across hosts "
                            "(sets COMMRT_IFNAME; names or prefixes, comma-separated)")
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
    out.add_argument("--tag-output", "-tag-output", dest="tag_output", action="store_true",
                     help="prefix each line as mpirun does: [1,RANK]<stdout>: or <stderr>:")
    out.add_argument("--timestamp-output", "-timestamp-output", dest="timestamp_output",
                     action="store_true",
                     help="prefix each line with the time the launcher read it "
                          "(YYYY-MM-DD HH:MM:SS.ffffff)")
    out.add_argument("--output-filename", "-output-filename", dest="output_filename",
                     metavar="DIR[:nocopy]",
                     help="also write rank K's output to DIR/1/rank.K/stdout and stderr, as "
                          "mpirun does; with :nocopy, only there")
    out.add_argument("--log-dir", metavar="DIR",
                     help="also write each rank's output to DIR/rank.K.log")
    out.add_argument("-v", "--verbose", action="store_true",
                     help="say where the store is and where the ranks go")
    mpi = parser.add_argument_group("accepted from mpirun's command lines, with the effect "
                                    "they have there")
    mpi.add_argument("--allow-run-as-root", "-allow-run-as-root", action="store_true",
                     help="nothing to allow: commrt-launch runs as any user, root included")
    mpi.add_argument("--oversubscribe", "-oversubscribe", action="store_true",
                     help="nothing to allow: more ranks than cores always run")
    mpi.add_argument("--bind-to", "-bind-to", choices=["none", "core"], default="none",
                     metavar="none|core",
                     help="none (default): ranks are not bound; core: each rank of a host "
                          "on its own block of the host's cores (cores // ranks), "
                          "everything it starts inheriting the block")
    mpi.add_argument("--map-by", "-map-by", choices=["slot"], metavar="slot",
                     help="ranks fill each host's slots in order (`slot`, the only choice)")
    trace = parser.add_argument_group("timeline")
    trace.add_argument("--timeline", metavar="FILE",
                       help="record every rank's compute, communication and waiting spans "
                            "(COMMRT_TIMELINE, one file per rank) and merge them into FILE, "
                            "one Chrome trace (Perfetto, chrome://tracing; pid = rank); draw "
                            "it with `python -m commrt.timeline FILE --png out.png`")
    elastic = parser.add_argument_group("elastic (Horovod's elastic training; docs/horovod.md)")
    elastic.add_argument("--elastic", action="store_true",
                         help="run an elastic job (implied by the options below)")
    elastic.add_argument("--min-np", type=_positive_int, metavar="N",
                         help="fewest workers the job runs with (default: -n)")
    elastic.add_argument("--max-np", type=_positive_int, metavar="N",
                         help="most workers the job grows to (default: -n)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="executable printing the available hosts, one host:slots a line")
    elastic.add_argument("--reset-limit", type=_positive_int, metavar="N",
                         help="stop after N re-formations of the job")
    return parser


class UsageError(Exception):
    """A command line that cannot be run; the message says why."""


def split_command_line(parser, argv):
    """(launcher options, PROGRAM and its arguments).

    Options end at the first word that is neither an option nor an option's
    value, or after ``--``.  An unknown option is an error that names it,
    never the start of PROGRAM, so a misspelt option cannot be run."""
    actions = parser._option_string_actions  # noqa: SLF001 - argparse's table of options
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return argv[:i], argv[i:]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        action = actions.get(name)
        if action is None and not arg.startswith("--") and arg[:2] in actions:
            action = actions[arg[:2]]       # -n8: a short option with its value attached
            if action.nargs == 0:
                raise UsageError(f"unknown option {arg} (see --help)")
            i += 1
            continue
        if action is None:
            raise UsageError(f"unknown option {name} (see --help)")
        i += 1 if action.nargs == 0 or "=" in arg else 2
    return argv, []


def resolve_program(program, module, no_python):
    """The argv of each rank: PROGRAM read as docs/launcher.md says."""
    if not program:
        raise UsageError("no program to run: give a script, a command, or -m and a module")
    if module and no_python:
        raise UsageError("-m and --no-python do not go together")
    if module:
        return [sys.executable, "-m"] + program
    if no_python:
        return program
    first = program[0]
    if first.endswith(".py") and os.path.isfile(first):
        return [sys.executable] + program
    if shutil.which(first):
        return program
    if first.endswith(".py"):
        raise UsageError(f"PROGRAM {first!r}: no such file")
    raise UsageError(f"PROGRAM {first!r} is neither a .py file nor a command on PATH "
                     f"(use -m for a module)")


def hosts_from_args(args):
    """[Host] the ranks go to, and the number of ranks."""
    if args.hosts and args.hostfile:
        raise UsageError("give -H/--hosts or --hostfile, not both")
    per_node = args.nproc_per_node
    if args.hosts:
        hosts = hostmod.parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = hostmod.parse_hostfile(args.hostfile)
    else:
        hosts = [hostmod.Host("localhost", per_node or args.nprocs or 0)]
    if per_node and (args.hosts or args.hostfile):
        hosts = [hostmod.Host(h.name, per_node) for h in hosts]
    if args.standalone:
        remote = [h.name for h in hosts if not hostmod.is_local(h.name)]
        if remote:
            raise UsageError(f"--standalone runs on this host only, but the hosts name "
                             f"{', '.join(remote)}")
    nprocs = args.nprocs
    if nprocs is None:
        if not (args.hosts or args.hostfile or per_node):
            raise UsageError("how many ranks? give -n N (or -np N), -H with slots, "
                             "a --hostfile or --nproc-per-node")
        nprocs = sum(h.slots for h in hosts)
    if hosts[0].slots == 0:                 # -n N alone: this host has N slots
        hosts = [hostmod.Host(hosts[0].name, nprocs)]
    hostmod.place(nprocs, hosts)
    return hosts, nprocs


def ssh_command(args):
    """The command that runs a rank on another host, before the host's name."""
    if args.ssh_cmd is not None:
        ssh = shlex.split(args.ssh_cmd)
        if not ssh:
            raise UsageError("--ssh-cmd is empty")
        if (args.ssh_port or args.ssh_identity_file) and os.path.basename(ssh[0]) != "ssh":
            raise UsageError("-p/--ssh-port and --ssh-identity-file need ssh, not "
                             f"--ssh-cmd {args.ssh_cmd!r}")
    else:
        ssh = ["ssh"]
    if args.ssh_port:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        if not os.path.isfile(args.ssh_identity_file):
            raise UsageError(f"--ssh-identity-file {args.ssh_identity_file}: no such file")
        ssh += ["-i", os.path.abspath(args.ssh_identity_file)]
    return ssh


def rank_env_from_args(args):
    """Variables every rank gets from the command line (--env, -x, --network-interface)."""
    env = dict(args.env)
    for name, value in args.export:
        if value is None:
            if name not in os.environ:
                raise UsageError(f"-x {name}: {name} is not set in this environment")
            value = os.environ[name]
        env[name] = value
    if args.network_interface is not None:
        names = [n.strip() for n in args.network_interface.split(",")]
        if not all(names):
            raise UsageError(f"--network-interface {args.network_interface!r}: empty name")
        env["COMMRT_IFNAME"] = ",".join(names)
    return env


def output_files(args):
    """(directory, copy to the terminal too) of --output-filename, or (None, True)."""
    if args.output_filename is None:
        return None, True
    path, nocopy = args.output_filename, False
    if path.endswith(":nocopy"):
        path, nocopy = path[:-len(":nocopy")], True
    if not path:
        raise UsageError("--output-filename needs a directory")
    return os.path.abspath(path), not nocopy


def spec_from_args(args, program):
    """Turn parsed arguments into a JobSpec, or raise UsageError."""
    from commrt.launcher.job import JobSpec

    try:
        hosts, nprocs = hosts_from_args(args)
    except hostmod.HostSpecError as exc:
        raise UsageError(str(exc)) from None
    command = resolve_program(program, args.module, args.no_python)
    if args.no_prefix and args.tag_output:
        raise UsageError("--no-prefix and --tag-output do not go together")
    output_dir, to_terminal = output_files(args)
    return JobSpec(nprocs=nprocs, command=command, hosts=hosts, ssh_cmd=ssh_command(args),
                   timeout=args.timeout, prefix=not args.no_prefix, log_dir=args.log_dir,
                   env=rank_env_from_args(args), bind=args.bind, store_port=args.store_port,
                   grace=args.grace, verbose=args.verbose,
                   timeline=os.path.abspath(args.timeline) if args.timeline else None,
                   start_timeout=args.start_timeout, max_restarts=args.max_restarts,
                   tag_output=args.tag_output, timestamps=args.timestamp_output,
                   output_dir=output_dir, output_to_terminal=to_terminal,
                   bind_to=args.bind_to)


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, program = split_command_line(parser, argv)
    except UsageError as exc:
        parser.error(str(exc))
    args = parser.parse_args(options)
    if args.check_build:
        from commrt.launcher.build_info import describe
        sys.stdout.write(describe())
        return 0
    try:
        spec = spec_from_args(args, program)
    except UsageError as exc:
        parser.error(str(exc))
    if args.elastic or args.min_np or args.max_np or args.host_discovery_script:
        from commrt.launcher import elastic

        if args.bind_to != "none":      # a generation's ranks per host change as hosts come and go
            parser.error("--bind-to core binds a fixed set of ranks per host; an elastic job's "
                         "change from generation to generation: leave it out with --elastic")

        return elastic.run(elastic.spec_from_args(args, parser, spec))
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


def _count(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count 0, 1, 2, ..., got {text!r}")
    return int(text)


def _per_node(text):
    if text in ("auto", "cpu"):
        return len(os.sched_getaffinity(0))
    return _positive_int(text)


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _port(text):
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return int(text)


def _env_name_ok(name):
    return bool(name) and name.replace("_", "a").isalnum() and not name[0].isdigit()


def _env_pair(text):
    name, eq, value = text.partition("=")
    if not eq or not _env_name_ok(name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _export(text):
    name, eq, value = text.partition("=")
    if not _env_name_ok(name):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME=VALUE, got {text!r}")
    return name, (value if eq else None)


if __name__ == "__main__":
    sys.exit(main())
