"""Start the processes of one benchmark run, bound them in time, collect results.

Every run is a group of child processes (the ranks, or one ``mpirun``) that
each write one JSON file of results.  Guarantees:

* each child leads its own session (process group), so a timeout or a failed
  rank kills the whole group, ``mpirun``'s ranks included;
* each child dies with this process (``PR_SET_PDEATHSIG``, set by a small
  exec shim), so a killed benchmark leaves no orphans; the ranks that
  ``mpirun`` forks set it on themselves (``child_setup``);
* when one rank fails the others get a short grace period, then are killed:
  a failed run costs seconds, not the whole timeout.

The commrt starter hosts commrt's rendezvous store in this process and sets
each rank's environment (COMMRT_RANK, COMMRT_WORLD_SIZE, COMMRT_LOCAL_RANK,
COMMRT_LOCAL_WORLD_SIZE, COMMRT_STORE_ADDR, COMMRT_SECRET, COMMRT_TRANSPORT);
the rank calls ``commrt.init()``.  ``commrt.testing.World`` is the other
way in (``starter="world"``): both run ``_p2p_commrt.entry(comm, spec)``.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

_PR_SET_PDEATHSIG = 1
_GRACE_S = 3.0

# Children compute with one thread each: the machine has few cores and the
# ranks share them; BLAS threads would only add noise.
CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "NUMBA_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# Run every command through this shim: it asks for SIGKILL when its parent (this
# process) dies, then execs the command (the request survives exec).  A shim
# rather than preexec_fn, which is unsafe while this process has threads (the
# rendezvous store serves from one).
# mpirun gets SIGTERM rather than SIGKILL, so that it takes its ranks down
# and removes OpenMPI's segments in /dev/shm (SIGKILL would leave them).
_SHIM = [sys.executable, "-c",
         "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, int(sys.argv[2]), 0, 0, 0)\n"
         "if os.getppid() != int(sys.argv[1]): os._exit(3)\n"
         "os.execvp(sys.argv[3], sys.argv[3:])"]


class RunFailed(RuntimeError):
    """A benchmark run failed or passed its deadline; the message says which rank and why."""


def _pdeathsig():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def child_setup(parent_pid=None):
    """Called first in a child: die with the parent (and exit if it is gone)."""
    _pdeathsig()
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(3)


def rank_args(argv=None, *, ranked=False):
    """The command line every benchmark rank entry point takes: --spec FILE --out DIR
    [--parent PID], and with ranked --rank R --world N --init URL (Gloo ranks).
    Runs child_setup, then returns (args, spec)."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--parent", type=int)
    if ranked:
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--world", type=int, required=True)
        p.add_argument("--init", required=True)
    args = p.parse_args(argv)
    child_setup(args.parent)
    with open(args.spec) as f:
        return args, json.load(f)


def run_in_world(n, transport, fn, spec, timeout, rank_timeout):
    """fn(comm, spec) on a commrt.testing.World of n ranks, with CHILD_ENV in the
    ranks and, while the world spawns, in this process (spawn copies it)."""
    from commrt.testing import World

    saved = {k: os.environ.get(k) for k in CHILD_ENV}
    os.environ.update(CHILD_ENV)
    try:
        env = dict(CHILD_ENV, COMMRT_TIMEOUT=str(rank_timeout))
        with World(n, transport=transport, env=env, timeout=timeout) as world:
            return world.run(fn, spec, timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(jsonable(obj), f)
    os.replace(tmp, path)


def end_gloo_rank(code=0):
    """End a rank that used torch's Gloo now, without the interpreter's shutdown.

    After a Gloo call has returned, Gloo's worker thread can still hold the last
    reference to the finished work.  If it lets go while the interpreter shuts
    down, freeing the work's tensors wants the GIL, the thread is made to exit
    inside a C++ destructor and the process aborts: "terminate called without an
    active exception", SIGABRT (torch 2.13; a core dump's stack reads
    ~AsyncAllreduceWork -> decref -> take_gil -> pthread_exit; 4 of 12 two-rank
    jobs under two busy loops).  Results are written before this is called."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def jsonable(obj):
    """obj with dict keys as strings and unknown objects as their repr."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    try:
        import numpy as np
        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:
        pass
    for attr in ("_asdict", "as_dict", "to_dict"):
        if hasattr(obj, attr):
            try:
                return jsonable(getattr(obj, attr)())
            except Exception:
                pass
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {k: jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return repr(obj)


def _kill_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_procs(cmds, envs, timeout, label):
    """Run the commands (one per process) to completion or kill them all.

    Returns the list of (returncode, output text).  Raises RunFailed on a
    non-zero exit or on timeout, with the tail of the failing output.
    """
    procs, logs = [], []
    deadline = time.monotonic() + timeout
    try:
        for cmd, env in zip(cmds, envs):
            log = tempfile.TemporaryFile(mode="w+")
            logs.append(log)
            sig = signal.SIGTERM if os.path.basename(cmd[0]) == "mpirun" else signal.SIGKILL
            procs.append(subprocess.Popen(_SHIM + [str(os.getpid()), str(int(sig))] + list(cmd),
                                          env=env,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        failed_at = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
            now = time.monotonic()
            if now > deadline or (failed_at is not None and now - failed_at > _GRACE_S):
                break
            time.sleep(0.02)
    finally:
        timed_out = any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                _kill_group(p, signal.SIGTERM)
        t_end = time.monotonic() + 2.0
        for p in procs:
            try:
                p.wait(max(0.0, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            _kill_group(p, signal.SIGKILL)   # also any descendant left in the group
            if p.poll() is None:
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if timed_out or bad:
        why = f"timed out after {timeout:g} s" if timed_out else "failed"
        detail = []
        for i in bad or range(len(procs)):
            tail = "\n".join(outs[i].strip().splitlines()[-30:])
            detail.append(f"--- process {i} (exit {procs[i].returncode}) ---\n{tail}")
        raise RunFailed(f"{label}: {why}\n" + "\n".join(detail))
    return [(p.returncode, o) for p, o in zip(procs, outs)]


def _read_results(outdir, n, label):
    results = []
    for r in range(n):
        path = os.path.join(outdir, f"rank{r}.json")
        try:
            with open(path) as f:
                results.append(json.load(f))
        except (OSError, ValueError) as exc:
            raise RunFailed(f"{label}: rank {r} wrote no results ({exc})") from None
    return results


# Inherited variables that would tell a child to bootstrap some other way.
_FOREIGN = ("COMMRT_RANK", "COMMRT_WORLD_SIZE", "COMMRT_LOCAL_RANK", "COMMRT_LOCAL_WORLD_SIZE",
            "COMMRT_STORE_ADDR", "COMMRT_SECRET", "COMMRT_SECRET_FILE", "COMMRT_STORE_BIND",
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_FOREIGN_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "SLURM_")


def _child_env(extra):
    env = {k: v for k, v in os.environ.items()
           if k not in _FOREIGN and not k.startswith(_FOREIGN_PREFIXES)}
    env.update(CHILD_ENV)
    env.update(extra)
    return env


# -- commrt --------------------------------------------------------------------

def world_available():
    import importlib.util
    try:
        return importlib.util.find_spec("commrt.testing") is not None
    except ImportError:
        return False


def run_commrt(n, transport, spec, timeout, starter="spawn", label=None):
    """Run spec on n commrt ranks on this host; one result dict per rank."""
    label = label or f"commrt-{transport} ({n} ranks)"
    if starter == "world":
        return _run_commrt_world(n, transport, spec, timeout)
    from commrt.rendezvous.store import StoreServer

    secret = os.urandom(32)
    server = StoreServer(secret, host="127.0.0.1", port=0)
    started = server.start()
    if started is not None and hasattr(started, "address"):
        server = started
    try:
        host, port = server.address
        with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
            spec_path = os.path.join(tmp, "spec.json")
            write_json(spec_path, spec)
            cmds, envs = [], []
            for r in range(n):
                cmds.append([sys.executable, "-m", "commrt.bench._p2p_commrt", "--spec", spec_path,
                             "--out", tmp, "--parent", str(os.getpid())])
                envs.append(_child_env({
                    "COMMRT_RANK": str(r), "COMMRT_WORLD_SIZE": str(n),
                    "COMMRT_LOCAL_RANK": str(r), "COMMRT_LOCAL_WORLD_SIZE": str(n),
                    "COMMRT_STORE_ADDR": f"{host}:{port}", "COMMRT_SECRET": secret.hex(),
                    "COMMRT_TRANSPORT": transport,
                    "COMMRT_TIMEOUT": str(max(5.0, timeout * 0.8)),
                }))
            run_procs(cmds, envs, timeout, label)
            return _read_results(tmp, n, label)
    finally:
        server.close()


def _run_commrt_world(n, transport, spec, timeout):
    from commrt.bench import _p2p_commrt

    results = run_in_world(n, transport, _p2p_commrt.entry, spec, timeout,
                           max(5.0, timeout * 0.8))
    return [json.loads(json.dumps(jsonable(r))) for r in results]


# -- OpenMPI (mpi4py) ------------------------------------------------------------

def mpirun_cmd(n, mca=(), extra=()):
    cmd = ["mpirun", "-np", str(n), "--allow-run-as-root"]
    for i in range(0, len(mca), 2):
        cmd += ["--mca", mca[i], mca[i + 1]]
    return cmd + list(extra)


def run_mpi(n, mca, spec, timeout, extra=(), label="mpi"):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        write_json(spec_path, spec)
        cmd = mpirun_cmd(n, mca, extra) + [sys.executable, "-m", "commrt.bench._p2p_mpi",
                                           "--spec", spec_path, "--out", tmp]
        run_procs([cmd], [_child_env({})], timeout, label)
        return _read_results(tmp, n, label)


# -- torch.distributed (Gloo) ------------------------------------------------------

def run_torch(n, spec, timeout, label="gloo"):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        write_json(spec_path, spec)
        init = "file://" + os.path.join(tmp, "store")
        cmds = [[sys.executable, "-m", "commrt.bench._p2p_torch", "--spec", spec_path,
                 "--out", tmp, "--rank", str(r), "--world", str(n), "--init", init,
                 "--parent", str(os.getpid())] for r in range(n)]
        envs = [_child_env({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
                for _ in range(n)]
        run_procs(cmds, envs, timeout, label)
        return _read_results(tmp, n, label)
