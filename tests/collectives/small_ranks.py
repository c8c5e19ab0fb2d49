"""Rank-side functions of the small all-reduce path tests (collectives/_small.py)."""
import json
import os
import time

import numpy as np

import commrt.collectives as C
from commrt.errors import CollectiveMismatchError, PeerLostError

from coll_ranks import check, data, digest, reference


def plans(comm):
    return len(comm.state["collectives"].small)


def repeated(comm, seed, n, dtype, op, calls=4, general_ranks=()):
    """`calls` all-reduces of fresh data with the automatic choice; ranks in
    general_ranks pass timeout= (which keeps them on the general path).  Returns
    (digests, whether this call has a plan)."""
    out = []
    for i in range(calls):
        x = data(seed + i, comm.rank, n, dtype, op)
        if x.ndim == 1 and n == 6:
            x = x.reshape(2, 3)              # any C-contiguous shape
        want, tol = reference(seed + i, comm.size, n, dtype, op)
        kw = {"timeout": 30} if comm.rank in general_ranks else {}
        assert C.all_reduce(comm, x, op, **kw) is x
        check(x.reshape(-1), want, tol, f"small all_reduce {op} {dtype} n={n} call {i}")
        out.append(digest(x))
    return out, (x.shape, x.dtype, op) in comm.state["collectives"].small


def late_rank(comm, late_s, n):
    """Warm the plan, then rank 1 calls late_s seconds after the others (beyond
    the probe interval).  Returns (digest of the result, whether it was right)."""
    x = data(3, comm.rank, n, "float64", "SUM")
    for _ in range(2):
        C.all_reduce(comm, x.copy(), "SUM")
    C.barrier(comm)
    if comm.rank == 1:
        time.sleep(late_s)
    C.all_reduce(comm, x, "SUM")
    want, tol = reference(3, comm.size, n, "float64", "SUM")
    check(x, want, tol, "late all_reduce")
    return digest(x), (x.shape, x.dtype, "SUM") in comm.state["collectives"].small


def buffer_released(comm, n):
    """After planned calls, the plan holds no reference to the caller's buffer."""
    import weakref

    x = np.ones(n, np.float32)
    for _ in range(3):
        C.all_reduce(comm, x, "SUM")
    planned = (x.shape, x.dtype, "SUM") in comm.state["collectives"].small
    ref = weakref.ref(x)
    del x
    C.barrier(comm)
    assert planned, "the call took no plan"
    return ref() is None


def traffic(comm, n):
    x = np.ones(n, np.float32)
    for _ in range(2):
        C.all_reduce(comm, x, "MAX")
    C.barrier(comm)
    before = sum(v["bytes_sent"] for v in comm.stats().values())
    C.all_reduce(comm, x, "MAX")
    after = sum(v["bytes_sent"] for v in comm.stats().values())
    C.barrier(comm)
    return after - before, plans(comm)


def mismatch(comm, case):
    """Warm the plans on a fresh group, then make a mismatched call."""
    sub = C.new_group(comm, list(range(comm.size)))
    r = comm.rank
    for _ in range(2):
        C.all_reduce(sub, np.ones(4, np.float32), "SUM")
        C.all_reduce(sub, np.ones(4, np.float32), "MAX")
        C.all_reduce(sub, np.ones(5, np.float32), "SUM")
    # A fast rank's abort of `sub` must not reach a slow one still warming up (or
    # still leaving a barrier of `sub`): synchronise on the parent's context.
    C.barrier(comm)
    t0 = time.monotonic()
    try:
        if case == "op":            # both on planned calls
            C.all_reduce(sub, np.ones(4, np.float32), "SUM" if r == 0 else "MAX")
        elif case == "count":       # both planned, counts differ
            C.all_reduce(sub, np.ones(4 + (r == 1), np.float32), "SUM")
        elif case == "kind":        # a planned all-reduce against a broadcast
            if r == 0:
                C.all_reduce(sub, np.ones(4, np.float32), "SUM")
            else:
                C.broadcast(sub, np.ones(4, np.float32), 0)
        C.barrier(sub, timeout=30)
    except CollectiveMismatchError as exc:
        return "raised", str(exc), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def dead_peer(comm, outdir):
    """The last rank dies after warming the plan; the others must see PeerLostError
    (written to outdir/<rank>.json: the world reports the dead rank)."""
    x = np.ones(2, np.float64)
    for _ in range(3):
        C.all_reduce(comm, x, "SUM")
    t0 = time.monotonic()
    try:
        # A rank slow to leave this barrier may hear of the death in it: rank 2,
        # already in the all-reduce, aborts everywhere when it sees rank 3 gone.
        C.barrier(comm)
        if comm.rank == comm.size - 1:
            os._exit(3)
        t0 = time.monotonic()
        C.all_reduce(comm, x, "SUM")
        err = None
    except PeerLostError as exc:
        err = str(exc)
    path = os.path.join(outdir, f"{comm.rank}.json")
    with open(path + ".part", "w") as f:
        json.dump([err, time.monotonic() - t0, plans(comm)], f)
    os.replace(path + ".part", path)        # whole, for a reader polling for it


def barrier_holds(comm, rounds=3):
    """Rank r enters each barrier r·30 ms late; nobody may leave before the last
    one entered.  Returns (entered, left) times per round (one monotonic clock
    for the whole host) and whether the barrier took the small path."""
    out = []
    C.barrier(comm)
    for k in range(rounds):
        time.sleep(0.03 * ((comm.rank + k) % comm.size))
        entered = time.monotonic()
        C.barrier(comm)
        out.append((entered, time.monotonic()))
    return out, "barrier" in comm.state["collectives"].small


def barrier_against_all_reduce(comm):
    """A planned barrier on rank 0 against a planned all-reduce elsewhere."""
    sub = C.new_group(comm, list(range(comm.size)))
    for _ in range(2):
        C.barrier(sub)
        C.all_reduce(sub, np.ones(4, np.float32), "SUM")
    C.barrier(comm)         # as in mismatch(): all warmed up before the mismatch
    t0 = time.monotonic()
    try:
        if comm.rank == 0:
            C.barrier(sub)
        else:
            C.all_reduce(sub, np.ones(4, np.float32), "SUM")
        C.barrier(sub, timeout=30)
    except CollectiveMismatchError as exc:
        return "raised", str(exc), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def bad_arguments(comm):
    """Wrong arguments to a planned call get the general path's clear errors, and the
    next call still works (nothing was sent)."""
    x = np.ones(3, np.float32)
    for _ in range(2):
        C.all_reduce(comm, x, "SUM")
    errors = []
    for bad in (lambda: C.all_reduce(comm, x, ["SUM"]),          # unhashable op
                lambda: C.all_reduce(comm, x, "NOPE"),
                lambda: C.all_reduce(comm, np.ones(6, np.float32)[::2], "SUM"),
                lambda: C.all_reduce(comm, np.ones(3, np.float32).setflags(write=False)
                                     or np.frombuffer(b"\0" * 12, np.float32), "SUM")):
        try:
            bad()
            errors.append(None)
        except (ValueError, TypeError) as exc:
            errors.append(type(exc).__name__ + ": " + str(exc))
    y = np.full(3, comm.rank, np.float32)
    C.all_reduce(comm, y, "SUM")
    return errors, y.tolist()


def switch_interval(comm):
    """sys.getswitchinterval() before and after the first async collective."""
    import sys

    sub = C.new_group(comm, list(range(comm.size)))  # a fresh worker thread
    before = sys.getswitchinterval()
    C.all_reduce(sub, np.ones(4, np.float32), "SUM", async_op=True).wait(30)
    return before, sys.getswitchinterval()


def memo_switches(comm, rounds=3):
    """all_reduce remembers the plan it ran last: calls that alternate op, dtype
    and shape, and one buffer whose dtype and shape are changed in place, must
    each get their own plan's result (never the last plan's)."""
    n, r = comm.size, comm.rank + 1
    total = n * (n + 1) // 2
    out = []
    for _ in range(rounds):
        a = np.full(4, r, np.float32)
        C.all_reduce(comm, a, "SUM")
        out.append(a.tolist() == [total] * 4)
        a[:] = r
        C.all_reduce(comm, a, "MAX")
        out.append(a.tolist() == [n] * 4)
        b = np.full(4, r, np.float64)
        C.all_reduce(comm, b, "SUM")
        out.append(b.tolist() == [total] * 4)
        c = np.full(4, r, np.int32)
        C.all_reduce(comm, c, "SUM")
        out.append(c.tolist() == [total] * 4)
        c.dtype = np.float32                 # the same object, another dtype
        c[:] = float(r)
        C.all_reduce(comm, c, "SUM")
        out.append(c.tolist() == [float(total)] * 4)
        c.shape = (2, 2)                     # the same object, another shape
        c[...] = r
        C.all_reduce(comm, c, "SUM")
        out.append(c.tolist() == [[float(total)] * 2] * 2)
        i = np.full(4, r, np.int32)
        C.all_reduce(comm, i, "SUM")
        out.append(i.tolist() == [total] * 4)
        i2 = i.view(np.float32)              # same bytes seen as float32: not int's plan
        i2[:] = float(r)
        C.all_reduce(comm, i2, "SUM")
        out.append(i2.tolist() == [float(total)] * 4)
    return out


def async_planned(comm, seed, n, dtype, op, calls=4):
    """Async all-reduces (waited together, with a blocking one between) once their
    plan exists: exact, bitwise equal across ranks, and run along the plan by
    the worker (_async_plan).  Returns (digests, how many ran on the plan)."""
    from unittest import mock

    from commrt.collectives import _small

    x = data(seed, comm.rank, n, dtype, op)
    C.all_reduce(comm, x, op)                            # the plan, made on this thread
    ran = []
    real = _small.finish_go

    def counted(*a):
        ran.append(1)
        return real(*a)
    out = []
    with mock.patch.object(_small, "finish_go", counted):
        for i in range(calls):
            xs = [data(seed + i + k, comm.rank, n, dtype, op) for k in range(3)]
            reqs = [C.all_reduce(comm, xs[0], op, async_op=True),
                    C.all_reduce(comm, xs[1], op, async_op=True)]
            C.all_reduce(comm, xs[2], op)                # a blocking one behind them
            for r in reqs:
                r.wait(30)
            for k, xk in enumerate(xs):
                want, tol = reference(seed + i + k, comm.size, n, dtype, op)
                check(xk.reshape(-1), want, tol, f"async planned {op} {dtype} n={n} {i}/{k}")
                out.append(digest(xk))
    return out, len(ran)


def async_mismatch(comm):
    """An async planned all-reduce against a rank calling it with another op: the
    mismatch is raised by wait() on every rank, not a hang."""
    sub = C.new_group(comm, list(range(comm.size)))      # the mismatch aborts sub only
    x = np.ones(4, np.float32)
    for _ in range(2):
        C.all_reduce(sub, x, "SUM")
        C.all_reduce(sub, x, "MAX")
    # a fast rank's abort of sub must not reach a slow one still leaving a barrier
    # of sub: synchronise on the parent's context (as mismatch() does)
    C.barrier(comm)
    req = C.all_reduce(sub, x, "SUM" if comm.rank == 0 else "MAX", async_op=True)
    try:
        req.wait(30)
    except CollectiveMismatchError as exc:
        return "raised", str(exc)
    return "no error", ""
