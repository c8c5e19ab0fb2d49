"""Horovod's process sets: operations restricted to a subset of the ranks.

    even = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[even])            # or later: hvd.add_process_set([0, 2])
    hvd.allreduce(t, process_set=even)

Every rank registers every set in the same order (non-members too), as in
Horovod; a set's operations negotiate among its members only, on
communicators of their own.
"""


class ProcessSet:
    """A set of Horovod ranks (ranks of the communicator hvd.init was given)."""

    def __init__(self, ranks):
        if hasattr(ranks, "world_ranks") and hasattr(ranks, "size"):
            raise TypeError("give a ProcessSet its ranks as a list of ints")
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"process set ranks must be distinct, got {ranks}")
        self.ranks = sorted(ranks)
        self.process_set_id = None

    def _runtime(self):
        from commrt.horovod import _runtime

        rt = _runtime.current()
        if self.process_set_id is None:
            raise ValueError("this process set is not registered: pass it to hvd.init() or "
                             "hvd.add_process_set()")
        return rt

    def size(self):
        self._runtime()
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set (-1 if it is not a member)."""
        rt = self._runtime()
        return self.ranks.index(rt.rank) if rt.rank in self.ranks else -1

    def included(self):
        rt = self._runtime()
        return rt.rank in self.ranks

    def __eq__(self, other):
        return (isinstance(other, ProcessSet) and self.ranks == other.ranks
                and self.process_set_id == other.process_set_id)

    def __hash__(self):
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """All ranks; its ranks follow the current hvd.init()."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        from commrt.horovod import _runtime

        rt = _runtime.current_or_none()
        return list(range(rt.size)) if rt is not None else []


global_process_set = _GlobalProcessSet()


def add_process_set(process_set):
    """Register a process set on every rank (each rank calls it, in the same order)
    -> the ProcessSet, now with its id."""
    from commrt.horovod import _runtime

    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    return _runtime.current().add_process_set(process_set)


def remove_process_set(process_set):
    """Unregister a process set on every rank -> True if it was registered."""
    from commrt.horovod import _runtime

    return _runtime.current().remove_process_set(process_set)
