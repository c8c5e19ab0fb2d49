"""Find this rank's place in the world, the store and the job secret, from the environment.

Sources, first match wins:

==============  ==========================================================
commrt-launch   COMMRT_RANK, COMMRT_WORLD_SIZE, COMMRT_LOCAL_RANK,
                COMMRT_LOCAL_WORLD_SIZE, COMMRT_STORE_ADDR and the secret
                (COMMRT_SECRET_FILE or COMMRT_SECRET).  The launcher hosts
                the store.
torchrun        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
                MASTER_PORT.
OpenMPI mpirun  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
Slurm srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
                SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST.
==============  ==========================================================

Under torchrun, mpirun and srun, rank 0 hosts the store, and the other
ranks must learn its address and the secret.  In order:

1. ``COMMRT_STORE_ADDR`` given: the store is there (rank 0 binds its port).
2. A secret given (``COMMRT_SECRET_FILE``/``COMMRT_SECRET``) and the launcher
   names rank 0's host: torchrun → MASTER_ADDR:MASTER_PORT+1 (torchrun's own
   store holds MASTER_PORT); Slurm → the first node of the step, on a port
   derived from the job and step ids.
3. Otherwise rank 0 generates a secret, binds any free port, and publishes
   ``host port secret`` in a file of mode 0600, in a directory of mode 0700
   owned by the user, named after the job; the other ranks poll for it.
   On one host the directory is private and local (/tmp/commrt-UID); across
   hosts it must be shared: COMMRT_RENDEZVOUS_DIR, default ~/.commrt/rendezvous.
   The file is removed once every rank has connected (or when rank 0 exits).

Trust model: anyone who can read the secret, or the environment of a rank,
can join the job; that is the user's own uid (and root).  docs/launcher.md
says more.
"""
import atexit
import os
import re
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from commrt import config
from commrt.errors import AuthError, BootstrapError, StoreError
from commrt.rendezvous import auth, netif
from commrt.rendezvous.store import Store, StoreServer

JOINED_KEY = "commrt/bootstrap/joined"


@dataclass
class BootstrapInfo:
    """Where this rank stands in the world, and how to reach the store.

    ``store_host``/``store_port``/``secret`` are None on ranks that learn them
    from rank 0's published file (``rendezvous_file``); ``open_store`` fills
    them in.  ``data_addr`` is the address this rank should bind and
    advertise for its data-plane listener: loopback when every rank is on
    this host, else the local address that routes to the store's host.
    """
    rank: int
    size: int
    local_rank: int
    local_size: int
    host_id: str
    store_host: Optional[str]
    store_port: Optional[int]
    secret: Optional[bytes]
    host_store: bool
    launcher: str = "commrt-launch"
    rendezvous_file: Optional[str] = None
    store_bind: Optional[str] = None
    data_addr: Optional[str] = None
    job_id: str = ""
    nodes: List[str] = field(default_factory=list)

    @property
    def single_host(self) -> bool:
        return self.local_size == self.size


# -- reading the environment ---------------------------------------------------

def from_environment() -> BootstrapInfo:
    """The BootstrapInfo of this process, from whichever launcher started it.

    Raises BootstrapError listing what is missing or malformed.
    """
    env = os.environ
    for detect, build in _SOURCES:
        if detect(env):
            info = build(env)
            _check_ranks(info)
            if os.environ.get("COMMRT_BIND_ADDR") or info.single_host:
                info.data_addr = _data_address(info)  # else open_store finds the route
            return info
    raise BootstrapError(
        "cannot tell this process's rank: no launcher environment found. Start the job with "
        "commrt-launch (e.g. `commrt-launch -n 4 train.py`), torchrun, mpirun or srun, or set "
        "COMMRT_RANK, COMMRT_WORLD_SIZE, COMMRT_STORE_ADDR and COMMRT_SECRET yourself.")


def _from_commrt_launch(env):
    missing = [n for n in ("COMMRT_RANK", "COMMRT_WORLD_SIZE", "COMMRT_STORE_ADDR")
               if _knob(n) is None]
    if not (_knob("COMMRT_SECRET_FD") is not None or _knob("COMMRT_SECRET_FILE")
            or _knob("COMMRT_SECRET")):
        missing.append("COMMRT_SECRET_FILE or COMMRT_SECRET")
    if missing:
        raise BootstrapError(f"COMMRT_RANK is set but the environment lacks: {', '.join(missing)}")
    rank, size = _knob("COMMRT_RANK"), _knob("COMMRT_WORLD_SIZE")
    local_rank, local_size = _knob("COMMRT_LOCAL_RANK"), _knob("COMMRT_LOCAL_WORLD_SIZE")
    host, port = parse_address(_knob("COMMRT_STORE_ADDR"), "COMMRT_STORE_ADDR")
    return BootstrapInfo(
        rank=rank, size=size,
        local_rank=rank if local_rank is None else local_rank,
        local_size=size if local_size is None else local_size,
        host_id=_host_id(env), store_host=host, store_port=port,
        secret=_load_secret(), host_store=False, launcher="commrt-launch")


def _from_torchrun(env):
    _require(env, "torchrun", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    master, master_port = env["MASTER_ADDR"], _int(env, "MASTER_PORT")
    derived = (master, master_port + 1) if master_port + 1 < 65536 else None
    job = f"{env.get('TORCHELASTIC_RUN_ID', 'none')}-{master_port}-" \
          f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    info = _launcher_info(env, "torchrun", rank, size,
                          _int(env, "LOCAL_RANK", rank), _int(env, "LOCAL_WORLD_SIZE", size), job)
    return _place_store(info, env, derived, advertise=master)


def _from_mpirun(env):
    _require(env, "OpenMPI", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"])
    rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    job = (env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
           or env.get("OMPI_MCA_orte_ess_jobid"))
    if not job:
        raise BootstrapError("OpenMPI environment without a job id (OMPI_MCA_ess_base_jobid "
                             "or PMIX_NAMESPACE); set COMMRT_STORE_ADDR and COMMRT_SECRET")
    info = _launcher_info(env, "mpirun", rank, size,
                          _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", rank),
                          _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", size), job)
    return _place_store(info, env, derived=None, advertise=None)


def _from_slurm(env):
    _require(env, "Slurm", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"])
    rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    nodes = expand_nodelist(nodelist) if nodelist else []
    local_size = _slurm_local_size(env, size)
    job_id, step_id = env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", "0")
    info = _launcher_info(env, "slurm", rank, size, _int(env, "SLURM_LOCALID", 0), local_size,
                          f"{job_id}.{step_id}")
    info.nodes = nodes
    derived = (nodes[0], slurm_store_port(job_id, step_id)) if nodes else None
    return _place_store(info, env, derived, advertise=None)


_SOURCES = [
    (lambda e: "COMMRT_RANK" in e, _from_commrt_launch),
    (lambda e: "RANK" in e and ("MASTER_ADDR" in e or "TORCHELASTIC_RUN_ID" in e), _from_torchrun),
    (lambda e: "OMPI_COMM_WORLD_RANK" in e, _from_mpirun),
    (lambda e: "SLURM_PROCID" in e, _from_slurm),
]


def _launcher_info(env, launcher, rank, size, local_rank, local_size, job):
    return BootstrapInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                         host_id=_host_id(env), store_host=None, store_port=None, secret=None,
                         host_store=(rank == 0), launcher=launcher, job_id=job)


def _place_store(info, env, derived, advertise):
    """Decide where the store lives and how the secret travels (see the module docstring)."""
    secret = _load_secret()
    addr = _knob("COMMRT_STORE_ADDR")
    if addr:
        info.store_host, info.store_port = parse_address(addr, "COMMRT_STORE_ADDR")
        local = _is_loopback(info.store_host)
    else:
        local = info.single_host
        if secret is not None and derived is not None:
            info.store_host, info.store_port = ("127.0.0.1", derived[1]) if local else derived
    info.store_bind = _knob("COMMRT_STORE_BIND") or ("127.0.0.1" if local else "0.0.0.0")
    if info.store_host is None or secret is None:
        # rank 0 publishes what the others cannot know: the secret, and the address
        name = _safe_name(f"{info.launcher}-{info.job_id}.store")
        info.rendezvous_file = os.path.join(_rendezvous_dir(info, env), name)
        if info.host_store and info.store_host is None:
            info.store_port = 0  # any free port: it is published with the secret
            info.store_host = "127.0.0.1" if local else (advertise or _advertised_host())
    if info.host_store:
        info.secret = secret if secret is not None else auth.new_secret()
    elif info.rendezvous_file is None:
        info.secret = secret
    else:
        info.store_host = info.store_port = None  # read from rank 0's file
    return info


def _rendezvous_dir(info, env):
    explicit = _knob("COMMRT_RENDEZVOUS_DIR")
    if explicit:
        return explicit
    if info.single_host:
        return os.path.join(env.get("TMPDIR") or "/tmp", f"commrt-{os.getuid()}")
    return os.path.join(os.path.expanduser("~"), ".commrt", "rendezvous")


def _check_ranks(info):
    if info.size < 1:
        raise BootstrapError(f"{info.launcher}: world size must be >= 1, got {info.size}")
    if not 0 <= info.rank < info.size:
        raise BootstrapError(f"{info.launcher}: rank {info.rank} is outside the world of "
                             f"{info.size} ranks")
    if not (1 <= info.local_size <= info.size and 0 <= info.local_rank < info.local_size):
        raise BootstrapError(f"{info.launcher}: local rank {info.local_rank} of "
                             f"{info.local_size} does not fit a world of {info.size}")


def _require(env, launcher, names):
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise BootstrapError(f"{launcher} environment found, but it lacks: {', '.join(missing)}")


def _knob(name):
    try:
        return config.get(name)
    except ValueError as exc:
        raise BootstrapError(str(exc)) from None


def _load_secret():
    try:
        return auth.load_secret()
    except ValueError as exc:
        raise BootstrapError(str(exc)) from None


def _int(env, name, default=None):
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BootstrapError(f"{name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise BootstrapError(f"{name}={raw!r} is not an integer") from None


def _host_id(env):
    """COMMRT_HOST_ID as given; else the node's name, with the network namespace
    when it is not the machine's own (two namespaces share no memory channel)."""
    explicit = _knob("COMMRT_HOST_ID")
    if explicit:
        return explicit
    name = env.get("SLURMD_NODENAME") or socket.gethostname()
    ns = netif.namespace()
    return f"{name}/{ns}" if ns else name


def _advertised_host():
    """What rank 0 publishes for its store across hosts: COMMRT_IFNAME's address,
    else the hostname."""
    spec = _knob("COMMRT_IFNAME")
    return netif.pick_interface(spec)[1] if spec else socket.gethostname()


def _safe_name(text):
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", text)


def _is_loopback(host):
    return host in ("localhost", "::1") or host.startswith("127.")


def _data_address(info):
    explicit = os.environ.get("COMMRT_BIND_ADDR")  # the knob's default is loopback: ask if set
    if explicit:
        return explicit
    if info.single_host:
        return "127.0.0.1"
    spec = _knob("COMMRT_IFNAME")
    if spec:
        return netif.pick_interface(spec)[1]
    return route_address(info.store_host)


def route_address(host: str) -> str:
    """The local address this host uses to reach ``host`` (no packet is sent)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(addr)
            return probe.getsockname()[0]
    except OSError as exc:
        raise BootstrapError(f"cannot find a local address that reaches the store host "
                             f"{host!r}: {exc}") from None


def parse_address(text: str, name: str = "address") -> Tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) as a (host, port) pair."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\s]+):(\d+)", text.strip())
    if not m:
        raise BootstrapError(f"{name}={text!r} is not host:port")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 < port < 65536:
        raise BootstrapError(f"{name}={text!r}: port must be 1-65535")
    return host, port


# -- Slurm -----------------------------------------------------------------------

def expand_nodelist(text: str) -> List[str]:
    """Expand a Slurm host list: ``node[01-03,07],gpu-[1-2]x`` ->
    node01 node02 node03 node07 gpu-1x gpu-2x (zero padding kept; several
    bracket groups in one name expand as a product, as Slurm does)."""
    names = []
    for part in _split_top_level(text.strip()):
        names.extend(_expand_one(part))
    return names


def _split_top_level(text):
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise BootstrapError(f"malformed Slurm node list {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise BootstrapError(f"malformed Slurm node list {text!r}: unbalanced '['")
    parts.append(text[start:])
    if any(not p for p in parts):
        raise BootstrapError(f"malformed Slurm node list {text!r}: empty name")
    return parts


def _expand_one(pattern):
    m = re.search(r"\[([^\]]*)\]", pattern)
    if not m:
        return [pattern]
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [head + item + rest for item in _expand_range(m.group(1), pattern)
            for rest in _expand_one(tail)]


def _expand_range(body, pattern):
    items = []
    for piece in body.split(","):
        lo, dash, hi = piece.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise BootstrapError(f"malformed Slurm node list range [{body}] in {pattern!r}")
        if not dash:
            items.append(lo)
            continue
        if int(hi) < int(lo):
            raise BootstrapError(f"malformed Slurm node list range {piece!r} in {pattern!r}")
        width = len(lo)
        items.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return items


def expand_tasks_per_node(text: str) -> List[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (the format of SLURM_STEP_TASKS_PER_NODE)."""
    counts = []
    for piece in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if not m:
            raise BootstrapError(f"malformed Slurm tasks-per-node {text!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _slurm_local_size(env, size):
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node:
        counts = expand_tasks_per_node(per_node)
        node = _int(env, "SLURM_NODEID", 0)
        if node >= len(counts):
            raise BootstrapError(f"SLURM_NODEID={node} but tasks per node {per_node!r} "
                                 f"names only {len(counts)} nodes")
        return counts[node]
    if env.get("SLURM_NTASKS_PER_NODE"):
        return _int(env, "SLURM_NTASKS_PER_NODE")
    nodes = _int(env, "SLURM_STEP_NUM_NODES", 0) or _int(env, "SLURM_NNODES", 0)
    if nodes == 1:
        return size
    raise BootstrapError("Slurm: cannot tell the tasks on this node; SLURM_STEP_TASKS_PER_NODE "
                         "is not set")


def slurm_store_port(job_id: str, step_id: str) -> int:
    """A port for the store of one Slurm step, below Linux's ephemeral range
    (32768-60999) so it never collides with an outgoing connection."""
    try:
        job, step = int(job_id.split("_")[0]), int(step_id) if step_id.isdigit() else 0
    except ValueError:
        raise BootstrapError(f"SLURM_JOB_ID={job_id!r} is not a number") from None
    return 20000 + (job * 31 + step) % 12000


# -- opening the store -------------------------------------------------------------

def open_store(info: BootstrapInfo, timeout: float) -> Tuple[Store, Optional[StoreServer]]:
    """Connect to the job's store, starting it first when this rank hosts it.

    Returns (client, server or None); the caller closes both.  Marks this
    rank as joined (``commrt/bootstrap/joined/RANK``), which lets a launcher
    name the ranks that never connected.
    """
    server = None
    if info.host_store:
        server = _start_server(info)
    try:
        if info.rendezvous_file is not None and not info.host_store:
            store = _connect_published(info, timeout)
        else:
            store = Store(info.store_host, info.store_port, info.secret, timeout)
        if info.data_addr is None:
            info.data_addr = _data_address(info)
        _mark_joined(info, store)
        return store, server
    except BaseException:
        if server is not None:
            server.close()
        raise


def _start_server(info):
    port = info.store_port or 0
    try:
        server = StoreServer(info.secret, host=info.store_bind or "127.0.0.1", port=port).start()
    except StoreError as exc:
        raise BootstrapError(f"rank 0 cannot host the store: {exc}. Set COMMRT_STORE_ADDR to "
                             f"a free host:port") from None
    if info.rendezvous_file is not None:
        info.store_port = server.address[1]
        _publish(info)
    return server


def _publish(info):
    path = info.rendezvous_file
    _private_dir(os.path.dirname(path))
    try:
        os.unlink(path)  # a stale file of an earlier run with the same job id
    except FileNotFoundError:
        pass
    text = f"{info.store_host} {info.store_port} {info.secret.hex()}\n".encode()
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    atexit.register(_remove_quietly, path)


def _private_dir(path):
    """Create ``path`` (mode 0700) or check that it is ours and private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise BootstrapError(f"rendezvous directory {path} is not a directory owned by this "
                             f"user (uid {os.getuid()}); set COMMRT_RENDEZVOUS_DIR")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BootstrapError(f"rendezvous directory {path} has mode "
                             f"{stat.S_IMODE(st.st_mode):o}; it must be 0700")


def _connect_published(info, timeout):
    """Poll for rank 0's file, then connect; a stale file (dead port, other
    secret) is re-read until rank 0 replaces it or the deadline passes."""
    path, deadline = info.rendezvous_file, time.monotonic() + timeout
    pause, last_error = 0.005, "the file does not exist yet"
    while time.monotonic() < deadline:
        published = _read_published(path)
        if published is not None:
            host, port, secret = published
            try:
                store = Store(host, port, secret, timeout=min(2.0, max(deadline - time.monotonic(), 0.01)))
                store.timeout = timeout
                info.store_host, info.store_port, info.secret = host, port, secret
                return store
            except (StoreError, AuthError) as exc:
                last_error = str(exc)
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    raise BootstrapError(
        f"{info.launcher}: rank {info.rank} found no store of rank 0 within {timeout:g} s: "
        f"waited for {path} ({last_error}). Across hosts that directory must be shared "
        f"(COMMRT_RENDEZVOUS_DIR), or give COMMRT_STORE_ADDR and COMMRT_SECRET")


def _read_published(path):
    try:
        text = auth.read_private_file(path)
    except FileNotFoundError:
        return None
    parts = text.split()
    if len(parts) != 3 or not parts[1].isdigit():
        return None  # being replaced; read again
    return parts[0], int(parts[1]), auth.parse_secret(parts[2], f"rendezvous file {path}")


def _mark_joined(info, store):
    store.set(f"{JOINED_KEY}/{info.rank}", b"")
    if info.rendezvous_file is not None and store.add(JOINED_KEY) == info.size:
        _remove_quietly(info.rendezvous_file)  # everyone has it: the secret need not linger


def _remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass
