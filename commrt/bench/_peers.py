"""The systems the collective benchmarks launch, one world each: commrt, mpi4py on
OpenMPI (default settings and with single-copy disabled) and torch.distributed on Gloo.
Each run measures a spec (``_coll.measure``) and returns rank 0's result."""
import importlib.util
import os
import sys
import tempfile

from commrt.bench import _launch

PEERS = {
    "ompi": ["pml", "ob1", "btl", "self,vader"],
    "ompi-nocma": ["pml", "ob1", "btl", "self,vader", "btl_vader_single_copy_mechanism", "none"],
}


def has_module(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def run_commrt(n, spec, transport, timeout):
    from commrt.bench import _coll

    # the ranks' own deadline comes first, so a stuck call reports where it waited
    # (a CommTimeoutError naming the call and peer), not only that a rank hung
    return _launch.run_in_world(n, transport, _coll.commrt_entry, spec, timeout,
                                max(5.0, timeout * 0.8))[0]


def run_mpi(n, mca, spec, timeout, label):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        path = os.path.join(tmp, "spec.json")
        _launch.write_json(path, spec)
        cmd = _launch.mpirun_cmd(n, mca, ["--oversubscribe"]) + [
            sys.executable, "-m", "commrt.bench._coll_mpi", "--spec", path, "--out", tmp]
        _launch.run_procs([cmd], [_launch._child_env({})], timeout, label)
        return _launch._read_results(tmp, n, label)[0]


def mpi_jobs(n, timeout, log):
    """[(name, job)]: job(spec) launches spec on OpenMPI in one configuration of
    PEERS; none (said through log) where mpirun or mpi4py is missing."""
    import shutil

    if not (shutil.which("mpirun") and has_module("mpi4py")):
        log("mpirun or mpi4py missing: no OpenMPI peer")
        return []
    return [(name, lambda spec, name=name: run_mpi(n, PEERS[name], spec, timeout, name))
            for name in PEERS]


def run_gloo(n, spec, timeout):
    with tempfile.TemporaryDirectory(prefix="commrt-bench-") as tmp:
        path = os.path.join(tmp, "spec.json")
        _launch.write_json(path, spec)
        init = "file://" + os.path.join(tmp, "store")
        cmds = [[sys.executable, "-m", "commrt.bench._coll_torch", "--spec", path, "--out", tmp,
                 "--rank", str(r), "--world", str(n), "--init", init,
                 "--parent", str(os.getpid())] for r in range(n)]
        envs = [_launch._child_env({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
                for _ in range(n)]
        _launch.run_procs(cmds, envs, timeout, "gloo")
        return _launch._read_results(tmp, n, "gloo")[0]
