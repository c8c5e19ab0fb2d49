"""Build the full mesh of channels for one rank, then hand it to the Engine.

Every pair of ranks gets one channel: shared memory when both run on one
host (unless COMMRT_TRANSPORT=tcp), TCP otherwise.  Rank r connects to every
lower rank and accepts every higher one.  Each connection proves it knows
the job secret (commrt.rendezvous.auth) before anything else is read, then
says who it is and which wire version it speaks (a hello, answered by an
ack with the acceptor's version); a peer speaking another wire version is
refused on both sides at once (not at the bootstrap deadline) with an error
naming both versions.  Hello and ack also
carry how many bytes of unexpected messages each side holds for the other
(the eager credit of flow control, docs/transport.md).  Only then is the
channel trusted.

Shared-memory pairs meet over an abstract Unix socket (no file): the lower
rank creates the segment with memfd_create and passes it, with its doorbell
eventfd, over SCM_RIGHTS; the higher rank answers with its own doorbell.
The Unix socket stays open: its EOF is how a rank learns that a peer on its
host died, SIGKILL included.  Nothing is ever named in /dev/shm.

A TCP pair may have extra streams (COMMRT_TCP_STREAMS; each rank publishes
its value and a pair uses the smaller): after its channel's hello is
acknowledged the connecting rank opens each extra connection in turn, each
authenticated and introduced by a hello of kind KIND_LANE + k; the acceptor
adopts the channel once the first connection and all its extra ones are in.
"""
import errno
import itertools
import json
import logging
import os
import resource
import selectors
import socket
import struct
import threading
import time

from commrt import config
from commrt.errors import AuthError, BootstrapError, CommTimeoutError, ProtocolError, TransportError
from commrt.rendezvous import auth
from commrt.transport import _core

log = logging.getLogger("commrt")

HELLO = struct.Struct("<4sHHiiQ")      # magic, wire version, kind, rank, pid, credit
HELLO_MAGIC = b"CMHW"
OLD_HELLO_MAGIC = b"CMHI"               # wire version 1's hello: magic, rank, pid, kind (16 bytes)
OLD_HELLO_BYTES = 16
ACK = struct.Struct("<4sHHQ")           # magic, wire version, verdict (0 accepted), credit
ACK_MAGIC = b"CMAK"
SHM_OFFER = struct.Struct("<4sQ")       # magic, ring bytes
KIND_TCP, KIND_SHM = 0, 1
KIND_LANE = 2                           # + k: the TCP channel's extra stream k (0-based)
MAX_STREAMS = 8                         # COMMRT_TCP_STREAMS: the channel and up to 7 lanes


class MeshPlan:
    """What each rank published: where to reach it, and on which host it runs."""

    def __init__(self, rank, size, addrs):
        self.rank, self.size, self.addrs = rank, size, addrs

    def host_of(self, r):
        return self.addrs[r]["host"]

    def kind_to(self, r, mode):
        same_host = self.host_of(r) == self.host_of(self.rank)
        if mode == "tcp" or not same_host:
            if mode == "shm" and not same_host:
                raise BootstrapError(f"COMMRT_TRANSPORT=shm but rank {r} runs on another host "
                                     f"({self.host_of(r)!r})")
            return KIND_TCP
        return KIND_SHM


def tcp_streams():
    """COMMRT_TCP_STREAMS, checked."""
    n = config.get("COMMRT_TCP_STREAMS")
    if not 1 <= n <= MAX_STREAMS:
        raise ValueError(f"COMMRT_TCP_STREAMS must be 1-{MAX_STREAMS}, got {n}")
    return n


def cma_min_bytes(oversub):
    """COMMRT_CMA_MIN_BYTES, with auto resolved.  Measured on a 2-core host, both
    directions at once (collectives' pattern): streaming through the ring beat
    process_vm_readv by ~2x at 256 KiB-1 MiB (one message between two idle ranks).
    Inside collectives, where each rank also copies its own block or combines,
    process_vm_readv won from 2 MiB messages on: at N = 2 all-gather and
    all-to-all of 16 MiB 1870-1920 -> 1220-1280 us, all-reduce 16 MiB 2620 ->
    1970 and 4 MiB 670 -> 505 (bench collectives, 2026-12-03; it was 12 MiB
    before).  Where only one direction moves (a reduce's combines) streaming keeps
    winning, so the collective says so per receive (copier SENDER, shm.pxi).
    With 4 ranks on 2 cores it lost from ~1 MiB messages on."""
    value = config.get("COMMRT_CMA_MIN_BYTES")
    if value == "auto":
        return 1 << 20 if oversub else 2 << 20
    return value


# Shared-memory segments this rank faults in when it maps them, at most (a host of up
# to 8 ranks with the default 1 MiB rings): each pair's rings are then resident
# from the start, so no message pays the first touch of its page (a page fault on
# each side every 4 KiB of ring, ~20% of a zero-byte message's time until the ring
# has wrapped once).  Beyond it, the pages come as the rings fill: a one-time
# ~1.6 ms a pair is not worth 2 MiB a pair resident on hosts with many ranks.
SHM_POPULATE_BYTES = 16 << 20


def build_engine(rank, size, store, secret, *, host_id, local_size, bind_addr="127.0.0.1",
                 timeout=60.0, generation=0):
    """Connect this rank to every other one and return (started Engine, MeshPlan).
    Its ranks on this host are oversubscribed where they outnumber the cores
    their affinity masks hold together (host_cpus)."""
    global _host_cores
    mode = config.get("COMMRT_TRANSPORT")
    if mode not in ("auto", "shm", "tcp"):
        raise ValueError(f"COMMRT_TRANSPORT must be auto, shm or tcp, got {mode!r}")
    if not config.get("COMMRT_HEARTBEAT_S") > 0:
        raise ValueError(f"COMMRT_HEARTBEAT_S must be > 0, got {config.get('COMMRT_HEARTBEAT_S')}"
                         f" (to stop blaming silent peers set COMMRT_LIVENESS_TIMEOUT_S=0)")
    streams = tcp_streams()
    _check_fd_limit(rank, size, local_size, streams)
    mine = os.sched_getaffinity(0)
    prefix = f"commrt/mesh/{generation}"
    deadline = time.monotonic() + timeout
    with _Listeners(bind_addr) as listeners:
        me = {"host": host_id, "pid": os.getpid(), "tcp": listeners.tcp_addr,
              "unix": listeners.unix_name.hex(), "streams": streams, "cpus": cpu_list(mine)}
        store.set(f"{prefix}/addr/{rank}", json.dumps(me).encode())
        addrs = _gather_addresses(store, prefix, rank, size, deadline)
        _host_cores = len(host_cpus(addrs, host_id, mine))
        engine = _new_engine(rank, size, local_size > _host_cores)
        engine.shm_populate = (local_size - 1) * _core.shm_segment_bytes(_ring_bytes()) \
            <= SHM_POPULATE_BYTES
        plan = MeshPlan(rank, size, addrs)
        kinds = {r: plan.kind_to(r, mode) for r in range(size) if r != rank}
        # extra TCP streams of each TCP pair: both sides take the smaller count
        lanes = {r: min(streams, int(addrs[r].get("streams", 1))) - 1
                 for r in kinds if kinds[r] == KIND_TCP}
        acceptor = _Acceptor(listeners, engine, secret, rank,
                             {r: kinds[r] for r in range(rank + 1, size)}, deadline,
                             {r: n for r, n in lanes.items() if r > rank})
        acceptor.start()
        try:
            for r in range(rank):
                _connect(engine, secret, rank, r, kinds[r], addrs[r], deadline, lanes.get(r, 0))
            acceptor.join(deadline)
        except BaseException as exc:
            acceptor.stop()
            engine.close(0)
            if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
                raise BootstrapError(_fd_limit_text(rank, size, local_size, streams)) from exc
            raise
    engine.start(progress_thread=config.get("COMMRT_PROGRESS_THREAD"))
    return engine, plan


def _new_engine(rank, size, oversub):
    spin_us = config.get("COMMRT_SPIN_US")
    if oversub:                               # others need the core: yield, then sleep
        spin_us = config.get("COMMRT_OVERSUB_SPIN_US")
    return _core.Engine(rank, size, eager_limit=config.get("COMMRT_EAGER_LIMIT"),
                        spin_us=spin_us, spin_max_us=config.get("COMMRT_SPIN_MAX_US"),
                        oversubscribed=oversub,
                        oversub_spin_max_us=config.get("COMMRT_OVERSUB_SPIN_MAX_US"),
                        progress_delay_us=config.get("COMMRT_PROGRESS_DELAY_US"),
                        cma_min_bytes=cma_min_bytes(oversub),
                        chunk=config.get("COMMRT_SHM_CHUNK_BYTES"),
                        timeout=config.get("COMMRT_TIMEOUT"),
                        credit_bytes=config.get("COMMRT_UNEXPECTED_BYTES"),
                        heartbeat_s=config.get("COMMRT_HEARTBEAT_S"),
                        liveness_timeout_s=config.get("COMMRT_LIVENESS_TIMEOUT_S"))


# Cores this host's ranks of the last job built may run on (host_cpus), None before.
_host_cores = None


def host_cores():
    """How many cores this host's ranks of the job may run on: the union of their
    affinity masks, as the last mesh built found them (None before any).  Not
    one rank's own mask: a launcher that pins each rank to a core of its own
    (mpirun's default at 2 ranks, srun --cpu-bind=cores) leaves every mask one
    core wide, and the ranks are not then sharing one."""
    return _host_cores


def cpu_list(cpus):
    """A set of CPU numbers as Linux writes a cpulist ("0-3,8,10-11"): a few bytes
    in every rank's address record where a list of a many-core host's CPUs
    would be a kilobyte, read by every rank of the job."""
    runs = [[c for _, c in run] for _, run in
            itertools.groupby(enumerate(sorted(cpus)), lambda ic: ic[1] - ic[0])]
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def parse_cpu_list(text):
    """The set of CPU numbers of a cpulist ("0-3,8"); ValueError on anything else."""
    cpus = set()
    for part in filter(None, str(text).split(",")):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi) if hi else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"cpulist {text!r}: bad range {part!r}")
        cpus.update(range(first, last + 1))
    return cpus


def host_cpus(addrs, host_id, mine):
    """The CPUs the job's ranks on host_id may run on: the union of their masks
    (each rank's address record), this rank's own where a record has none."""
    cpus = set(mine)
    for rec in addrs.values():
        if rec.get("host") == host_id and rec.get("cpus"):
            try:
                cpus |= parse_cpu_list(rec["cpus"])
            except ValueError:
                pass
    return cpus


FDS_BASE = 32               # epoll sets, eventfds, listeners, store, a rank's own files


def fds_needed(size, local_size, streams=1):
    """Descriptors a rank's mesh holds: `streams` TCP sockets per remote peer; a
    liveness socket and a doorbell per shared-memory peer (its memfd is closed
    once mapped)."""
    local = max(0, local_size - 1)
    return FDS_BASE + 2 * local + streams * (size - 1 - local)


def _fd_limit_text(rank, size, local_size, streams=1):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"rank {rank}: RLIMIT_NOFILE (open files, `ulimit -n`) is {soft} (hard limit "
            f"{hard}), too low for a world of {size} ranks: the mesh needs about "
            f"{fds_needed(size, local_size, streams)} descriptors on this rank; raise it "
            f"(ulimit -n {max(fds_needed(size, local_size, streams) * 2, 1024)})")


def _check_fd_limit(rank, size, local_size, streams=1):
    """Raise the soft RLIMIT_NOFILE toward the hard one if the mesh needs it, or
    fail at once naming the limit (not with EMFILE half-way through the mesh)."""
    want = fds_needed(size, local_size, streams) + len(os.listdir("/proc/self/fd"))  # open ones count
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    cap = max(want, 4096) if hard == resource.RLIM_INFINITY else hard
    if cap >= want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(want, 4096), cap), hard))
            return
        except (ValueError, OSError):
            pass
    raise BootstrapError(_fd_limit_text(rank, size, local_size, streams))


def _gather_addresses(store, prefix, rank, size, deadline):
    keys = [f"{prefix}/addr/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout=max(0.1, deadline - time.monotonic()))
    except CommTimeoutError:
        missing = [r for r in range(size) if not store.check([keys[r]])]
        raise BootstrapError(f"rank {rank}: ranks {missing} never joined the job "
                             f"(waited for their addresses in the store)") from None
    return {r: json.loads(store.get(keys[r]).decode()) for r in range(size)}


class _Listeners:
    """A TCP listener and an abstract Unix listener, closed after the mesh is built."""

    def __init__(self, bind_addr):
        self.tcp = socket.socket(socket.AF_INET6 if ":" in bind_addr else socket.AF_INET)
        self.tcp.bind((bind_addr, 0))
        self.tcp.listen(128)
        self.tcp_addr = list(self.tcp.getsockname()[:2])
        self.unix_name = b"\0commrt-" + os.urandom(16).hex().encode()
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.unix_name)
        self.unix.listen(128)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.tcp.close()
        self.unix.close()


class _Acceptor(threading.Thread):
    """Accepts the higher ranks.  A stranger, or garbage, is logged and dropped:
    each connection is vetted on its own thread so one cannot stall the rest."""

    def __init__(self, listeners, engine, secret, rank, expected, deadline, lanes=None):
        super().__init__(name="commrt-acceptor", daemon=True)
        self.listeners, self.engine, self.secret = listeners, engine, secret
        self.rank, self.expected, self.deadline = rank, dict(expected), deadline
        self.lanes = dict(lanes or {})      # rank -> extra TCP streams of its channel
        self.parts = {}                     # rank -> [first socket, its credit, {k: lane socket}]
        self.lock = threading.Lock()
        self.claimed = set()                # hellos accepted, channel being set up
        self.refused = {}                   # rank -> ProtocolError of a hello in another version
        self.refusals = auth.RefusalLog(log, f"commrt rank {rank}")
        self.vetting = []                   # the connections' vetting threads
        self.done = threading.Event()
        self.error = None
        self.stopping = False
        # stop() wakes run() at once: a select timeout would hold every rank's
        # init up to that long after its last peer connected
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        if not self.expected:
            self.done.set()

    def run(self):
        sel = selectors.DefaultSelector()
        sel.register(self.listeners.tcp, selectors.EVENT_READ)
        sel.register(self.listeners.unix, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self.done.is_set() and not self.stopping:
                if time.monotonic() > self.deadline:
                    break
                for key, _ in sel.select(timeout=0.1):
                    if key.fileobj == self._wake_r:
                        return
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    vet = threading.Thread(target=self._vet, args=(conn,), daemon=True)
                    self.vetting.append(vet)
                    vet.start()
        finally:
            sel.close()

    def _vet(self, conn):
        peer = None
        source = auth.source_of(conn)       # now: a refused peer may close before we log
        try:
            budget = max(0.1, self.deadline - time.monotonic())
            auth.server_handshake(conn, self.secret, min(10.0, budget))
            conn.settimeout(budget)
            peer, pid, kind, credit = _read_hello(conn, self.rank)
            lane = kind - KIND_LANE if kind >= KIND_LANE else None
            with self.lock:
                want = self.expected.get(peer)
                fits = (want == KIND_TCP and lane < self.lanes.get(peer, 0) if lane is not None
                        else want == kind)
                if not fits or peer in self.claimed:
                    raise AuthError(f"unexpected hello from rank {peer} (kind {kind})")
                if kind == KIND_SHM:
                    self.claimed.add(peer)
            if kind != KIND_SHM:
                whole = self._tcp_part(peer, lane, conn, credit)
                conn = None                     # kept in parts (closed there if replaced)
                if whole is None:
                    return
                try:
                    _adopt_tcp(self.engine, peer, *whole)
                except BaseException:
                    with self.lock:
                        self.claimed.discard(peer)
                    raise
            else:
                try:
                    conn.sendall(ACK.pack(ACK_MAGIC, _core.WIRE_VERSION, 0,
                                          self.engine.credit_bytes))
                    _offer_shm(self.engine, conn, self.rank, peer, pid, credit)
                except BaseException:
                    with self.lock:             # the rank may try again; join() names it if not
                        self.claimed.discard(peer)
                    raise
            with self.lock:
                del self.expected[peer]
                if not self.expected:
                    self.done.set()
        except ProtocolError as exc:
            # A whole hello in another wire version, after the job's secret was
            # proven: a rank of this job running another commrt.  If it claims a
            # rank (and channel kind) this mesh waits for, init fails now, naming
            # both versions, as the peer's own side does: waiting for the
            # deadline would only delay the same error.  Else it is said loudly
            # and is what join() raises if the rank it claims never joins.
            log.error("commrt %s", exc)         # (the message names this rank and the peer)
            conn.close()
            with self.lock:
                self.refused.setdefault(exc.peer, exc)
                waited = exc.peer in self.expected and exc.kind in (None, self.expected[exc.peer])
            if waited:
                self.error = exc
                self.done.set()
        except (AuthError, OSError, struct.error, ValueError) as exc:
            who = f" claiming rank {peer}" if peer is not None else ""
            self.refusals.refused(source, f"{exc}{who}")
            if conn is not None:
                conn.close()
        except BaseException as exc:                      # surfaced by join()
            self.error = exc
            if conn is not None:
                conn.close()
            self.done.set()

    def _tcp_part(self, peer, lane, conn, credit):
        """One connection of peer's TCP channel (lane None: the first) is in: keep
        it, acknowledge it, and once the first and every extra one are in return
        (first, credit, lanes) for adoption (None until then).  A first
        connection again (the peer retried a broken set-up) starts afresh, and
        a lane again replaces the one kept."""
        with self.lock:
            if lane is None:
                old = self.parts.pop(peer, None)
                self.parts[peer] = [conn, credit, {}]
            else:
                parts = self.parts.get(peer)
                if parts is None:           # its first connection is not (or no longer) in
                    raise AuthError(f"extra TCP stream {lane} of rank {peer} before its channel")
                old = (None, None, {lane: parts[2][lane]} if lane in parts[2] else {})
                parts[2][lane] = conn
        if old is not None:
            for sock in [old[0], *old[2].values()]:
                if sock is not None:
                    sock.close()
        # (after it is kept: the peer opens its next stream only once this is read)
        conn.sendall(ACK.pack(ACK_MAGIC, _core.WIRE_VERSION, 0, self.engine.credit_bytes))
        with self.lock:
            parts = self.parts.get(peer)
            if (parts is None or parts[0] is None or len(parts[2]) < self.lanes.get(peer, 0)
                    or peer in self.claimed):
                return None
            del self.parts[peer]
            self.claimed.add(peer)
        first, credit, lanes = parts
        return first, credit, [lanes[k] for k in range(len(lanes))]

    def join(self, deadline):
        while not self.done.wait(0.05):
            if time.monotonic() > deadline:
                self.stop()
                with self.lock:
                    missing = sorted(self.expected)
                    refused = [self.refused[r] for r in missing if r in self.refused]
                if refused:
                    raise refused[0]
                raise BootstrapError(f"rank {self.rank}: ranks {missing} never connected")
        self.stop()
        if self.error is not None:
            raise self.error

    def stop(self):
        self.stopping = True
        with self.lock:                     # channels never completed
            parts, self.parts = self.parts, {}
        for first, _, lanes in parts.values():
            for sock in [first, *lanes.values()]:
                sock.close()
        try:
            os.write(self._wake_w, b"x")
        except OSError:         # already woken (a full pipe) or closed
            pass
        super().join(1.0)
        if not self.is_alive() and self._wake_w >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        # strangers accepted before the last peer are vetted meanwhile: give them a
        # moment to be counted (garbage is refused at once; a silent one is not
        # waited for), so that the summary counts them with the first refusal
        until = time.monotonic() + 0.5
        for vet in self.vetting:
            vet.join(max(0.0, until - time.monotonic()))
        self.vetting = []
        self.refusals.summary()


def _connect(engine, secret, rank, peer, kind, addr, deadline, lanes=0):
    """Connect to a lower rank, authenticate, say hello and adopt the channel.

    A channel set-up that breaks half-way (a reset, a timeout on a loaded
    host) is tried again until the deadline; a refused secret is not."""
    while True:
        try:
            return _connect_once(engine, secret, rank, peer, kind, addr, deadline, lanes)
        except (AuthError, ProtocolError):
            raise
        except OSError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("commrt rank %d: channel to rank %d failed (%s); retrying", rank, peer, exc)
            time.sleep(0.05)


def _connect_once(engine, secret, rank, peer, kind, addr, deadline, lanes=0):
    sock = _open(rank, peer, kind, addr, deadline)
    extra = []
    try:
        auth.client_handshake(sock, secret, max(0.1, deadline - time.monotonic()))
        sock.sendall(HELLO.pack(HELLO_MAGIC, _core.WIRE_VERSION, kind, rank, os.getpid(),
                                engine.credit_bytes))
        credit = _read_ack(sock, rank, peer)
        if kind == KIND_SHM:
            _accept_shm(engine, sock, rank, peer, addr["pid"], credit)
        else:
            for k in range(lanes):          # one at a time: each after the last was acknowledged
                extra.append(_open(rank, peer, kind, addr, deadline))
                auth.client_handshake(extra[-1], secret, max(0.1, deadline - time.monotonic()))
                extra[-1].sendall(HELLO.pack(HELLO_MAGIC, _core.WIRE_VERSION, KIND_LANE + k,
                                             rank, os.getpid(), engine.credit_bytes))
                _read_ack(extra[-1], rank, peer)
            _adopt_tcp(engine, peer, sock, credit, extra)
    except BaseException:
        for s in [sock, *extra]:
            s.close()
        raise


def _open(rank, peer, kind, addr, deadline):
    """A connected socket to peer (its Unix listener for shared memory, else TCP)."""
    while True:
        try:
            if kind == KIND_SHM:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect(bytes.fromhex(addr["unix"]))
            else:
                host, port = addr["tcp"]
                sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TransportError(f"rank {rank}: cannot connect to rank {peer} at {addr}: {exc}") from None
            time.sleep(0.01)
    return sock


def _version_error(rank, peer, theirs, kind=None):
    exc = ProtocolError(
        f"rank {rank}: rank {peer} speaks commrt wire version {theirs}, this rank speaks "
        f"wire version {_core.WIRE_VERSION}; every rank of a job must run the same commrt")
    exc.peer, exc.kind = peer, kind         # kind: the channel its hello asked for (None: unsaid)
    return exc


def _read_hello(conn, rank):
    """The acceptor's side: (peer, pid, kind, credit) from a hello, or
    ProtocolError (after telling the peer our version) for another version."""
    head = _recv_exact(conn, OLD_HELLO_BYTES)
    if head[:4] == OLD_HELLO_MAGIC:                 # version 1: magic, rank, pid, kind
        _, peer, _, _ = struct.unpack("<4siii", head)
        raise _version_error(rank, peer, 1)
    if head[:4] != HELLO_MAGIC:
        raise AuthError("bad hello after authentication")
    magic, version, kind, peer, pid, credit = HELLO.unpack(
        head + _recv_exact(conn, HELLO.size - OLD_HELLO_BYTES))
    if version != _core.WIRE_VERSION:
        try:
            conn.sendall(ACK.pack(ACK_MAGIC, _core.WIRE_VERSION, 1, 0))
        except OSError:
            pass
        raise _version_error(rank, peer, version, kind)
    return peer, pid, kind, credit


def _read_ack(sock, rank, peer):
    """The connecting side: the acceptor's credit, or ProtocolError."""
    try:
        raw = _recv_exact(sock, ACK.size)
    except TransportError:
        raise TransportError(
            f"rank {rank}: rank {peer} closed the channel after our hello: it may speak another "
            f"commrt wire version (this rank speaks wire version {_core.WIRE_VERSION}; "
            f"version 1 closes on a hello it does not know)") from None
    magic, version, verdict, credit = ACK.unpack(raw)
    if magic != ACK_MAGIC:
        raise TransportError(f"rank {rank}: rank {peer} answered our hello with garbage")
    if version != _core.WIRE_VERSION:
        raise _version_error(rank, peer, version)
    if verdict != 0:
        raise TransportError(f"rank {rank}: rank {peer} refused the channel")
    return credit


def _adopt_tcp(engine, peer, sock, credit, lanes=()):
    for s in (sock, *lanes):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Buffer sizes are left to the kernel: setting SO_SNDBUF/SO_RCVBUF turns
        # autotuning off, and autotuning won 10-25% at 16-64 MiB on loopback.
        s.setblocking(False)
    engine.add_tcp_peer(peer, sock.detach(), credit, [s.detach() for s in lanes])


def _offer_shm(engine, conn, rank, peer, peer_pid, credit):
    """Lower rank: create the pair's segment and pass it with our doorbell."""
    ring = _ring_bytes()
    seg = _core.shm_segment_bytes(ring)
    memfd = os.memfd_create(f"commrt-{rank}-{peer}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, seg)
        socket.send_fds(conn, [SHM_OFFER.pack(b"CMSH", ring)], [memfd, engine.doorbell_fd])
        _, fds, _, _ = socket.recv_fds(conn, 16, 1, socket.MSG_CMSG_CLOEXEC)
        if len(fds) != 1:
            raise TransportError(f"rank {peer} did not send its doorbell")
    except BaseException:
        os.close(memfd)
        raise
    _adopt_shm(engine, peer, memfd, ring, 0, fds[0], conn, peer_pid, credit)


def _accept_shm(engine, sock, rank, peer, peer_pid, credit):
    """Higher rank: receive the segment and the peer's doorbell, send ours."""
    msg, fds, _, _ = socket.recv_fds(sock, SHM_OFFER.size, 2, socket.MSG_CMSG_CLOEXEC)
    if len(fds) != 2 or len(msg) != SHM_OFFER.size:
        for fd in fds:
            os.close(fd)
        raise TransportError(f"rank {peer} sent a malformed shared-memory offer")
    magic, ring = SHM_OFFER.unpack(msg)
    socket.send_fds(sock, [b"D"], [engine.doorbell_fd])
    _adopt_shm(engine, peer, fds[0], ring, 1, fds[1], sock, peer_pid, credit)


def _adopt_shm(engine, peer, memfd, ring, side, peer_efd, sock, peer_pid, credit):
    for fd in (memfd, peer_efd):             # close-on-exec, as every commrt descriptor
        os.set_inheritable(fd, False)
    sock.setblocking(False)
    engine.add_shm_peer(peer, memfd, ring, side, peer_efd, sock.detach(), peer_pid,
                        config.get("COMMRT_CMA"), credit)


def _ring_bytes():
    ring = config.get("COMMRT_SHM_RING_BYTES")
    if ring < 16384 or ring & (ring - 1):
        raise ValueError(f"COMMRT_SHM_RING_BYTES must be a power of two >= 16 KiB, got {ring}")
    return ring


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise TransportError("connection closed during the channel handshake")
        data += chunk
    return data
