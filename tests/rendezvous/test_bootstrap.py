"""Bootstrap from each launcher's environment, set as those launchers set it,
and real multi-process rendezvous through open_store."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from commrt.errors import BootstrapError
from commrt.rendezvous import auth, bootstrap
from commrt.rendezvous.bootstrap import expand_nodelist, expand_tasks_per_node, from_environment

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "bootstrap_rank.py")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "GROUP_RANK")
LAUNCHER_PREFIXES = ("COMMRT_", "OMPI_", "PMIX_", "SLURM_", "SLURMD_", "TORCHELASTIC_")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra or {})
    return env


@pytest.fixture
def environ(monkeypatch, tmp_path):
    """Replace the launcher part of os.environ with the given variables."""
    for name in list(os.environ):
        if name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COMMRT_RENDEZVOUS_DIR", str(tmp_path / "rdv"))

    def set_env(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, str(v))
    return set_env


SECRET_HEX = "ab" * 32


# -- commrt-launch ------------------------------------------------------------------

def test_commrt_launch_environment(environ, tmp_path):
    path = str(tmp_path / "secret")
    auth.write_secret_file(path, bytes.fromhex(SECRET_HEX))
    environ(COMMRT_RANK=3, COMMRT_WORLD_SIZE=8, COMMRT_LOCAL_RANK=1, COMMRT_LOCAL_WORLD_SIZE=4,
            COMMRT_STORE_ADDR="10.0.0.1:29400", COMMRT_SECRET_FILE=path, COMMRT_HOST_ID="nodeB",
            COMMRT_BIND_ADDR="10.0.0.2")
    info = from_environment()
    assert (info.rank, info.size, info.local_rank, info.local_size) == (3, 8, 1, 4)
    assert (info.store_host, info.store_port) == ("10.0.0.1", 29400)
    assert info.secret == bytes.fromhex(SECRET_HEX)
    assert info.host_id == "nodeB" and not info.host_store and info.launcher == "commrt-launch"
    assert info.data_addr == "10.0.0.2"


def test_commrt_launch_missing_pieces_are_listed(environ):
    environ(COMMRT_RANK=0)
    with pytest.raises(BootstrapError) as err:
        from_environment()
    for name in ("COMMRT_WORLD_SIZE", "COMMRT_STORE_ADDR", "COMMRT_SECRET_FILE or COMMRT_SECRET"):
        assert name in str(err.value)


@pytest.mark.parametrize("values, message", [
    (dict(COMMRT_RANK="x", COMMRT_WORLD_SIZE=2), "COMMRT_RANK='x'"),
    (dict(COMMRT_RANK=2, COMMRT_WORLD_SIZE=2), "rank 2 is outside the world of 2"),
    (dict(COMMRT_RANK=0, COMMRT_WORLD_SIZE=2, COMMRT_STORE_ADDR="nohost"), "is not host:port"),
    (dict(COMMRT_RANK=0, COMMRT_WORLD_SIZE=2, COMMRT_STORE_ADDR="h:70000"), "port must be"),
    (dict(COMMRT_RANK=0, COMMRT_WORLD_SIZE=2, COMMRT_SECRET="abcd"), "at least 16"),
])
def test_commrt_launch_malformed(environ, values, message):
    base = dict(COMMRT_STORE_ADDR="127.0.0.1:1", COMMRT_SECRET=SECRET_HEX)
    base.update(values)
    environ(**base)
    with pytest.raises(BootstrapError, match=message):
        from_environment()


def test_no_launcher_at_all(environ):
    with pytest.raises(BootstrapError, match="no launcher environment found"):
        from_environment()


def test_ipv6_store_address():
    assert bootstrap.parse_address("[::1]:5000") == ("::1", 5000)


# -- torchrun -----------------------------------------------------------------------

TORCHRUN = dict(RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, MASTER_ADDR="localhost",
                MASTER_PORT=40883, TORCHELASTIC_RUN_ID="6bc5-run", TORCHELASTIC_RESTART_COUNT=0,
                GROUP_RANK=0)


def test_torchrun_without_secret_publishes_through_a_private_file(environ, tmp_path):
    environ(**TORCHRUN)
    info = from_environment()
    assert (info.rank, info.size, info.launcher) == (1, 2, "torchrun")
    assert not info.host_store and info.secret is None and info.store_host is None
    assert info.rendezvous_file == str(tmp_path / "rdv" / "torchrun-6bc5-run-40883-0.store")
    environ(RANK=0, LOCAL_RANK=0)
    info0 = from_environment()
    assert info0.host_store and len(info0.secret) == 32
    assert (info0.store_host, info0.store_port, info0.store_bind) == ("127.0.0.1", 0, "127.0.0.1")


def test_torchrun_with_secret_uses_master_port_plus_one(environ):
    environ(**TORCHRUN, COMMRT_SECRET=SECRET_HEX)
    info = from_environment()
    assert (info.store_host, info.store_port) == ("127.0.0.1", 40884)
    assert info.rendezvous_file is None and info.secret == bytes.fromhex(SECRET_HEX)


def test_torchrun_multi_node_with_secret(environ):
    environ(**dict(TORCHRUN, WORLD_SIZE=4, RANK=3, MASTER_ADDR="node1"), COMMRT_SECRET=SECRET_HEX)
    info = from_environment()
    assert (info.store_host, info.store_port, info.store_bind) == ("node1", 40884, "0.0.0.0")
    assert not info.single_host


def test_torchrun_store_addr_overrides(environ):
    environ(**dict(TORCHRUN, RANK=0, LOCAL_RANK=0), COMMRT_STORE_ADDR="127.0.0.1:5555",
            COMMRT_SECRET=SECRET_HEX)
    info = from_environment()
    assert info.host_store and (info.store_host, info.store_port) == ("127.0.0.1", 5555)


def test_torchrun_missing_master_port(environ):
    environ(RANK=0, WORLD_SIZE=2, MASTER_ADDR="localhost")
    with pytest.raises(BootstrapError, match="torchrun environment found, but it lacks: MASTER_PORT"):
        from_environment()


# -- OpenMPI ------------------------------------------------------------------------

# as OpenMPI 4.1 mpirun sets them (printed from a real run)
OMPI = dict(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=1,
            OMPI_COMM_WORLD_LOCAL_SIZE=2, OMPI_COMM_WORLD_NODE_RANK=1,
            OMPI_MCA_ess_base_jobid=1945239553, PMIX_NAMESPACE=1945239553, PMIX_RANK=1)


def test_mpirun_environment(environ, tmp_path):
    environ(**OMPI)
    info = from_environment()
    assert (info.rank, info.size, info.local_rank, info.local_size) == (1, 2, 1, 2)
    assert info.launcher == "mpirun" and info.job_id == "1945239553"
    assert info.rendezvous_file == str(tmp_path / "rdv" / "mpirun-1945239553.store")


def test_mpirun_openmpi5_namespace_only(environ):
    env = {k: v for k, v in OMPI.items() if k != "OMPI_MCA_ess_base_jobid"}
    env["PMIX_NAMESPACE"] = "prterun-vm-1234@1"
    environ(**env)
    assert from_environment().rendezvous_file.endswith("mpirun-prterun-vm-1234@1.store")


def test_mpirun_across_hosts_uses_the_shared_directory(environ, monkeypatch, tmp_path):
    monkeypatch.delenv("COMMRT_RENDEZVOUS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    environ(**dict(OMPI, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_RANK=0,
                   OMPI_COMM_WORLD_LOCAL_RANK=0))
    info = from_environment()
    assert info.rendezvous_file.startswith(str(tmp_path / ".commrt" / "rendezvous"))
    assert info.store_bind == "0.0.0.0" and info.store_host == bootstrap.socket.gethostname()


# -- Slurm --------------------------------------------------------------------------

SLURM = dict(SLURM_PROCID=5, SLURM_NTASKS=7, SLURM_LOCALID=1, SLURM_NODEID=2, SLURM_JOB_ID=4242,
             SLURM_STEP_ID=3, SLURM_STEP_NODELIST="node[01-03,07]",
             SLURM_JOB_NODELIST="node[01-03,07-09]", SLURM_STEP_TASKS_PER_NODE="2(x3),1",
             SLURM_STEP_NUM_NODES=4, SLURMD_NODENAME="node03")


def test_slurm_environment_with_secret(environ):
    environ(**SLURM, COMMRT_SECRET=SECRET_HEX)
    info = from_environment()
    assert (info.rank, info.size, info.local_rank, info.local_size) == (5, 7, 1, 2)
    assert info.nodes == ["node01", "node02", "node03", "node07"]
    assert info.host_id == "node03" and info.launcher == "slurm"
    assert info.store_host == "node01"
    assert info.store_port == bootstrap.slurm_store_port("4242", "3")
    assert 20000 <= info.store_port < 32768
    assert info.rendezvous_file is None


def test_slurm_without_secret_uses_the_rendezvous_directory(environ, tmp_path):
    environ(**SLURM)
    info = from_environment()
    assert info.rendezvous_file == str(tmp_path / "rdv" / "slurm-4242.3.store")


def test_slurm_ntasks_per_node_and_single_node(environ):
    environ(SLURM_PROCID=0, SLURM_NTASKS=4, SLURM_LOCALID=0, SLURM_JOB_ID=7,
            SLURM_JOB_NODELIST="gpu-a", SLURM_NNODES=1)
    info = from_environment()
    assert info.local_size == 4 and info.single_host and info.store_bind == "127.0.0.1"


def test_slurm_missing_job_id(environ):
    environ(SLURM_PROCID=0, SLURM_NTASKS=4)
    with pytest.raises(BootstrapError, match="lacks: SLURM_JOB_ID"):
        from_environment()


@pytest.mark.parametrize("text, expected", [
    ("node01", ["node01"]),
    ("a,b,c", ["a", "b", "c"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),
    ("gpu-[1-2]-ib,cpu[5]", ["gpu-1-ib", "gpu-2-ib", "cpu5"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("x[1,3],y[2-3],z", ["x1", "x3", "y2", "y3", "z"]),
])
def test_expand_nodelist(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "a,,b", "n[1-2"])
def test_malformed_nodelists_are_clear_errors(text):
    with pytest.raises(BootstrapError, match="malformed Slurm node list"):
        expand_nodelist(text)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(BootstrapError, match="tasks-per-node"):
        expand_tasks_per_node("2(3)")


# -- real processes through open_store ----------------------------------------------

def run_ranks(envs, timeout=30):
    procs = [subprocess.Popen([sys.executable, RANK_SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in envs]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sorted(results, key=lambda r: r["rank"])


def test_torchrun_style_job_meets_through_the_published_file(tmp_path):
    rdv = tmp_path / "rdv"
    envs = [clean_env(dict(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="3",
                           MASTER_ADDR="localhost", MASTER_PORT="29999",
                           TORCHELASTIC_RUN_ID="t1", COMMRT_RENDEZVOUS_DIR=str(rdv),
                           COMMRT_HOST_ID=f"h{r}"))
            for r in (2, 1, 0)]  # rank 0 last: the others must poll for its file
    results = run_ranks(envs)
    assert [r["peers"] for r in results] == [["h0", "h1", "h2"]] * 3
    assert [r["hosted"] for r in results] == [True, False, False]
    assert oct(os.stat(rdv).st_mode & 0o777) == "0o700"
    assert os.listdir(rdv) == []  # the secret does not linger once everyone has joined


def test_stale_rendezvous_file_is_not_trusted(tmp_path):
    rdv = tmp_path / "rdv"
    rdv.mkdir(mode=0o700)
    stale = rdv / "mpirun-77.store"
    stale.write_text(f"127.0.0.1 1 {SECRET_HEX}\n")  # a dead job's store
    stale.chmod(0o600)
    envs = [clean_env(dict(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE="2",
                           OMPI_COMM_WORLD_LOCAL_RANK=str(r), OMPI_COMM_WORLD_LOCAL_SIZE="2",
                           OMPI_MCA_ess_base_jobid="77", COMMRT_RENDEZVOUS_DIR=str(rdv)))
            for r in (1, 0)]
    results = run_ranks(envs)
    assert [r["hosted"] for r in results] == [True, False]


def free_slurm_job_id():
    """A job id whose derived store port is free now (the port is a pure
    function of the id; another process on this machine may hold some)."""
    for job in range(os.getpid(), os.getpid() + 1000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", bootstrap.slurm_store_port(str(job), "0")))
                return str(job)
            except OSError:
                continue
    pytest.skip("no free port in the Slurm store range")


def test_slurm_style_job_with_secret_meets_on_the_derived_port(tmp_path):
    job = free_slurm_job_id()
    envs = [clean_env(dict(SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                           SLURM_NODEID="0", SLURM_JOB_ID=job, SLURM_STEP_ID="0",
                           SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2",
                           COMMRT_SECRET=SECRET_HEX))
            for r in (1, 0)]
    results = run_ranks(envs)
    assert [r["launcher"] for r in results] == ["slurm", "slurm"]


def test_wrong_secret_on_one_rank_fails_clearly(tmp_path):
    with socket.socket() as probe:  # the store goes on MASTER_PORT + 1: make that a free one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1] - 1
    envs = [clean_env(dict(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), COMMRT_SECRET=secret))
            for r, secret in ((0, SECRET_HEX), (1, "cd" * 32))]
    procs = [subprocess.Popen([sys.executable, RANK_SCRIPT], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in envs]
    try:
        _, err = procs[1].communicate(timeout=30)
        assert procs[1].returncode != 0 and "did not prove it knows the job secret" in err
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_real_mpirun_bootstrap(tmp_path):
    """The store bootstrap under the real OpenMPI mpirun (4 ranks)."""
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    env = clean_env({"COMMRT_RENDEZVOUS_DIR": str(tmp_path / "rdv"),
                     "TEST_OUT_DIR": str(results_dir)})
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
           sys.executable, RANK_SCRIPT]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    results = sorted((json.loads(p.read_text()) for p in results_dir.iterdir()),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["launcher"] == "mpirun" and r["local_size"] == 4 for r in results)
    assert [r["hosted"] for r in results] == [True, False, False, False]
    assert os.listdir(tmp_path / "rdv") == []
