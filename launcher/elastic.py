"""The elastic driver: keep a Horovod job running while workers die and hosts come.

    commrt-launch -n 4 --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh train.py

The discovery script prints the available hosts, one ``host:slots`` a line
(run again every ``DISCOVERY_S``).  The driver hosts the job's store and
starts one worker per chosen slot, each with a stable worker id
(``host:slot:incarnation``).  It publishes generations in the store (see
commrt.horovod.elastic): a generation gives every member its rank; rank 0
always goes to a worker that was in the previous generation, so the state
every rank syncs from is a committed one.

When a worker fails (non-zero exit or a signal), the driver forms the next
generation from the survivors plus workers it starts in the free slots
discovery reports, up to --max-np; the survivors, whose collectives raised
HorovodInternalError, restore their last commit and join it.  A failed slot
is only that slot: the host stays in use (Horovod blacklists the whole
host).  Workers on other hosts start through --ssh-cmd and
commrt.launcher.remote, as commrt-launch's ranks do (the store then listens
on all interfaces, or on --bind).  When discovery reports new slots, the driver starts workers there
and publishes a generation with them: the running workers join it at their
next commit (HostsUpdatedInterrupt).  Below --min-np workers the driver
waits for discovery up to --start-timeout, then stops the job.  The job
succeeds when every worker of the last generation has exited 0.
"""
import ctypes
import os
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from commrt.launcher import hosts as hostmod
from commrt.launcher.rankenv import with_defaults
from commrt.launcher.signals import signal_group
from commrt.rendezvous import auth
from commrt.rendezvous.store import Store, StoreServer

GEN_KEY = "commrt/elastic/gen"
DISCOVERY_S = 1.0
_PR_SET_PDEATHSIG = 1


class ElasticError(RuntimeError):
    """The elastic job cannot go on (too few slots, too many resets)."""


@dataclass
class ElasticSpec:
    command: List[str]
    np: int
    min_np: int
    max_np: int
    discovery: Optional[str] = None         # path of the host discovery script
    hosts: List[hostmod.Host] = field(default_factory=list)   # static hosts without a script
    env: Dict[str, str] = field(default_factory=dict)
    start_timeout: float = 60.0
    reset_limit: Optional[int] = None
    ssh_cmd: List[str] = field(default_factory=lambda: ["ssh"])
    bind: Optional[str] = None              # the store's address (default: see Driver)
    timeout: Optional[float] = None
    grace: float = 2.0
    verbose: bool = False


@dataclass
class Worker:
    wid: str
    host: str
    slot: int
    proc: subprocess.Popen
    rank: int = -1


def discover(spec):
    """{host: slots} from the discovery script (or the static hosts)."""
    if spec.discovery is None:
        return {h.name: h.slots for h in spec.hosts}
    out = subprocess.run([spec.discovery], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise ElasticError(f"host discovery script {spec.discovery} exited with code "
                           f"{out.returncode}: {out.stderr.strip()[-500:]}")
    found = {}
    for line in out.stdout.split():
        name, _, slots = line.strip().partition(":")
        if name:
            found[name] = found.get(name, 0) + (int(slots) if slots else 1)
    return found


_SECRET_VARS = ("COMMRT_SECRET", "COMMRT_SECRET_FILE", "COMMRT_SECRET_FD")  # ours replace them


class Driver:
    def __init__(self, spec):
        self.spec = spec
        self.secret = auth.new_secret()
        remote = any(not hostmod.is_local(h) for h in discover(spec))
        bind = spec.bind or ("0.0.0.0" if remote else "127.0.0.1")
        self.server = StoreServer(self.secret, host=bind, port=0).start()
        port = self.server.address[1]
        wildcard = bind in ("0.0.0.0", "::", "")
        # a remote host discovered later cannot reach a store we put on loopback
        # (one the user chose with --bind is the user's call)
        self.loopback_only = spec.bind is None and not remote
        self.store_addr = f"{'127.0.0.1' if wildcard else bind}:{port}"
        self.remote_store = f"{socket.getfqdn() if wildcard else bind}:{port}"
        self.store = Store("127.0.0.1" if wildcard else bind, port, self.secret)
        # a memfd each local worker inherits (COMMRT_SECRET_FD): no file to leave
        # behind under any exit, and handed again to every restarted or joining worker
        self.secret_fd = auth.secret_descriptor(self.secret)
        self.workers: Dict[str, Worker] = {}
        self.finished: Dict[str, int] = {}
        self.gen = -1
        self.incarnation = 0
        self.resets = 0
        self.last_discovery = 0.0

    # ------------------------------------------------------------ generations
    def _publish(self, members):
        """Generation gen+1 with members in rank order."""
        self.gen += 1
        per_host = {}
        for w in members:
            per_host.setdefault(w.host, []).append(w)
        local = {w.wid: (i, len(ws)) for ws in per_host.values() for i, w in enumerate(ws)}
        for r, w in enumerate(members):
            lrank, lsize = local[w.wid]
            same = [m for m in members if local[m.wid][0] == lrank]
            crank = same.index(w)
            value = f"{r} {len(members)} {lrank} {lsize} {crank} {len(same)} {w.host}"
            self.store.set(f"commrt/elastic/{self.gen}/{w.wid}", value.encode())
            w.rank = r
        self.store.set(GEN_KEY, str(self.gen).encode())
        self._note(f"generation {self.gen}: {len(members)} workers "
                   f"({', '.join(w.wid for w in members)})")

    def _free_slots(self, available):
        used = {}
        for w in self.workers.values():
            used.setdefault(w.host, set()).add(w.slot)
        free = []
        for host, slots in available.items():
            free += [(host, s) for s in range(slots) if s not in used.get(host, set())]
        return free

    def _start(self, host, slot):
        """Start a worker in (host, slot): directly here, through --ssh-cmd elsewhere
        (commrt.launcher.remote reads the command, environment and secret on stdin)."""
        self.incarnation += 1
        wid = f"{host}:{slot}:{self.incarnation}"
        local = hostmod.is_local(host)
        if not local and self.loopback_only:
            raise ElasticError(f"discovery reports host {host}, but the store listens on "
                               f"loopback only (no other host at the start): give --bind ADDR reachable "
                               f"from it")
        env = {"COMMRT_STORE_ADDR": self.store_addr if local else self.remote_store,
               "HOROVOD_ELASTIC": "1", "COMMRT_ELASTIC_WORKER_ID": wid,
               "COMMRT_HOST_ID": host, "PYTHONUNBUFFERED": "1"}
        env.update(self.spec.env)
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getpid()

        def child_setup():
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
        if local:
            full = dict(os.environ)
            for name in _SECRET_VARS:
                full.pop(name, None)
            full.update(env, COMMRT_SECRET_FD=str(self.secret_fd))
            with_defaults(full, 1)
            proc = subprocess.Popen(self.spec.command, env=full, start_new_session=True,
                                    preexec_fn=child_setup, pass_fds=(self.secret_fd,))
        else:
            argv = self.spec.ssh_cmd + [host, sys.executable, "-m", "commrt.launcher.remote"]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=child_setup)
            forwarded = {k: v for k, v in os.environ.items()
                         if k.startswith(("COMMRT_", "HOROVOD_")) or k == "PYTHONPATH"}
            for name in _SECRET_VARS:
                forwarded.pop(name, None)
            forwarded.update(env)
            spec = {"argv": self.spec.command, "env": forwarded, "cwd": os.getcwd(),
                    "secret": self.secret.hex(), "local_size": 1}
            proc.stdin.write(json.dumps(spec).encode() + b"\n")
            proc.stdin.flush()                   # stdin stays open: the worker's lifeline
        w = Worker(wid, host, slot, proc)
        self.workers[wid] = w
        return w

    def _grow(self, want, deadline=None):
        """Start workers in free slots until there are `want` (or no slot is free)."""
        new = []
        while True:
            available = discover(self.spec)
            for host, slot in self._free_slots(available)[:max(0, want - len(self.workers))]:
                new.append(self._start(host, slot))
            if len(self.workers) >= self.spec.min_np or deadline is None \
                    or time.monotonic() > deadline:
                return new
            time.sleep(DISCOVERY_S)

    def _form(self, new):
        old = sorted((w for w in self.workers.values() if w not in new), key=lambda w: w.rank)
        if len(self.workers) < self.spec.min_np:
            raise ElasticError(f"only {len(self.workers)} workers (slots) available, fewer than "
                               f"--min-np {self.spec.min_np}")
        self._publish(old + new)

    # ------------------------------------------------------------ the loop
    def run(self):
        deadline = None if self.spec.timeout is None else time.monotonic() + self.spec.timeout
        first = self._grow(min(self.spec.np, self.spec.max_np),
                           time.monotonic() + self.spec.start_timeout)
        self._form(first)
        while True:
            if deadline is not None and time.monotonic() > deadline:
                self._note("timeout: stopping the job")
                return 124
            failed = self._reap()
            if not self.workers:
                bad = [c for c in self.finished.values() if c != 0]
                return bad[-1] if bad else 0
            if failed and self.finished:
                # the job was ending: no generation would run, so the survivors would
                # wait in init(); stop them with the failure's code
                self._note("a worker failed after others had finished: stopping the job")
                return failed[-1]
            if failed:
                self.resets += 1
                if self.spec.reset_limit is not None and self.resets > self.spec.reset_limit:
                    self._note(f"{self.resets} resets exceed --reset-limit "
                               f"{self.spec.reset_limit}: stopping the job")
                    return failed[-1]
                new = self._grow(self.spec.max_np, time.monotonic() + self.spec.start_timeout)
                self._form(new)
                continue
            if time.monotonic() - self.last_discovery > DISCOVERY_S and \
                    len(self.workers) < self.spec.max_np and not self.finished:
                self.last_discovery = time.monotonic()
                new = self._grow(self.spec.max_np)
                if new:
                    self._form(new)
            time.sleep(0.05)

    def _reap(self):
        """Exit codes of workers that failed just now (finished ones are recorded)."""
        failed = []
        for wid, w in list(self.workers.items()):
            code = w.proc.poll()
            if code is None:
                continue
            del self.workers[wid]
            code = 128 - code if code < 0 else code
            if code == 0:
                self.finished[wid] = 0
            else:
                self._note(f"worker {wid} (rank {w.rank}) exited with code {code}")
                failed.append(code)
        return failed

    def close(self):
        for w in self.workers.values():
            signal_group(w.proc.pid, signal.SIGTERM)
            if w.proc.stdin is not None:         # a remote worker's lifeline
                try:
                    w.proc.stdin.close()
                except OSError:
                    pass
        end = time.monotonic() + self.spec.grace
        for w in self.workers.values():
            try:
                w.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(w.proc.pid, signal.SIGKILL)
                w.proc.wait(5)
        self.store.close()
        self.server.close()
        if self.secret_fd is not None:
            os.close(self.secret_fd)
            self.secret_fd = None

    def _note(self, text):
        sys.stderr.write(f"commrt-launch (elastic): {text}\n")
        sys.stderr.flush()


def run(spec: ElasticSpec) -> int:
    if spec.min_np < 1 or spec.max_np < spec.min_np:
        raise ElasticError(f"need 1 <= --min-np ({spec.min_np}) <= --max-np ({spec.max_np})")
    driver = Driver(spec)
    try:
        return driver.run()
    except ElasticError as exc:
        sys.stderr.write(f"commrt-launch: {exc}\n")
        return 1
    finally:
        driver.close()


def spec_from_args(args, parser, job):
    """An ElasticSpec from commrt-launch's arguments and the JobSpec made of them."""
    n = job.nprocs
    min_np = args.min_np or n
    max_np = args.max_np or max(n, min_np)
    if not min_np <= n <= max_np:
        parser.error(f"-n {n} must lie between --min-np {min_np} and --max-np {max_np}")
    script = args.host_discovery_script
    if script is not None and not os.access(script, os.X_OK):
        parser.error(f"--host-discovery-script {script} is not an executable file")
    return ElasticSpec(command=job.command, np=n, min_np=min_np, max_np=max_np,
                       discovery=os.path.abspath(script) if script else None, hosts=job.hosts,
                       env=job.env, reset_limit=args.reset_limit, timeout=job.timeout,
                       start_timeout=job.start_timeout or 60.0, ssh_cmd=job.ssh_cmd,
                       bind=job.bind,
                       grace=job.grace, verbose=job.verbose)
