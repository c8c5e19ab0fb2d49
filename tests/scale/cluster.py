"""Real cluster services for the multi-host tests, started and stopped by the test:
Debian's openssh-server inside namespace hosts, and a one-node Slurm (munge,
slurmctld, slurmd).  Everything lives in a private directory and inside
namespaces this test created; stop() (also called on failure) ends every
daemon, and the namespaces' teardown kills whatever is left."""
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time

SSHD = "/usr/sbin/sshd"


def missing(*tools):
    """The tools (commands or absolute paths) this machine lacks."""
    return [t for t in tools if not (os.path.isabs(t) and os.access(t, os.X_OK))
            and shutil.which(t) is None]


def _check(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, **kw)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def _stop(procs, grace=5.0):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _wait(predicate, timeout, what, logs=()):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    text = ""
    for path in logs:
        try:
            with open(path) as f:
                text += f"\n--- {path}:\n" + f.read()[-2000:]
        except OSError:
            pass
    raise RuntimeError(f"timed out waiting for {what}{text}")


class Sshd:
    """sshd on port 22 of every host of a _netns.Hosts, with a host key and a
    client key made here; ``ssh_cmd`` reaches host i as ``alias[i]``.  Every
    session on host i gets ``session_env(i)`` (sshd's SetEnv)."""

    def __init__(self, hosts, workdir, aliases, session_env=None):
        self.hosts, self.dir, self.aliases = hosts, str(workdir), list(aliases)
        self.session_env = session_env or (lambda i: {})
        self.procs = []

    def path(self, name):
        return os.path.join(self.dir, name)

    @property
    def ssh_cmd(self):
        return f"ssh -F {self.path('ssh_config')}"

    def start(self):
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        for key in ("host_key", "id"):
            _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.path(key)])
        shutil.copy(self.path("id.pub"), self.path("authorized_keys"))
        with open(self.path("host_key.pub")) as f:
            host_key = " ".join(f.read().split()[:2])
        with open(self.path("known_hosts"), "w") as f:
            for alias, addr in zip(self.aliases, self.hosts.addrs):
                f.write(f"{alias},{addr} {host_key}\n")
        with open(self.path("ssh_config"), "w") as f:
            f.write(textwrap.dedent(f"""\
                Host *
                  User root
                  IdentityFile {self.path('id')}
                  IdentitiesOnly yes
                  UserKnownHostsFile {self.path('known_hosts')}
                  StrictHostKeyChecking yes
                  BatchMode yes
                  ConnectTimeout 10
                  LogLevel ERROR
                """))
            for alias, addr in zip(self.aliases, self.hosts.addrs):
                f.write(f"Host {alias}\n  HostName {addr}\n")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        try:
            for i, addr in enumerate(self.hosts.addrs):
                self._start_one(i, addr)
            for alias in self.aliases:
                _wait(lambda a=alias: self._reachable(a), 30, f"sshd of {alias}",
                      [self.path(f"sshd{i}.log") for i in range(len(self.aliases))])
        except BaseException:
            self.stop()
            raise
        return self

    def _start_one(self, i, addr):
        cfg = self.path(f"sshd{i}_config")
        with open(cfg, "w") as f:
            f.write(textwrap.dedent(f"""\
                ListenAddress {addr}:22
                HostKey {self.path('host_key')}
                PidFile {self.path(f'sshd{i}.pid')}
                AuthorizedKeysFile {self.path('authorized_keys')}
                PubkeyAuthentication yes
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                PermitRootLogin prohibit-password
                StrictModes no
                UsePAM no
                LogLevel ERROR
                """))
            env = self.session_env(i)
            if env:
                f.write("SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()) + "\n")
        log = open(self.path(f"sshd{i}.log"), "w")
        with log:
            self.procs.append(subprocess.Popen(self.hosts.exec(i, [SSHD, "-D", "-e", "-f", cfg]),
                                               stdout=log, stderr=subprocess.STDOUT))

    def _reachable(self, alias):
        if any(p.poll() is not None for p in self.procs):
            raise RuntimeError("sshd exited: " + open(self.path("sshd0.log")).read()[-2000:])
        cmd = self.hosts.exec(0, self.ssh_cmd.split() + [alias, "true"])
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0

    def stop(self):
        _stop(self.procs)
        self.procs = []


class Slurm:
    """A one-node Slurm cluster inside host 0 of a _netns.Hosts: munged with a key
    made here, slurmctld and slurmd with a generated slurm.conf
    (proctrack/linuxproc, task/none, no accounting; the node declares
    max(4, cores) CPUs and SlurmdParameters=config_overrides lets it, so 4
    tasks fit 2 cores).  The daemons run with only the namespace's network
    (nsenter --net: slurmd needs the machine's /sys/fs/cgroup, which ``ip netns
    exec`` hides); clients run through ``cmd``."""

    def __init__(self, hosts, workdir):
        self.hosts, self.dir = hosts, str(workdir)
        self.procs = []
        self.node = socket.gethostname()
        self.cpus = max(4, os.cpu_count() or 1)

    def path(self, name):
        return os.path.join(self.dir, name)

    @property
    def env(self):
        return {"SLURM_CONF": self.path("slurm.conf")}

    def cmd(self, argv):
        return ["nsenter", f"--net=/run/netns/{self.hosts.names[0]}", *argv]

    def start(self):
        for sub in ("", "state", "spool"):
            os.makedirs(self.path(sub), mode=0o700, exist_ok=True)
        key = self.path("munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._write_conf()
        try:
            self._spawn("munged", ["munged", "-F", "-f", f"--key-file={key}",
                                   f"--socket={self.path('munge.sock')}",
                                   f"--pid-file={self.path('munged.pid')}",
                                   f"--log-file={self.path('munged.log')}",
                                   f"--seed-file={self.path('munged.seed')}"])
            _wait(lambda: os.path.exists(self.path("munge.sock")), 20, "munged",
                  [self.path("munged.out")])
            conf = self.path("slurm.conf")
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", conf])
            self._spawn("slurmd", ["slurmd", "-D", "-f", conf])
            _wait(self._idle, 60, "the Slurm node to be idle",
                  [self.path(n) for n in ("slurmctld.out", "slurmd.out", "slurmctld.log",
                                          "slurmd.log")])
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name, argv):
        with open(self.path(f"{name}.out"), "w") as log:
            self.procs.append(subprocess.Popen(self.cmd(argv), stdout=log,
                                               stderr=subprocess.STDOUT,
                                               env={**os.environ, **self.env}))

    def _idle(self):
        dead = [p.args for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a Slurm daemon exited: {dead}: "
                               + open(self.path("slurmd.out")).read()[-1500:]
                               + open(self.path("slurmctld.out")).read()[-1500:])
        out = subprocess.run(self.cmd(["sinfo", "-h", "-o", "%T"]), capture_output=True,
                             text=True, timeout=20, env={**os.environ, **self.env})
        return out.stdout.strip() == "idle"

    def _write_conf(self):
        addr, d = self.hosts.addrs[0], self.dir
        with open(self.path("slurm.conf"), "w") as f:
            f.write(textwrap.dedent(f"""\
                ClusterName=commrt
                SlurmctldHost={self.node}({addr})
                AuthType=auth/munge
                AuthInfo=socket={d}/munge.sock
                CredType=cred/munge
                SlurmUser=root
                SlurmdUser=root
                StateSaveLocation={d}/state
                SlurmdSpoolDir={d}/spool
                SlurmctldPidFile={d}/slurmctld.pid
                SlurmdPidFile={d}/slurmd.pid
                SlurmctldLogFile={d}/slurmctld.log
                SlurmdLogFile={d}/slurmd.log
                ProctrackType=proctrack/linuxproc
                TaskPlugin=task/none
                SelectType=select/cons_tres
                SelectTypeParameters=CR_Core
                MpiDefault=none
                SwitchType=switch/none
                JobCompType=jobcomp/none
                AccountingStorageType=accounting_storage/none
                JobAcctGatherType=jobacct_gather/none
                MailProg=/bin/true
                ReturnToService=2
                SlurmdParameters=config_overrides
                NodeName={self.node} NodeAddr={addr} CPUs={self.cpus} State=UNKNOWN
                PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
                """))

    def wait_job(self, job_id, timeout):
        """Wait until the job has left the queue (sbatch --wait polls at seconds)."""
        def gone():
            out = subprocess.run(self.cmd(["squeue", "-h", "-j", job_id, "-o", "%T"]),
                                 capture_output=True, text=True, timeout=20,
                                 env={**os.environ, **self.env})
            return out.returncode == 0 and not out.stdout.strip()
        _wait(gone, timeout, f"Slurm job {job_id}", [self.path("slurmctld.log")])

    def stop(self):
        _stop(self.procs)
        self.procs = []
