"""Horovod's basics without torch: init, shutdown, ranks, process sets, timeline.

One Runtime per hvd.init(); it holds the communicator, the coordinator and
the registered process sets.  hvd.shutdown() stops the coordinator (and
closes the world if init made it); hvd.init() then starts afresh, as in
Horovod (elastic jobs re-initialise this way after a failure).
"""
import atexit
import threading

from commrt import config
from commrt.horovod._coordinator import Coordinator
from commrt.horovod._timeline import Timeline
from commrt.horovod.process_sets import ProcessSet, global_process_set

_lock = threading.RLock()
_current = None
_atexit_registered = False


class Runtime:
    def __init__(self, comm, owned):
        self.comm, self.owned = comm, owned
        self.rank, self.size = comm.rank, comm.size
        hosts = [comm.host_of(r) for r in range(comm.size)]
        mine = hosts[self.rank]
        local = [r for r in range(self.size) if hosts[r] == mine]
        self.local_rank, self.local_size = local.index(self.rank), len(local)
        order = list(dict.fromkeys(hosts))
        local_rank_of = {r: [q for q in range(self.size) if hosts[q] == hosts[r]].index(r)
                         for r in range(self.size)}
        same = [r for r in range(self.size) if local_rank_of[r] == self.local_rank]
        self.cross_rank, self.cross_size = same.index(self.rank), len(same)
        self.homogeneous = len({hosts.count(h) for h in order}) == 1
        path = config.get("HOROVOD_TIMELINE")
        self.timeline = None
        if path and self.rank == 0:
            self.timeline = Timeline(path, config.get("HOROVOD_TIMELINE_MARK_CYCLES"))
        self.coordinator = Coordinator(comm, self.timeline)
        self.process_sets = {0: global_process_set}
        self._counters = {}

    def next_name(self, kind, set_id=0):
        """The name of an unnamed operation: counted per process set, so that the ops
        members of one set run alone leave the others' names in step."""
        n = self._counters.get(set_id, 0) + 1
        self._counters[set_id] = n
        return f"{kind}.noname.{n}" if set_id == 0 else f"{kind}.noname.{set_id}.{n}"

    def add_process_set(self, ps):
        if ps.process_set_id is not None and self.process_sets.get(ps.process_set_id) is ps:
            raise ValueError(f"{ps} is already registered")
        bad = [r for r in ps.ranks if not 0 <= r < self.size]
        if bad or not ps.ranks:
            raise ValueError(f"process set ranks must be ranks of 0..{self.size - 1}, got "
                             f"{ps.ranks}")
        for other in self.process_sets.values():
            if other.process_set_id != 0 and other.ranks == ps.ranks:
                raise ValueError(f"a process set with ranks {ps.ranks} is already registered")
        op = self.coordinator.submit("add_set", self.next_name("add_process_set"),
                                     ("add_set", tuple(ps.ranks)), None)
        ps.process_set_id = self.coordinator.wait(op)
        self.process_sets[ps.process_set_id] = ps
        return ps

    def remove_process_set(self, ps):
        if ps.process_set_id in (None, 0) or self.process_sets.get(ps.process_set_id) is not ps:
            return False
        op = self.coordinator.submit("remove_set", self.next_name("remove_process_set"),
                                     ("remove_set", ps.process_set_id), None)
        self.coordinator.wait(op)
        del self.process_sets[ps.process_set_id]
        ps.process_set_id = None
        return True

    def close(self):
        try:
            self.coordinator.stop()
        finally:
            if self.timeline is not None:
                self.timeline.close()
                self.timeline = None
            if self.owned:
                self.comm.close()


def init(comm=None, process_sets=None):
    """Start Horovod on `comm` (a commrt Communicator, a list of world ranks, or None:
    the job from the environment).  A second init() without shutdown() is a no-op."""
    global _current, _atexit_registered
    with _lock:
        if _current is not None:
            return
        comm, owned = _communicator(comm)
        _current = Runtime(comm, owned)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        sets = process_sets or []
        if sets == "dynamic":
            sets = []
        for ps in sets:
            _current.add_process_set(ps if isinstance(ps, ProcessSet) else ProcessSet(ps))


def _communicator(comm):
    import commrt

    if comm is None or isinstance(comm, (list, tuple)):
        generation = None
        if config.get("HOROVOD_ELASTIC"):
            from commrt.horovod import elastic

            # every member of a generation builds its mesh under that generation's
            # store prefix, whether it joined earlier generations or not
            generation = elastic.take_assignment()
        world = commrt.init(generation=generation)
        if comm is None:
            return world, True
        sub = world.new_group([int(r) for r in comm])
        if sub is None:
            world.close()
            raise ValueError(f"rank {world.rank} is not in the ranks given to init: {list(comm)}")
        return _Owned(sub, world), True
    return comm, False


class _Owned:
    """A sub-communicator whose world init() made (closed with it)."""

    def __init__(self, sub, world):
        self._sub, self._world = sub, world

    def __getattr__(self, name):
        return getattr(self._sub, name)

    def close(self):
        self._world.close()


def shutdown():
    global _current
    with _lock:
        rt, _current = _current, None
    if rt is not None:
        rt.close()


def current():
    rt = _current
    if rt is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return rt


def current_or_none():
    return _current


def is_initialized():
    return _current is not None


def start_timeline(file_path, mark_cycles=False):
    """Record Horovod's operations to file_path (a Chrome trace; rank 0 writes it, as in
    Horovod)."""
    rt = current()
    if rt.timeline is not None:
        rt.timeline.close()
    rt.timeline = Timeline(file_path, mark_cycles) if rt.rank == 0 else None
    rt.coordinator.timeline = rt.timeline


def stop_timeline():
    rt = current()
    tl, rt.timeline = rt.timeline, None
    rt.coordinator.timeline = None
    if tl is not None:
        tl.close()
