"""Run one job: host the store, start the ranks, forward their output, stop them all.

One thread does everything but serve the store: a selector loop over the
ranks' pipes and a signal wake-up socket.  The ranks are forked before the
store's threads start, so the tiny ``preexec_fn`` (PR_SET_PDEATHSIG) runs in
a single-threaded parent; this process never imports numpy or numba.

Each rank leads its own session (process group): a signal to the group
reaches everything the rank started, and a Ctrl-C in the terminal reaches
only the launcher, which forwards it once.  Ranks die with the launcher
(PR_SET_PDEATHSIG), even if it is killed with SIGKILL.

Stopping: on the first rank that fails (non-zero exit or a signal), on a
signal to the launcher, at --timeout, or when a rank has not reached the
store by --start-timeout, every other rank's group gets SIGTERM (or the
signal the launcher got), then SIGKILL after ``grace`` seconds.  When every
rank has exited, each group gets a SIGKILL for any process the rank left
behind.

Restarts (--max-restarts, torchrun's): a job stopped by a failed rank runs
again from the start, as a new Job (a fresh store and secret, so nothing of
the failed attempt is seen), with COMMRT_RESTART_COUNT and
TORCHELASTIC_RESTART_COUNT one higher; --timeout bounds all attempts.
"""
import collections
import ctypes
import os
import re
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from commrt.errors import StoreError
from commrt.launcher import hosts as hostmod
from commrt.launcher.output import STDERR, STDOUT, OutputRouter
from commrt.launcher.rankenv import HUGE_PAGES, with_defaults
from commrt.launcher.signals import FORWARDED as _FORWARDED, signal_group
from commrt.rendezvous import auth
from commrt.rendezvous.store import StoreServer

_PR_SET_PDEATHSIG = 1
# How each failure a rank raises names the rank to blame (commrt/errors.py's texts):
# group 1 the error's class, group 2 the culprit.
_BLAMES = (
    re.compile(r"(PeerLostError|PeerUnresponsiveError): lost peer rank (\d+)"),
    re.compile(r"(CommTimeoutError): .*timed out.* waiting on rank (\d+)"),
    re.compile(r"(AbortedError|CollectiveMismatchError): .*\(culprit rank (\d+)\)"),
)
_DRAIN_S = 1.0           # after the last rank exits, wait this long for its pipes to close
_BLAME_WAIT_S = 0.5      # how long a lost peer's own exit may lag behind its victims'
_ABORTER_WAIT_S = 10.0   # how long a rank that aborted the job may outlive its victims
                         # (5 s was too short for a 1 s outliving at a load of 15)
# A rank that reports an unresponsive peer which has not ended opens a window for the
# other ranks' reports (a cut link makes ranks on both sides accuse each other, and the
# ones cut off may report first): two heartbeats, as ranks check liveness once a beat
# and their clocks of the last beat heard differ by up to one; at most this long.
_VERDICT_WINDOW_MAX_S = 1.5
_LAUNCHER_KNOBS = ("COMMRT_",)  # forwarded to remote ranks from our own environment


@dataclass
class JobSpec:
    """Everything the command line says about a job."""
    nprocs: int
    command: List[str]                      # argv of each rank
    hosts: List[hostmod.Host]
    ssh_cmd: List[str] = field(default_factory=lambda: ["ssh"])
    timeout: Optional[float] = None
    prefix: bool = True
    log_dir: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    bind: Optional[str] = None
    store_port: int = 0
    grace: float = 2.0
    verbose: bool = False
    timeline: Optional[str] = None          # merged Chrome trace to write at the end
    start_timeout: Optional[float] = None   # every rank in the store by then, or stop
    max_restarts: int = 0                   # whole-job restarts after a failed rank
    tag_output: bool = False                # mpirun's [1,K]<stdout>: tags
    timestamps: bool = False
    output_dir: Optional[str] = None        # mpirun's --output-filename DIR
    output_to_terminal: bool = True
    bind_to: str = "none"                   # "core": launcher/binding.py


@dataclass
class Rank:
    placement: hostmod.Placement
    remote: bool
    proc: object = None
    returncode: Optional[int] = None
    stopped_since: Optional[float] = None   # when its process was first seen stopped (state T)

    @property
    def rank(self):
        return self.placement.rank


def run(spec: JobSpec) -> int:
    """Run the job to its end, restarting it after a failed rank up to
    spec.max_restarts times; returns the launcher's exit code."""
    deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
    for attempt in range(spec.max_restarts + 1):
        job = Job(spec, attempt=attempt, deadline=deadline)
        code = job.run()
        if code == 0 or job.failed is None or attempt == spec.max_restarts:
            return code
        _note(f"restarting the job: restart {attempt + 1} of {spec.max_restarts}")
    return code


class Job:
    def __init__(self, spec, attempt=0, deadline=None):
        self.spec = spec
        self.attempt = attempt
        self.deadline = deadline    # of --timeout, over all attempts
        self.placements = hostmod.place(spec.nprocs, spec.hosts)
        self.ranks = [Rank(p, remote=not hostmod.is_local(p.host)) for p in self.placements]
        self.router = OutputRouter(spec.prefix, spec.log_dir,
                                   tag="mpirun" if spec.tag_output else "rank",
                                   timestamps=spec.timestamps, output_dir=spec.output_dir,
                                   to_terminal=spec.output_to_terminal, append=attempt > 0)
        self.secret = auth.new_secret()
        self.failed = None          # the first rank that failed: the root cause
        self.failed_how = None      # how it failed, when it did not end (stopped, silent)
        self.liveness_s = _liveness_timeout(spec.env)   # a rank stopped this long is the cause
        self.verdict_window_s = min(2 * _knob(spec.env, "COMMRT_HEARTBEAT_S"),
                                    _VERDICT_WINDOW_MAX_S)
        self.judge_at = None        # a verdict waiting for more evidence: until when,
        self.judge = None           # and the method that gives it (runs at every reap)
        self.accused_order = []     # accused ranks, in the order their accusations were read
        self.first_silent = None    # the unresponsive rank the first report named
        self.aborter = None         # a live rank its victims name as the one that aborted
        self.stop_reason = None     # why we are stopping, if we are
        self.exit_code = 0
        self.kill_at = None
        self.server = None
        self.secret_fd = None       # memfd with the secret, inherited by every local rank
        self.pipes = {}             # fd -> (rank, stream, pipe)
        self.never_joined = []

    # -- the whole life of a job
    def run(self):
        old_handlers, old_wakeup = {}, None
        wake_r, wake_w = socket.socketpair()
        try:
            wake_r.setblocking(False)
            wake_w.setblocking(False)
            old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig in _FORWARDED + (signal.SIGCHLD,):
                old_handlers[sig] = signal.signal(sig, lambda *_: None)  # the wake-up fd tells
            self._prepare_store()
            self._spawn_all()
            self.server.start()
            self._loop(wake_r)
        finally:
            self._teardown()
            if old_wakeup is not None:
                signal.set_wakeup_fd(old_wakeup)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()
        self._report()
        if self.spec.timeline:
            self._merge_timeline()
        return self.exit_code

    def _prepare_store(self):
        all_local = not any(r.remote for r in self.ranks)
        bind = self.spec.bind or ("127.0.0.1" if all_local
                                  else self._interface_address() or "0.0.0.0")
        self.server = StoreServer(self.secret, host=bind, port=self.spec.store_port)
        try:
            self.server.bind()
        except StoreError as exc:
            if not (all_local and self.spec.store_port):
                raise LaunchError(f"cannot host the store: {exc}") from None
            _note(f"store port {self.spec.store_port} is busy ({exc}); using any free port")
            self.server = StoreServer(self.secret, host=bind, port=0).bind()
        port = self.server.address[1]
        wildcard = bind in ("0.0.0.0", "::", "")
        self.local_store = f"{'127.0.0.1' if wildcard else _bracket(bind)}:{port}"
        self.remote_store = f"{_bracket(socket.getfqdn()) if wildcard else _bracket(bind)}:{port}"
        self.master_port = _free_port("127.0.0.1" if all_local else "0.0.0.0")
        # in memory only, never a file: nothing is left behind under any exit of the
        # launcher (SIGKILL included); a restarted rank inherits the same descriptor
        self.secret_fd = auth.secret_descriptor(self.secret)
        if self.spec.verbose:
            _note(f"store at {self.local_store if all_local else self.remote_store}; "
                  f"{len(self.ranks)} ranks on {', '.join(h.name for h in self.spec.hosts)}")

    def _interface_address(self):
        """With --network-interface (COMMRT_IFNAME), ranks on other hosts reach the
        store at that interface's address here, as they reach each other."""
        spec = self.spec.env.get("COMMRT_IFNAME")
        if not spec:
            return None
        from commrt.errors import BootstrapError
        from commrt.rendezvous import netif

        try:
            return netif.pick_interface(spec)[1]
        except BootstrapError as exc:
            raise LaunchError(f"--network-interface: {exc}") from None

    # -- starting ranks
    def _spawn_all(self):
        import subprocess

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getpid()
        blocks = self._core_blocks()

        def child_setup(block=None):  # after fork, before exec; we are single-threaded here
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(1)
            if block:
                os.sched_setaffinity(0, block)

        for r in self.ranks:
            self.router.add_rank(r.rank)
            argv, env, stdin = self._rank_command(r)
            block = blocks.get(r.rank)
            try:
                r.proc = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True,
                                          preexec_fn=lambda b=block: child_setup(b),
                                          pass_fds=() if r.remote else (self.secret_fd,))
            except OSError as exc:
                raise LaunchError(f"cannot start rank {r.rank} ({argv[0]}): {exc}") from None
            if r.remote:
                self._send_remote_spec(r)
            for stream, pipe in ((STDOUT, r.proc.stdout), (STDERR, r.proc.stderr)):
                os.set_blocking(pipe.fileno(), False)
                self.pipes[pipe.fileno()] = (r, stream, pipe)

    def _core_blocks(self):
        """{rank: its cores} of this host's ranks under --bind-to core (the
        remote shim binds its own rank: launcher/remote.py)."""
        if self.spec.bind_to != "core":
            return {}
        from commrt.launcher.binding import BindError, core_block

        try:
            return {r.rank: core_block(r.placement.local_rank, r.placement.local_size)
                    for r in self.ranks if not r.remote}
        except BindError as exc:
            raise LaunchError(str(exc)) from None

    def _master_env(self, r):
        """MASTER_ADDR/MASTER_PORT as torchrun sets them (rank 0's host and a port that
        was free there), so env:// init works for any torch backend; the user's own
        win.  commrt's backend itself bootstraps over commrt's store instead."""
        if "MASTER_ADDR" in os.environ or "MASTER_PORT" in os.environ:
            return {}
        zero = next(q for q in self.ranks if q.rank == 0)
        if zero.remote:
            addr = zero.placement.host
        elif r.remote:
            addr = socket.getfqdn()
        else:
            addr = "127.0.0.1"
        return {"MASTER_ADDR": addr, "MASTER_PORT": str(self.master_port)}

    def _rank_env(self, r):
        p = r.placement
        env = {
            "COMMRT_RANK": str(p.rank), "COMMRT_WORLD_SIZE": str(self.spec.nprocs),
            "COMMRT_LOCAL_RANK": str(p.local_rank), "COMMRT_LOCAL_WORLD_SIZE": str(p.local_size),
            "COMMRT_HOST_ID": p.host,
            "COMMRT_STORE_ADDR": self.remote_store if r.remote else self.local_store,
            "RANK": str(p.rank), "WORLD_SIZE": str(self.spec.nprocs),
            "LOCAL_RANK": str(p.local_rank), "LOCAL_WORLD_SIZE": str(p.local_size),
            "COMMRT_RESTART_COUNT": str(self.attempt),
            "TORCHELASTIC_RESTART_COUNT": str(self.attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(self.spec.max_restarts),
        }
        env.update(horovod_env(p, self.spec.nprocs))
        env.update(self._master_env(r))
        if not r.remote:
            env["COMMRT_SECRET_FD"] = str(self.secret_fd)
        if self.spec.timeline:
            env["COMMRT_TIMELINE"] = timeline_part(self.spec.timeline, p.rank)
        env.update(self.spec.env)
        return env

    def _merge_timeline(self):
        """Merge the ranks' timeline files into spec.timeline and remove them."""
        parts = [timeline_part(self.spec.timeline, r.rank) for r in self.ranks]
        found = [p for p in parts if os.path.exists(p)]
        missing = [r.rank for r, p in zip(self.ranks, parts) if p not in found]
        try:
            n = merge_timelines(self.spec.timeline, found)
        except (OSError, ValueError) as exc:
            _note(f"cannot merge the timeline into {self.spec.timeline}: {exc}")
            return
        for p in found:
            os.unlink(p)
        _note(f"timeline: {n} spans of {len(found)} rank(s) in {self.spec.timeline}"
              + (f"; no file from rank(s) {', '.join(map(str, missing))}" if missing else ""))

    def _rank_command(self, r):
        import subprocess

        env = self._rank_env(r)
        if not r.remote:
            full = dict(os.environ)
            for name in ("COMMRT_SECRET", "COMMRT_SECRET_FILE"):  # ours is in the fd;
                full.pop(name, None)                              # never a stale one
            full.update(env)
            with_defaults(full, omp_share(r.placement.local_size))
            return self.spec.command, full, subprocess.DEVNULL
        argv = self.spec.ssh_cmd + [r.placement.host, sys.executable, "-m",
                                    "commrt.launcher.remote"]
        return argv, dict(os.environ), subprocess.PIPE

    def _send_remote_spec(self, r):
        """The remote shim reads its rank's command, environment and the secret
        from stdin (never a command line), then holds stdin open as a lifeline."""
        import json

        env = {k: v for k, v in os.environ.items()
               if k.startswith(_LAUNCHER_KNOBS) and k not in ("COMMRT_SECRET", "COMMRT_SECRET_FILE")}
        for name in ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", HUGE_PAGES[0]):
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(self._rank_env(r))
        spec = {"argv": self.spec.command, "env": env, "cwd": os.getcwd(),
                "secret": self.secret.hex(), "local_size": r.placement.local_size,
                "bind_to": self.spec.bind_to, "local_rank": r.placement.local_rank}
        try:
            r.proc.stdin.write(json.dumps(spec).encode() + b"\n")
            r.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the remote command already died: its exit code tells why

    # -- the event loop
    def _loop(self, wake_r):
        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ, None)
        for fd in self.pipes:
            sel.register(fd, selectors.EVENT_READ, fd)
        deadline = self.deadline
        start_by = (None if self.spec.start_timeout is None
                    else time.monotonic() + self.spec.start_timeout)
        drain_until = None
        while self.pipes or self._alive():
            now = time.monotonic()
            if not self._alive():
                drain_until = drain_until or now + _DRAIN_S
                if now >= drain_until:
                    break
            for key, _ in sel.select(self._next_wait(now, deadline, drain_until, start_by)):
                if key.data is None:
                    self._on_signals(wake_r)
                else:
                    self._on_readable(sel, key.data)
            self._reap(sel)
            now = time.monotonic()
            self._watch_stopped(now)
            if deadline is not None and now >= deadline and self.stop_reason is None:
                self._stop(f"the job ran past --timeout {self.spec.timeout:g} s", signal.SIGTERM,
                           code=124)
            if start_by is not None and now >= start_by:
                start_by = None
                self._check_started()
            if self.kill_at is not None and now >= self.kill_at:
                self._signal_all(signal.SIGKILL)
                self.kill_at = None
        sel.close()

    def _next_wait(self, now, deadline, drain_until, start_by=None):
        wait = 1.0  # also a safety net should a SIGCHLD be missed
        for t in (deadline if self.stop_reason is None else None, self.kill_at, drain_until,
                  start_by if self.stop_reason is None else None,
                  self.judge_at if self.stop_reason is None else None):
            if t is not None:
                wait = min(wait, max(t - now, 0.0))
        return wait

    def _check_started(self):
        """--start-timeout has passed: every rank still running must have
        marked itself joined in the store (commrt.init does, first thing)."""
        if self.stop_reason is not None:
            return
        joined = self._joined()
        late = [r.rank for r in self.ranks if r.returncode is None and str(r.rank) not in joined]
        if late:
            self._stop(f"rank(s) {', '.join(map(str, late))} did not reach the store within "
                       f"--start-timeout {self.spec.start_timeout:g} s", signal.SIGTERM, code=124)

    def _joined(self):
        from commrt.rendezvous.bootstrap import JOINED_KEY

        return {k.rsplit("/", 1)[1] for k in self.server.keys(JOINED_KEY + "/")}

    def _on_signals(self, wake_r):
        try:
            data = wake_r.recv(256)
        except BlockingIOError:
            return
        for signum in data:
            if signum in _FORWARDED and self.stop_reason is None:
                name = signal.Signals(signum).name
                self._stop(f"commrt-launch received {name}", signum, code=128 + signum)
            elif signum in _FORWARDED and self.kill_at is not None:
                self._signal_all(signal.SIGKILL)  # asked twice: no more grace
                self.kill_at = None

    def _on_readable(self, sel, fd):
        """Read once from a rank's pipe; False when nothing more is there now."""
        r, stream, pipe = self.pipes[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            self.router.feed(r.rank, stream, data)
            return True
        sel.unregister(fd)
        self.router.finish(r.rank, stream)
        pipe.close()
        del self.pipes[fd]
        return False

    def _alive(self):
        return any(r.returncode is None for r in self.ranks)

    def _reap(self, sel):
        ended = [r for r in self.ranks if r.returncode is None and r.proc.poll() is not None]
        for r in ended:
            r.returncode = r.proc.returncode
            self._kill_group(r, signal.SIGKILL)  # whatever the rank left behind
            self._drain(sel, r)  # its last words, before we judge who failed first
        if self.failed is not None or self.stop_reason is not None:
            return
        if self.judge is not None:              # a verdict waiting for more evidence
            self.judge()
            return
        failures = [r for r in ended if r.returncode != 0]
        if not failures:
            return
        silent = self._unresponsive_peer(failures)
        if silent is not None:                  # the cause is alive, stopped or cut off
            if _proc_state(silent) == "T":      # a stopped process is the cause outright
                self._blame_unresponsive(silent, self._accusers(silent.rank))
                return
            self._await(self.verdict_window_s, self._judge_unresponsive)
            self.first_silent = silent.rank
            self._judge_unresponsive()
            return
        aborter = self._live_aborter(failures)
        if aborter is not None:
            self.aborter = aborter
            self._await(_ABORTER_WAIT_S, self._judge_aborter)
            self._judge_aborter()
            return
        failures += self._blamed_peers(sel, failures)
        r = self.failed = self._root_cause(failures)
        code = r.returncode if r.returncode > 0 else 128 - r.returncode
        self._stop(f"rank {r.rank} {describe_exit(r.returncode)}", signal.SIGTERM, code=code)

    def _unresponsive_peer(self, failures):
        """A rank the failed ones lost that has not ended: stopped (its process is
        in state T) or reported unresponsive (no heartbeat); None if there is none.
        A stopped one comes first."""
        found = []
        for r in failures:
            for line in self.router.tail(r.rank):
                blame = blamed_rank(line)
                if not blame or blame[1] >= len(self.ranks):
                    continue
                peer = self.ranks[blame[1]]
                if peer is r or peer.returncode is not None or peer.proc.poll() is not None:
                    continue
                if blame[0] == "PeerUnresponsiveError" or _proc_state(peer) == "T":
                    found.append(peer)
        stopped = [p for p in found if _proc_state(p) == "T"]
        return (stopped or found or [None])[0]

    def _await(self, window_s, judge):
        """Give the verdict by judge() within window_s; it runs at every reap till then."""
        self.judge_at, self.judge = time.monotonic() + window_s, judge

    def _live_aborter(self, failures):
        """A rank still running that the failed ones' errors name as the rank that
        called abort (AbortedError's culprit): the cause, however late it ends."""
        for r in failures:
            for line in reversed(self.router.tail(r.rank)):
                blame = blamed_rank(line)
                if blame and blame[0] == "AbortedError" and blame[1] < len(self.ranks):
                    peer = self.ranks[blame[1]]
                    if peer is not r and peer.returncode is None:
                        return peer
                    break
        return None

    def _judge_aborter(self):
        """Name the rank that aborted once it has ended (its exit code is the job's)
        or the wait has passed: its victims often end first, on a loaded host by
        more than _BLAME_WAIT_S, and must not be named in its place."""
        peer = self.aborter
        if peer.returncode is None and time.monotonic() < self.judge_at:
            return
        self.aborter = self.judge_at = self.judge = None
        self.failed = peer
        if peer.returncode is None:
            self.failed_how = "aborted the job (commrt.errors.AbortedError names it)"
            self._stop(f"rank {peer.rank} {self.failed_how}", signal.SIGTERM, code=1)
            return
        rc = peer.returncode
        code = rc if rc > 0 else (128 - rc if rc < 0 else 1)
        self._stop(f"rank {peer.rank} {describe_exit(rc)}", signal.SIGTERM, code=code)

    def _accusations(self):
        """{rank: (error class, rank it blames)} from the last blaming line of each
        rank's stderr (the error it ended or is ending with), ended or not."""
        out = {}
        for r in self.ranks:
            for line in reversed(self.router.tail(r.rank)):
                blame = blamed_rank(line)
                if blame and blame[1] < len(self.ranks) and blame[1] != r.rank:
                    out[r.rank] = blame
                    if blame[1] not in self.accused_order:
                        self.accused_order.append(blame[1])
                    break
        return out

    def _accusers(self, rank):
        return sorted(q for q, (_, accused) in self._accusations().items() if accused == rank)

    def _judge_unresponsive(self):
        """Within the verdict window: name the cut-off or frozen rank once every rank
        has ended (a running rank's report may be half written: a chained traceback
        names the rank that told it before the culprit), a rank's process is seen
        stopped, or the window has passed; until then, wait."""
        stopped = {r.rank for r in self.ranks if r.returncode is None and _proc_state(r) == "T"}
        if not (stopped or not self._alive() or time.monotonic() >= self.judge_at):
            return
        accusations = self._accusations()
        self.judge_at = self.judge = None
        remote = {r.rank for r in self.ranks if r.remote}
        best = cut_off_rank({q: a for q, (_, a) in accusations.items()}, self.accused_order,
                            stopped, remote)
        if best is None:                        # the accusation scrolled out of the tails
            best = self.accused_order[0] if self.accused_order else self.first_silent
        peer = self.ranks[best]
        silent = any(kind == "PeerUnresponsiveError" and a == best
                     for kind, a in accusations.values())
        if peer.returncode is not None and peer.returncode != 0 and not silent:
            # the evidence names a rank that ended by itself (it crashed meanwhile)
            self.failed = peer
            code = peer.returncode if peer.returncode > 0 else 128 - peer.returncode
            self._stop(f"rank {peer.rank} {describe_exit(peer.returncode)}", signal.SIGTERM,
                       code=code)
            return
        self._blame_unresponsive(peer, self._accusers(best))

    def _blame_unresponsive(self, peer, reporters, stopped_s=None):
        """Stop the job naming a rank that stopped running without ending."""
        stopped = _proc_state(peer) == "T"
        if stopped:
            how = "was stopped (SIGSTOP or a frozen process)"
            if stopped_s is not None:
                how += f" for {stopped_s:.0f} s"
        else:
            how = "stopped responding (no heartbeat: frozen, or its link cut)"
        if reporters:
            how += "; rank(s) " + ", ".join(map(str, reporters)) + " lost it"
        self.failed, self.failed_how = peer, how
        self._stop(f"rank {peer.rank} {how}", signal.SIGTERM,
                   code=128 + signal.SIGSTOP if stopped else 1)

    def _watch_stopped(self, now):
        """A local rank whose process stays stopped past the liveness timeout is the
        culprit even if no other rank has failed yet (or they catch their errors)."""
        if self.stop_reason is not None or not self.liveness_s:
            return
        for r in self.ranks:
            if r.remote or r.returncode is not None:
                continue
            if _proc_state(r) != "T":
                r.stopped_since = None
            elif r.stopped_since is None:
                r.stopped_since = now
            elif now - r.stopped_since > self.liveness_s + 1.0:     # the ranks' reports first
                self._blame_unresponsive(r, [], now - r.stopped_since)
                return

    def _blamed_peers(self, sel, failures):
        """Peers that failed ranks say they lost but that we have not seen end
        yet: their exit may still be on its way to us, so wait for it briefly."""
        blamed = []
        for r in failures:
            for line in self.router.tail(r.rank):
                blame = blamed_rank(line)
                peer = self.ranks[blame[1]] if blame and blame[1] < len(self.ranks) else None
                if peer is None or peer.returncode is not None or peer in blamed:
                    continue
                try:
                    peer.returncode = peer.proc.wait(_BLAME_WAIT_S)
                except Exception:  # noqa: BLE001 - still running: it is not the cause
                    continue
                self._kill_group(peer, signal.SIGKILL)
                self._drain(sel, peer)
                if peer.returncode != 0:
                    blamed.append(peer)
        return blamed

    def _root_cause(self, failures):
        """Of ranks found dead together, the one the others blame: a rank that
        failed because of another says so (blamed_rank reads which)."""
        failed = {r.rank: r for r in failures}
        for r in failures:
            for line in reversed(self.router.tail(r.rank)):
                blame = blamed_rank(line)
                if blame and blame[1] in failed and blame[1] != r.rank:
                    return failed[blame[1]]
        return failures[0]

    def _drain(self, sel, r):
        for fd, (owner, _, _) in list(self.pipes.items()):
            if owner is r:
                while fd in self.pipes and self._on_readable(sel, fd):
                    pass

    # -- stopping
    def _stop(self, reason, signum, code):
        self.stop_reason = reason
        self.exit_code = code
        self._signal_all(signum)
        self.kill_at = time.monotonic() + self.spec.grace

    def _signal_all(self, signum):
        for r in self.ranks:
            if r.returncode is None:
                if r.remote and r.proc.stdin is not None and signum == signal.SIGKILL:
                    _close_quietly(r.proc.stdin)
                self._kill_group(r, signum)

    def _kill_group(self, r, signum):
        signal_group(r.proc.pid, signum)

    def _teardown(self):
        """Whatever happened, leave no process, pipe, store or secret behind."""
        for r in self.ranks:
            if r.proc is not None and r.proc.poll() is None:
                self._kill_group(r, signal.SIGKILL)
        for r in self.ranks:
            if r.proc is None:
                continue
            try:
                r.proc.wait(5.0)
            except Exception:  # noqa: BLE001 - never let cleanup hide the real error
                pass
            if r.returncode is None:
                r.returncode = r.proc.returncode
            self._kill_group(r, signal.SIGKILL)
            for pipe in (r.proc.stdin, r.proc.stdout, r.proc.stderr):
                if pipe is not None:
                    _close_quietly(pipe)
        for r, stream, _ in list(self.pipes.values()):
            self.router.finish(r.rank, stream)
        self.pipes.clear()
        self.router.close()
        if self.server is not None:
            self.never_joined = self._never_joined()
            self.server.close()
        if self.secret_fd is not None:
            os.close(self.secret_fd)
            self.secret_fd = None

    def _never_joined(self):
        joined = self._joined()
        if not joined:
            return []  # the program does not use commrt's store at all
        return [r.rank for r in self.ranks if str(r.rank) not in joined]

    # -- the root-cause summary
    def _report(self):
        if self.stop_reason is None:
            return
        stopped = [r.rank for r in self.ranks if r is not self.failed
                   and r.returncode is not None and r.returncode != 0]
        lines = [f"{self.stop_reason}; stopped {len(stopped)} other rank(s)"
                 if self.failed else f"{self.stop_reason}; stopped {len(stopped)} rank(s)"]
        if self.failed is not None:
            r = self.failed
            lines[0] = (f"rank {r.rank} (pid {r.proc.pid} on {r.placement.host}) "
                        f"{self.failed_how or describe_exit(r.returncode)}; "
                        f"stopped {len(stopped)} other rank(s)")
            tail = self.router.tail(r.rank)
            if tail:
                lines.append(f"last lines of rank {r.rank}'s stderr:")
                lines.extend("    " + t for t in tail)
        if self.never_joined:
            lines.append("rank(s) that never connected to the store: "
                         + ", ".join(map(str, self.never_joined)))
        lines.append(f"exit code {self.exit_code}")
        for line in lines:
            _note(line)


class LaunchError(RuntimeError):
    """The launcher could not start the job."""


def _liveness_timeout(env):
    """COMMRT_LIVENESS_TIMEOUT_S as the ranks will see it (the job's -x/env first)."""
    return _knob(env, "COMMRT_LIVENESS_TIMEOUT_S")


def _knob(env, name):
    """A float knob as the ranks will see it: the job's -x/env first, then ours."""
    from commrt import config

    text = env.get(name)
    try:
        value = float(text) if text else config.get(name)
    except ValueError:
        return config.KNOBS[name].default
    return value


def cut_off_rank(accusations, order=(), stopped=(), remote=()):
    """The rank to blame when ranks accuse ranks that have not ended: accusations
    {accuser: accused}.  A stopped process wins outright; then the rank accused by
    the most ranks that nobody accuses (a rank cut off from the others accuses
    them back, so its own accusations, and theirs of it, weigh nothing against the
    rest); then by the most ranks of all; then a rank on another host than the
    launcher's; then the one accused first (``order``).  A cut between two ranks
    alone is symmetric: the last two rules decide it."""
    accused = set(accusations.values())
    credible = collections.Counter(a for q, a in accusations.items() if q not in accused)
    votes = collections.Counter(accusations.values())
    first = {rank: i for i, rank in enumerate(order)}

    def weight(rank):
        return (rank in stopped, credible[rank], votes[rank], rank in remote,
                -first.get(rank, len(first)))

    candidates = sorted(accused | set(stopped))
    return max(candidates, key=weight) if candidates else None


def blamed_rank(line):
    """(error class, culprit rank) that a line of a rank's stderr names, or None."""
    for pattern in _BLAMES:
        m = pattern.search(line)
        if m:
            return m.group(1), int(m.group(2))
    return None


def _proc_state(r):
    """The state letter of a local rank's process (/proc/PID/stat: R, S, D, T, ...),
    or None when it cannot be read (remote, gone)."""
    if r.remote:
        return None
    try:
        with open(f"/proc/{r.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def describe_exit(returncode):
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (signal {-returncode})"
    return f"exited with code {returncode}"


def timeline_part(path, rank):
    """The file rank ``rank`` writes its timeline to (COMMRT_TIMELINE)."""
    return f"{path}.rank{rank}.json"


def merge_timelines(out, paths):
    """Concatenate the traceEvents of per-rank Chrome traces (written by
    commrt.parallel.timeline, pid = rank) into one file, times shifted so the
    first span starts at 0; returns the number of spans."""
    import json

    events = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        events.extend(data["traceEvents"] if isinstance(data, dict) else data)
    stamps = [e["ts"] for e in events if e.get("ph") != "M" and "ts" in e]
    t0 = min(stamps) if stamps else 0.0
    for e in events:
        if e.get("ph") != "M" and "ts" in e:
            e["ts"] -= t0
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, out)
    return sum(1 for e in events if e.get("ph") == "X")


def horovod_env(p, size):
    """The variables horovodrun gives a rank (Horovod's rank, local and cross
    communicators: the cross one groups the ranks of one local rank)."""
    return {"HOROVOD_RANK": str(p.rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(p.local_rank), "HOROVOD_LOCAL_SIZE": str(p.local_size),
            "HOROVOD_CROSS_RANK": str(p.cross_rank), "HOROVOD_CROSS_SIZE": str(p.cross_size),
            "HOROVOD_HOSTNAME": p.host}


def omp_share(local_ranks):
    """Threads per rank: this host's usable cores shared among its ranks."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, local_ranks))


def _bracket(host):
    return f"[{host}]" if ":" in host else host


def _close_quietly(f):
    try:
        f.close()
    except OSError:
        pass


def _note(text):
    sys.stderr.write(f"commrt-launch: {text}\n")
    sys.stderr.flush()


def _free_port(host):
    """A TCP port free on this host just now (for torch's own store on rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
