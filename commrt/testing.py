"""Real multi-process worlds for tests and benchmarks.

    with World(4, transport="shm") as w:
        results = w.run(fn, *args, timeout=60)   # fn(comm, *args) on every rank

Each rank is a real process started with *spawn* (never fork: Numba's
OpenMP layer and threads do not survive fork), joined through a real store
with a fresh secret, and stays alive across ``run`` calls, so a test module
can share one world across many examples.  ``fn`` must be importable by
the child (a module-level function).  The first failure is re-raised in
the caller with its rank and remote traceback; a rank that hangs past the
timeout, or dies, brings the world down with an error naming it.
"""
import functools
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback

from commrt.rendezvous.auth import new_secret
from commrt.rendezvous.store import StoreServer


_PROBE_GPU = (
    "import cupy, numba\n"
    "from numba import cuda\n"
    "assert not numba.config.ENABLE_CUDASIM\n"
    "assert cupy.cuda.is_available() and cuda.is_available()\n"
    "cupy.arange(4).sum().item()\n"
    "print(cuda.get_current_device().name)\n")


@functools.lru_cache(maxsize=None)
def no_cuda_gpu():
    """Why the real-GPU tests cannot run here, or None where they can: a CUDA
    GPU that CuPy and Numba (not its simulator) both use, probed in a child
    process so the caller never initializes CUDA (its ranks are spawned)."""
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA driver on this machine (no nvidia-smi, no /dev/nvidiactl)"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE_GPU], env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "probing the GPU with CuPy and Numba took over 120 s"
    if proc.returncode != 0:
        return f"CuPy and Numba cannot use a CUDA GPU here: {proc.stderr.strip()[-300:]}"
    return None


class WorldError(RuntimeError):
    """A rank of a test world failed, hung or died."""

    def __init__(self, rank, message):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


def _child_main(rank, env, conn):
    os.environ.update(env)
    import commrt

    try:
        comm = commrt.init()
    except BaseException as exc:
        conn.send(("err", _pack_exc(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        fn, args, kwargs = task
        try:
            result = fn(comm, *args, **kwargs)
            conn.send(("ok", result))
        except BaseException as exc:
            conn.send(("err", _pack_exc(exc)))
    try:
        comm.close()
    finally:
        conn.close()


def _pack_exc(exc):
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        import pickle

        pickle.loads(pickle.dumps(exc))
        return exc, tb
    except Exception:
        return None, f"{type(exc).__name__}: {exc}\n{tb}"


class World:
    """N ranks in N spawned processes.  See the module docstring."""

    def __init__(self, size, transport="shm", env=None, timeout=60.0, rank_env=None):
        """env: extra environment of every rank; rank_env: {rank: {...}} on top,
        e.g. COMMRT_HOST_ID to place ranks on pretend hosts."""
        self.size = size
        self.transport = transport
        self.timeout = timeout
        self._env = dict(env or {})
        self._rank_env = {int(r): dict(e) for r, e in (rank_env or {}).items()}
        self._procs, self._conns, self.pids = [], [], []
        self._server = None
        self.broken = None

    @property
    def env(self):
        """The extra environment every rank was given (a copy)."""
        return dict(self._env)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        secret = new_secret()
        self._server = StoreServer(secret).start()
        host, port = self._server.address
        ctx = mp.get_context("spawn")
        for rank in range(self.size):
            env = {
                "COMMRT_RANK": str(rank), "COMMRT_WORLD_SIZE": str(self.size),
                "COMMRT_LOCAL_RANK": str(rank), "COMMRT_LOCAL_WORLD_SIZE": str(self.size),
                "COMMRT_STORE_ADDR": f"{host}:{port}", "COMMRT_SECRET": secret.hex(),
                "COMMRT_TRANSPORT": self.transport, "OMP_NUM_THREADS": "1",
                "NUMBA_NUM_THREADS": "1",
            }
            env.update(self._env)
            env.update(self._rank_env.get(rank, {}))
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child_main, args=(rank, env, child), daemon=True,
                               name=f"commrt-rank-{rank}")
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        for rank in range(self.size):
            kind, value = self._receive(rank, time.monotonic() + self.timeout)
            if kind != "ready":
                self.close()
                self._raise(rank, value)
            self.pids.append(value)
        return self

    def run(self, fn, *args, timeout=None, **kwargs):
        """Run fn(comm, *args, **kwargs) on every rank; results by rank."""
        if self.broken:
            raise WorldError(-1, f"world is broken: {self.broken}")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        results, first = [None] * self.size, None
        for rank in range(self.size):
            try:
                kind, value = self._receive(rank, deadline)
            except WorldError as exc:
                self.broken = str(exc)
                self.close()
                raise
            if kind == "ok":
                results[rank] = value
            elif first is None:
                first = (rank, value)
        if first is not None:
            self._raise(*first)
        return results

    def kill(self, rank, sig=signal.SIGKILL):
        """Kill one rank (for fault tests); the world is broken afterwards."""
        os.kill(self.pids[rank], sig)
        self.broken = f"rank {rank} was killed"

    def _receive(self, rank, deadline):
        conn, proc = self._conns[rank], self._procs[rank]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorldError(rank, "did not finish before the deadline (hung?)")
            if conn.poll(min(left, 0.2)):
                try:
                    return conn.recv()
                except EOFError:
                    proc.join(1.0)
                    raise WorldError(rank, f"died (exit code {proc.exitcode}; its stderr has "
                                           f"the cause)") from None
            if not proc.is_alive():
                if conn.poll(0):
                    continue
                proc.join(1.0)          # reap it, so the exit code is known
                raise WorldError(rank, f"died (exit code {proc.exitcode}; its stderr has the cause)")

    @staticmethod
    def _raise(rank, packed):
        exc, tb = packed
        if exc is None:
            raise WorldError(rank, tb)
        exc.add_note(f"-- raised on rank {rank}; remote traceback:\n{tb}")
        raise exc

    def close(self):
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._server is not None:
            self._server.close()
            self._server = None
