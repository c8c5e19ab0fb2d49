"""Real cluster launchers across namespace hosts: commrt-launch over real ssh
(Debian's openssh-server in each namespace, keys made by the test), a one-node
Slurm (srun, sbatch of examples/slurm/commrt.sbatch), and OpenMPI's mpirun
across the namespaces over that ssh, both for an MPI program and for commrt
ranks bootstrapping from OpenMPI's environment."""
import os
import sys

import pytest

from cluster import SSHD, Slurm, Sshd, missing
from scale_helpers import HERE, clean_env, ok_lines, require, run

pytestmark = pytest.mark.netns  # tests/conftest.py: such tests run one at a time

RANK = os.path.join(HERE, "hosts_rank.py")
REPO = os.path.dirname(os.path.dirname(HERE))
SBATCH = os.path.join(REPO, "examples", "slurm", "commrt.sbatch")
ALIASES = ("nsA", "nsB")


@pytest.fixture
def ssh_hosts(ns_hosts, tmp_path):
    require(missing(SSHD, "ssh", "ssh-keygen"), "real ssh (apt-get install openssh-server)")
    hosts = ns_hosts(2, rate="1gbit")
    # OpenMPI names its shared-memory segments after the hostname, which the
    # namespaces share: each host gets its own directory for them
    vader = [tmp_path / f"vader-{a}" for a in ALIASES]
    for d in vader:
        d.mkdir()
    sshd = Sshd(hosts, tmp_path / "ssh", ALIASES,
                lambda i: {"OMPI_MCA_btl_vader_backing_directory": str(vader[i])}).start()
    yield hosts, sshd
    sshd.stop()


@pytest.mark.timeout(120)
def test_commrt_launch_over_real_ssh(ssh_hosts, tmp_path):
    hosts, sshd = ssh_hosts
    cmd = hosts.exec(0, [sys.executable, "-m", "commrt.launcher", "-n", "4", "--hosts",
                         "nsA:2,nsB:2", "--ssh-cmd", sshd.ssh_cmd, "--bind", hosts.addrs[0],
                         "--network-interface", "cmrt0", "--timeout", "60", RANK, "hello"])
    out = run(cmd, 100, env=clean_env(COMMRT_TIMEOUT="60", COMMRT_COST_CACHE=""))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = ok_lines(out)
    assert lines == [f"ok {r} 4 {h} {h}" for r, h in enumerate(("nsA", "nsA", "nsB", "nsB"))], \
        out.stdout


def _mpirun(hosts, sshd, argv, extra=()):
    return hosts.exec(0, ["mpirun", "--allow-run-as-root", "-np", "4", "--host", "nsA:2,nsB:2",
                          "--mca", "plm_rsh_agent", sshd.ssh_cmd,
                          "--mca", "btl_tcp_if_include", "cmrt0",
                          "--mca", "oob_tcp_if_include", "cmrt0", *extra, *argv])


MPI_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size, n = 1 << 18;
    static double x[1 << 18];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < n; i++) x[i] = rank + 1;
    MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    int good = 1;
    for (int i = 0; i < n; i++) good &= x[i] == size * (size + 1) / 2;
    char ns[256] = "-";
    ssize_t k = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (k > 0) ns[k] = 0;
    printf("ok %d %d %s %s\n", rank, size, good ? "right" : "WRONG", ns);
    MPI_Finalize();
    return !good;
}
"""


@pytest.mark.timeout(150)
def test_mpirun_across_namespaces_over_ssh(ssh_hosts, tmp_path):
    require(missing("mpirun", "mpicc"), "mpirun across hosts (apt-get install openmpi-bin "
                                        "libopenmpi-dev)")
    hosts, sshd = ssh_hosts
    src = tmp_path / "allreduce.c"
    src.write_text(MPI_PROGRAM)
    exe = tmp_path / "allreduce"
    built = run(["mpicc", "-O2", "-o", str(exe), str(src)], 60)
    assert built.returncode == 0, built.stderr
    out = run(_mpirun(hosts, sshd, [str(exe)]), 120, env=clean_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = ok_lines(out)
    assert [line.split()[1:4] for line in lines] == [
        [str(r), "4", "right"] for r in range(4)], out.stdout
    namespaces = [line.split()[4] for line in lines]
    assert namespaces[0] == namespaces[1] != namespaces[2] == namespaces[3], namespaces

    # commrt ranks under that mpirun: each namespace is a host (no COMMRT_HOST_ID),
    # and rank 0 advertises its store on COMMRT_IFNAME's address
    out = run(_mpirun(hosts, sshd, [sys.executable, RANK, "hello"],
                      ["-x", "COMMRT_IFNAME=cmrt0", "-x", "COMMRT_COST_CACHE=",
                       "-x", f"COMMRT_RENDEZVOUS_DIR={tmp_path / 'rdv'}",
                       "-x", "COMMRT_TIMEOUT=60", "-x", "OMP_NUM_THREADS=1"]), 120,
              env=clean_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    host = os.uname().nodename
    assert ok_lines(out) == [f"ok {r} 4 {host}/{hosts.names[r // 2]} -" for r in range(4)], \
        out.stdout


@pytest.fixture
def slurm(ns_hosts, tmp_path):
    require(missing("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "nsenter"),
            "a one-node Slurm (apt-get install slurm-wlm munge)")
    cluster = Slurm(ns_hosts(1), tmp_path / "slurm").start()
    yield cluster
    cluster.stop()


@pytest.mark.timeout(150)
def test_srun_and_sbatch_on_a_one_node_slurm(slurm, tmp_path):
    env = clean_env(**slurm.env, COMMRT_TIMEOUT="60", COMMRT_COST_CACHE="",
                    PYTHON=sys.executable)
    out = run(slurm.cmd(["srun", "-n", "4", sys.executable, RANK, "hello"]), 90, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    node = f"{slurm.node}/{slurm.hosts.names[0]}"
    assert ok_lines(out) == [f"ok {r} 4 {node} -" for r in range(4)], out.stdout

    log = tmp_path / "job.out"
    out = run(slurm.cmd(["sbatch", "--parsable", f"--output={log}", f"--chdir={tmp_path}",
                         SBATCH, RANK, "hello"]), 60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    job = out.stdout.strip().split(";")[0]
    slurm.wait_job(job, 90)
    state = run(slurm.cmd(["scontrol", "show", "job", job]), 30, env=env).stdout
    assert "JobState=COMPLETED" in state, state + (log.read_text() if log.exists() else "")
    got = sorted(line for line in log.read_text().splitlines() if line.startswith("ok "))
    assert got == [f"ok {r} 4 {node} -" for r in range(4)], log.read_text()
