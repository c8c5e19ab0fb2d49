"""The all-reduce algorithms' schedules, as the runtime runs them, in the simulator's form.

An algorithm module's ``schedule`` is the source (never a re-implementation
here): either the registry convention ``schedule(n, rank, count, root=0)``
-> steps of Msg ``(op, peer, lo, hi)``, or Rabenseifner's pairwise form
``schedule(p2, v, count, real)`` -> ``(partner, send lo, send hi, receive
lo, receive hi, reduce)`` per step, which becomes one send and one receive
(combine when it reduces) per step.  Algorithms without a schedule are not
simulated: ``steps`` says so.

A schedule that splits the buffer with ``bounds(count, parts)`` recomputes
that O(parts) list for every rank, which is O(N²) for a whole world
(Rabenseifner at 16,384 ranks: most of a 44 s run).  ``steps_of`` lends the
schedule's module a memoised ``bounds`` while it runs (the same function,
its results shared: schedules only read them), so the messages are the
same and the list is built once per world.
"""
import functools
import inspect

from commrt.sim.engine import ScheduleError


def names():
    """The all-reduce algorithms (the registry's, where there is one)."""
    try:
        from commrt.collectives import registry
    except ImportError:
        from commrt.collectives import allreduce
        return tuple(allreduce.NAMES)
    return registry.names("all_reduce")


def module(algo):
    try:
        from commrt.collectives import registry
    except ImportError:
        from commrt.collectives import allreduce
        return allreduce.module(algo)
    return registry.module("all_reduce", algo)


_module = module


def has_schedule(algo):
    return hasattr(_module(algo), "schedule")


def _memo_bounds(mod, fn):
    """fn with mod.bounds memoised while it runs (mod unchanged afterwards)."""
    plain = getattr(mod, "bounds", None)
    if plain is None:
        return fn
    memo = functools.lru_cache(maxsize=8)(plain)

    def run(r):
        mod.bounds = memo
        try:
            return fn(r)
        finally:
            mod.bounds = plain
    return run


def _keywords(sched, itemsize, per_node, n):
    """The keyword arguments this schedule takes: itemsize (segmenting ones) and
    groups (hierarchical: the nodes' blocks of ranks, as the engine places them)."""
    params = inspect.signature(sched).parameters
    kw = {}
    if "itemsize" in params:
        kw["itemsize"] = itemsize
    if "groups" in params:
        kw["groups"] = [list(range(h, min(h + per_node, n))) for h in range(0, n, per_node)]
    return kw


def steps_of(algo, n, count, itemsize=4, ranks_per_node=1):
    """A function rank -> that rank's steps for an n-rank all-reduce of count elements
    (ranks_per_node: the placement, for schedules that follow hosts).  Its
    ``rotation`` is True where the module declares its schedule turns with the
    rank (ROTATES) and the count splits evenly, so the engine may check rank 0."""
    mod = _module(algo)
    sched = getattr(mod, "schedule", None)
    if sched is None:
        raise ScheduleError(f"all-reduce {algo!r} has no schedule yet: it cannot be simulated")
    first = next(iter(inspect.signature(sched).parameters))
    if first != "p2":
        kw = _keywords(sched, itemsize, ranks_per_node, n)
        fn = _memo_bounds(mod, lambda r: [list(step) for step in sched(n, r, count, **kw)])
        fn.rotation = bool(getattr(mod, "ROTATES", False)) and n > 0 and count % n == 0
        return fn
    if n & (n - 1):
        raise ScheduleError(f"{algo}'s schedule covers its power-of-two core only; {n} ranks "
                            "is not a power of two")

    def pairwise(r):
        return [[("send", q, s0, s1), ("combine" if red else "recv", q, r0, r1)]
                for q, s0, s1, r0, r1, red in sched(n, r, count)]
    return _memo_bounds(mod, pairwise)
