"""Elastic training, worker side (torch-free): the loop, the state, the assignment.

    @hvd.elastic.run
    def train(state):
        ...               # state.commit() now and then
    train(hvd.elastic.TorchState(model, optimizer, epoch=0))

``run`` syncs the state from rank 0 and calls the function.  When a peer dies
the collectives raise HorovodInternalError: the state goes back to its last
commit, Horovod shuts down and initialises again, now in the job that the
launcher's elastic driver (commrt.launcher.elastic) re-formed from the
surviving workers and the free slots its host discovery reports; the loop
syncs and calls the function again.  When the driver adds workers,
``commit`` (``check_host_updates``) raises HostsUpdatedInterrupt on every
rank at once, and the job re-forms with them in the same way.

The driver publishes each generation in the job's store:
``commrt/elastic/gen`` (the latest number) and, per worker,
``commrt/elastic/<gen>/<worker id>`` = "rank size local_rank local_size
cross_rank cross_size host".  ``take_assignment`` (called by hvd.init() in an
elastic job) waits for a generation newer than the last one this process
joined and puts its place in the environment for commrt.init().
"""
import functools
import os
import time

from commrt import config
from commrt.horovod.errors import HorovodInternalError, HostsUpdatedInterrupt

GEN_KEY = "commrt/elastic/gen"
_last_gen = -1
_store = None


def assignment_key(gen, worker_id):
    return f"commrt/elastic/{gen}/{worker_id}"


def _open_store():
    global _store
    if _store is None:
        from commrt.rendezvous import auth
        from commrt.rendezvous.store import Store

        addr = os.environ["COMMRT_STORE_ADDR"]
        host, _, port = addr.rpartition(":")
        fd, path = os.environ.get("COMMRT_SECRET_FD"), os.environ.get("COMMRT_SECRET_FILE")
        if fd:                                   # an inherited descriptor: read, keep offset
            text = os.pread(int(fd), 4096, 0).decode()
        elif path:
            text = open(path).read()
        else:
            text = os.environ["COMMRT_SECRET"]
        _store = Store(host.strip("[]"), int(port), auth.parse_secret(text))
    return _store


def latest_generation():
    """The newest generation the driver has published (-1 outside an elastic job)."""
    if not config.get("HOROVOD_ELASTIC"):
        return -1
    return int(_open_store().get(GEN_KEY, timeout=config.get("HOROVOD_ELASTIC_TIMEOUT")))


def current_generation():
    return _last_gen


def take_assignment():
    """Wait for a generation newer than the last one joined that includes this worker;
    set COMMRT_RANK & co. from it -> the generation, for commrt.init(generation=...)."""
    global _last_gen
    store = _open_store()
    worker = os.environ["COMMRT_ELASTIC_WORKER_ID"]
    deadline = time.monotonic() + config.get("HOROVOD_ELASTIC_TIMEOUT")
    while True:
        gen = int(store.get(GEN_KEY, timeout=max(1.0, deadline - time.monotonic())))
        if gen > _last_gen and store.check([assignment_key(gen, worker)]):
            break
        if time.monotonic() > deadline:
            raise HorovodInternalError(f"elastic worker {worker}: no generation after "
                                       f"{_last_gen} includes it")
        time.sleep(0.05)
    fields = store.get(assignment_key(gen, worker)).decode().split()
    rank, size, lrank, lsize, crank, csize = (int(f) for f in fields[:6])
    env = {"COMMRT_RANK": rank, "COMMRT_WORLD_SIZE": size, "COMMRT_LOCAL_RANK": lrank,
           "COMMRT_LOCAL_WORLD_SIZE": lsize, "RANK": rank, "WORLD_SIZE": size,
           "LOCAL_RANK": lrank, "LOCAL_WORLD_SIZE": lsize, "HOROVOD_RANK": rank,
           "HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": lrank, "HOROVOD_LOCAL_SIZE": lsize,
           "HOROVOD_CROSS_RANK": crank, "HOROVOD_CROSS_SIZE": csize}
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ["COMMRT_HOST_ID"] = fields[6]
    _last_gen = gen
    return gen


class State:
    """What an elastic job keeps across a re-formation: save/restore/sync."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._known_gen = current_generation()

    def register_reset_callbacks(self, callbacks):
        """Functions called after each re-formation (e.g. to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._known_gen = current_generation()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state (restored after a failure), then check for new hosts."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank when the driver formed a newer
        generation (rank 0 asks the store; everyone takes its answer)."""
        latest = latest_generation() if self._rank() == 0 else None
        known, latest = self._bcast_object((current_generation(), latest))
        if latest is not None and latest > known:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        pass


class ObjectState(State):
    """State made of picklable attributes: ObjectState(bcast, rank, epoch=0, batch=0)."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: getattr(self, k) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


def run_fn(func, reset):
    """Horovod's elastic loop around func(state, ...); reset() re-forms the job."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            reset()
            state.on_reset()
    return wrapper
