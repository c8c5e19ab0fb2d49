"""The world of the torch backend: built once per init_process_group, from the
c10d Store torch hands the backend, or from commrt's own store under commrt-launch.

Over a c10d store (torchrun, env://, tcp://, file://) commrt is exactly as
trusted as torch's own job: the store is unauthenticated, so the secret that
commrt's data-plane connections prove is published through it by rank 0
unless ``COMMRT_SECRET_FILE`` / ``COMMRT_SECRET`` gives every rank one (then
commrt's connections stay authenticated whatever the store).
"""
import datetime
import os

from commrt import config
from commrt.errors import BootstrapError, CommTimeoutError

_generation = [0]


class C10dStore:
    """commrt's Store interface (set, get, wait, check, add, delete) over a c10d Store."""

    def __init__(self, store, prefix="commrt/"):
        self._store, self._prefix = store, prefix

    def _k(self, key):
        return self._prefix + key

    def set(self, key, value):
        self._store.set(self._k(key), bytes(value))

    def get(self, key, timeout=None):
        if timeout is not None:
            self.wait([key], timeout)
        return bytes(self._store.get(self._k(key)))

    def wait(self, keys, timeout=None):
        keys = [keys] if isinstance(keys, str) else list(keys)
        try:
            if timeout is None:
                self._store.wait([self._k(k) for k in keys])
            else:
                self._store.wait([self._k(k) for k in keys],
                                 datetime.timedelta(seconds=max(0.001, float(timeout))))
        except RuntimeError as exc:       # DistStoreError: a timeout or a lost store
            raise CommTimeoutError(f"c10d store wait for {keys}", timeout=timeout,
                                   detail=str(exc)) from None

    def check(self, keys):
        keys = [keys] if isinstance(keys, str) else list(keys)
        return self._store.check([self._k(k) for k in keys])

    def add(self, key, delta=1):
        return self._store.add(self._k(key), delta)

    def delete(self, key):
        return self._store.delete_key(self._k(key))

    def close(self):
        pass


def under_commrt_launch(rank, size):
    """Whether commrt-launch started this rank as rank `rank` of `size`."""
    return (config.get("COMMRT_STORE_ADDR") is not None
            and os.environ.get("COMMRT_RANK") == str(rank)
            and os.environ.get("COMMRT_WORLD_SIZE") == str(size))


def build_world(store, rank, size, timeout_s):
    """The world Communicator of this process (rank of size) for the torch backend."""
    import commrt
    from commrt.comm import Communicator, _World
    from commrt.rendezvous.auth import load_secret, new_secret
    from commrt.rendezvous.bootstrap import _host_id
    from commrt.transport.connect import build_engine

    if under_commrt_launch(rank, size):
        return commrt.init(timeout=timeout_s)
    commrt.comm._configure_logging()
    gen = _generation[0]
    _generation[0] += 1
    cs = C10dStore(store, f"commrt/{gen}/")
    host = _host_id(os.environ)
    cs.set(f"host/{rank}", host.encode())
    if config.get("COMMRT_SECRET_FILE") or config.get("COMMRT_SECRET"):
        secret = load_secret()
    else:
        if rank == 0:
            cs.set("secret", new_secret())
        secret = cs.get("secret", timeout_s)
    try:
        cs.wait([f"host/{r}" for r in range(size)], timeout_s)
    except CommTimeoutError:
        missing = [r for r in range(size) if not cs.check([f"host/{r}"])]
        raise BootstrapError(f"rank {rank}: ranks {missing} never joined the job") from None
    hosts = [cs.get(f"host/{r}").decode() for r in range(size)]
    local = sum(1 for h in hosts if h == host)
    bind = config.get("COMMRT_BIND_ADDR")
    if len(set(hosts)) > 1 and not os.environ.get("COMMRT_BIND_ADDR"):
        from commrt.rendezvous.bootstrap import route_address

        bind = route_address(os.environ.get("MASTER_ADDR", "8.8.8.8"))
    engine, plan = build_engine(rank, size, cs, secret, host_id=host, local_size=local,
                                bind_addr=bind, timeout=timeout_s, generation=gen)
    world = _World(engine, None, None)
    comm = Communicator(engine, range(size), 0, hosts=[plan.host_of(r) for r in range(size)],
                        owner=world)
    comm.local_rank = sorted(r for r in range(size) if hosts[r] == host).index(rank)
    comm.local_size = local
    return comm
