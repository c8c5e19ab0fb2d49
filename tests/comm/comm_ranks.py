"""Rank functions of the communicator reliability tests (importable by spawned ranks)."""
import os
import signal
import threading
import time

import numpy as np

import commrt
from commrt.errors import (CommError, CommTimeoutError, ConcurrentCollectiveError,
                           PeerLostError)


def _catch(fn):
    t0 = time.monotonic()
    try:
        fn()
    except CommError as exc:
        return {"type": type(exc).__name__, "msg": str(exc), "code": int(exc.code),
                "rank": getattr(exc, "rank", getattr(exc, "peer", None)),
                "s": time.monotonic() - t0}
    return None


# -- the thread rule -------------------------------------------------------------------
def second_thread_enters(comm, nbytes, kind):
    """Thread 'holder' is inside a collective (rank 1 joins it 1.5 s late); a second
    thread entering a collective of the same communicator must fail at once, naming
    both threads, and the holder's call must still give the right result."""
    n = nbytes // 8
    x = np.full(n, comm.rank + 1.0)
    for _ in range(3):                      # warm up: the small path's prepared plans
        comm.all_reduce(np.ones(n))
        comm.barrier()
    out = {}
    if comm.rank == 1:
        time.sleep(1.5)
        if kind == "all_reduce":
            comm.all_reduce(x)
        else:
            comm.barrier()
        out["value"] = float(x[0])
        return out
    holder_in = threading.Event()

    def hold():
        holder_in.set()
        if kind == "all_reduce":
            comm.all_reduce(x)
        else:
            comm.barrier()
        out["value"] = float(x[0])

    t = threading.Thread(target=hold, name="holder")
    t.start()
    holder_in.wait(10)
    time.sleep(0.3)                         # the holder is waiting for rank 1 now
    errs = {}
    for what, fn in (("all_reduce", lambda: comm.all_reduce(np.ones(n))),
                     ("barrier", comm.barrier),
                     ("broadcast", lambda: comm.broadcast(np.ones(4))),
                     ("async", lambda: comm.all_reduce(np.ones(4), async_op=True))):
        t0 = time.monotonic()
        try:
            fn()
            errs[what] = None
        except ConcurrentCollectiveError as exc:
            errs[what] = (str(exc), time.monotonic() - t0)
    t.join(30)
    out["errors"] = errs
    out["me"] = threading.current_thread().name
    return out


def async_from_one_thread_is_fine(comm):
    """async_op=True queues on the worker; a blocking call from the same thread
    meanwhile is not a violation, and results come in call order."""
    xs = [np.full(1000, float(i + comm.rank)) for i in range(8)]
    reqs = [comm.all_reduce(x, async_op=True) for x in xs]
    y = np.full(4, 1.0)
    comm.all_reduce(y)
    for r in reqs:
        r.wait(30)
    return [float(x[0]) for x in xs] + [float(y[0])]


def threads_with_own_subcomms(comm, iters):
    """Each thread its own communicator (split): collectives run concurrently and right."""
    subs = [comm.split(0) for _ in range(2)]
    results = {}

    def work(i):
        vals = []
        for k in range(iters):
            x = np.full(3, float(comm.rank + k + i))
            subs[i].all_reduce(x)
            vals.append(float(x[0]))
        results[i] = vals

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return results


def threads_hammer_one_comm(comm, iters):
    """Two threads on one communicator: each call either gives the right sum or
    raises a clear error; never a wrong result."""
    results = {"wrong": 0, "ok": 0, "errors": set()}
    expect = sum(range(1, comm.size + 1))

    def work():
        for _ in range(iters):
            x = np.full(2, comm.rank + 1.0)
            try:
                comm.all_reduce(x, timeout=20)
            except CommError as exc:
                results["errors"].add(type(exc).__name__)
                if not isinstance(exc, ConcurrentCollectiveError):
                    return
                continue
            if x[0] == expect and x[1] == expect:
                results["ok"] += 1
            else:
                results["wrong"] += 1

    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    results["errors"] = sorted(results["errors"])
    return results


# -- abort -----------------------------------------------------------------------------
def abort_by_rank1(comm):
    """Rank 1 aborts; the others are blocked in a receive from it and in a collective."""
    sub = comm.split(0)
    # a rank still waiting for the barrier's last message when rank 1 aborts sees
    # the abort there (a loaded host): its later calls see it too, as checked below
    _catch(lambda: comm.barrier(timeout=30))
    out = {}
    if comm.rank == 1:
        time.sleep(0.5)
        comm.abort("stop now")
    elif comm.rank == 0:
        out["recv"] = _catch(lambda: comm.recv(np.zeros(4), 1, 3, timeout=30))
    else:
        out["coll"] = _catch(lambda: comm.all_reduce(np.ones(4), timeout=30))
    out["later_send"] = _catch(lambda: comm.send(np.ones(4), (comm.rank + 1) % comm.size, 4,
                                                 timeout=10))
    out["later_irecv"] = _catch(lambda: comm.irecv(np.zeros(4), 0, 5).wait(10))
    out["later_coll"] = _catch(lambda: comm.all_reduce(np.ones(4), timeout=10))
    out["later_barrier"] = _catch(lambda: comm.barrier(timeout=10))
    x = np.ones(2)
    sub.all_reduce(x, timeout=30)             # a sub-communicator is not affected
    out["sub"] = float(x[0])
    return out


def abort_heard_through_a_relay(comm):
    """Rank 1 aborts the communicator, its message reaching rank 0 only (as when
    its message to rank 2 is slow); ranks 0 and 2 wait in an all-reduce, so rank
    2 hears the abort from rank 0's relay first.  Then every later
    point-to-point and collective operation must fail on ranks 0 and 2 too."""
    from commrt.errors import FailureCode

    comm.barrier(timeout=30)
    out = {}
    if comm.rank == 1:
        time.sleep(0.3)
        comm._abort("stop now", ranks=[0], code=FailureCode.ABORTED, culprit=comm.rank,
                    pair=True)
        return out
    out["coll"] = _catch(lambda: comm.all_reduce(np.ones(4), timeout=30))
    peer = 2 - comm.rank
    out["later_send"] = _catch(lambda: comm.send(np.ones(4), peer, 4, timeout=10))
    out["later_recv"] = _catch(lambda: comm.recv(np.zeros(4), peer, 5, timeout=10))
    out["later_coll"] = _catch(lambda: comm.barrier(timeout=10))
    return out


def one_rank_times_out(comm):
    """Rank 0's all-reduce times out (the others call 3 s later with a 60 s deadline):
    the others must fail at once with the same error, not carry on."""
    comm.barrier()
    x = np.ones(1 << 16)
    if comm.rank == 0:
        r = _catch(lambda: comm.all_reduce(x, timeout=0.5))
    else:
        time.sleep(3.0)
        r = _catch(lambda: comm.all_reduce(x, timeout=60))
    r["later"] = _catch(lambda: comm.barrier(timeout=10))
    return r


def rank2_dies_in_collectives(comm, nbytes):
    """Rank 2 is SIGKILLed between collectives; every survivor must name rank 2,
    not a rank that left after seeing rank 2 die."""
    x = np.ones(nbytes // 8)
    for i in range(200):
        if comm.rank == 2 and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(x, timeout=30)
        except CommError as exc:
            r = {"type": type(exc).__name__, "rank": getattr(exc, "rank", None), "msg": str(exc),
                 "i": i}
            if comm.rank == 0:
                comm.close()                # leave at once, as a rank that exits does
            return r
    return {"type": None}


def told_rank_leaves(comm):
    """Rank 2 fails first, and its abort reaches rank 1 only (as if its channel to
    rank 0 were slow).  Rank 1 fails its broadcast on that abort and leaves at once;
    rank 0 waits in the broadcast on rank 1 alone.  Rank 0 must name rank 2 -- it
    hears the abort from rank 1 before rank 1's departure -- never rank 1.
    Rank 2 stays until rank 0 has its answer (its own departure would also
    name it, by chance)."""
    from commrt.errors import FailureCode

    comm.barrier()
    x = np.ones(4)
    if comm.rank == 2:
        for q in (0, 1):                             # both are out of the barrier
            comm.recv(np.zeros(1), q, 8, timeout=30)
        comm._coll._abort("rank 2 failed first", ranks=[1], code=FailureCode.ERROR, culprit=2)
        comm.recv(np.zeros(1), 0, 9, timeout=30)
        return None
    comm.send(np.zeros(1), 2, 8)
    if comm.rank == 1:
        end = time.monotonic() + 30
        while comm.channel.aborted() is None and time.monotonic() < end:
            comm._engine.progress()                  # take the abort in
            time.sleep(0.01)
        r = _catch(lambda: comm.broadcast(x, root=1, algorithm="binomial", timeout=30))
        comm.close()                                 # leave at once
        return r
    r = _catch(lambda: comm.broadcast(x, root=1, algorithm="binomial", timeout=30))
    comm.send(np.zeros(1), 2, 9)
    return r


# -- lifetime --------------------------------------------------------------------------
def use_after_close(comm):
    """Every operation after close raises CommError('... closed'), never a crash."""
    out = {}
    peer = (comm.rank + 1) % comm.size
    # never sent: pending at close (from any source: the peer's own close does not end it)
    pending = comm.irecv(np.zeros(4), commrt.ANY_SOURCE, 77)
    sub = comm.split(0)
    x = np.ones(4)
    comm.all_reduce(x)                                    # prepared plans exist
    comm.all_reduce(x)
    comm.barrier()
    comm.barrier()
    comm.close()
    ops = {
        "send": lambda: comm.send(x, peer),
        "isend": lambda: comm.isend(x, peer),
        "recv": lambda: comm.recv(x, peer, timeout=1),
        "irecv": lambda: comm.irecv(x, peer),
        "sendrecv": lambda: comm.sendrecv(x, peer, np.zeros(4), peer, timeout=1),
        "send_obj": lambda: comm.send_obj({"a": 1}, peer),
        "all_reduce": lambda: comm.all_reduce(x),
        "all_reduce_big": lambda: comm.all_reduce(np.ones(1 << 17)),
        "barrier": comm.barrier,
        "broadcast": lambda: comm.broadcast(x),
        "all_gather": lambda: comm.all_gather(np.zeros(4 * comm.size), x),
        "async": lambda: comm.all_reduce(x, async_op=True).wait(5),
        "split": lambda: comm.split(0),
        "new_group": lambda: comm.new_group([0]),
        "stats": comm.stats,
        "memory_info": comm.memory_info,
        "abort": lambda: comm.abort("x"),
        "wait_pending": lambda: pending.wait(1),
        "test_pending": pending.test,
        "sub_send": lambda: sub.send(x, peer),
        "sub_all_reduce": lambda: sub.all_reduce(x),
        "sub_barrier": sub.barrier,
    }
    for name, fn in ops.items():
        try:
            fn()
            out[name] = "no error"
        except CommError as exc:
            out[name] = str(exc) if "closed" in str(exc) else f"{type(exc).__name__}: {exc}"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out[name] = f"{type(exc).__name__}: {exc}"
    comm.close()                                          # idempotent
    return out


def subcomm_close_leaves_world(comm):
    sub = comm.split(0)
    x = np.ones(2)
    sub.all_reduce(x)
    sub.close()
    errs = {}
    for name, fn in (("send", lambda: sub.send(x, 0)), ("all_reduce", lambda: sub.all_reduce(x)),
                     ("barrier", sub.barrier), ("stats", sub.stats)):
        try:
            fn()
            errs[name] = None
        except CommError as exc:
            errs[name] = str(exc)
    y = np.ones(2)
    comm.all_reduce(y)                                    # the world is still open
    return errs, float(y[0])


# -- cancel ----------------------------------------------------------------------------
def timed_out_recv_loses_nothing(comm):
    """A blocking recv that timed out is unposted: the next message goes to the retry."""
    if comm.rank == 1:
        comm.recv(np.zeros(1), 0, 9, timeout=30)          # rank 0 has timed out once
        comm.send(np.full(4, 7.0), 0, 3)
        return None
    buf = np.zeros(4)
    timed_out = _catch(lambda: comm.recv(buf, 1, 3, timeout=0.2))
    comm.send(np.zeros(1), 1, 9)
    st = comm.recv(buf, 1, 3, timeout=20)
    return timed_out["type"], buf.tolist(), st.nbytes


def interrupted_recv_loses_nothing(comm):
    """A blocking recv interrupted by Ctrl-C (SIGINT) is unposted too."""
    if comm.rank == 1:
        comm.recv(np.zeros(1), 0, 9, timeout=30)
        comm.send(np.full(4, 5.0), 0, 3)
        return None
    buf = np.zeros(4)
    # Ctrl-C raises KeyboardInterrupt as in a foreground process: a job started
    # in the background by a shell without job control inherits SIGINT ignored
    # (the suite run as `bash script &` failed here after 20 s)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        comm.recv(buf, 1, 3, timeout=20)
        got = "returned"
    except KeyboardInterrupt:
        got = "interrupted"
    comm.send(np.zeros(1), 1, 9)
    comm.recv(buf, 1, 3, timeout=20)
    return got, buf.tolist()


def cancel_semantics(comm):
    """Request.cancel: an unmatched receive is removed (its wait raises
    CancelledError, the message goes to the next receive); a matched one completes
    normally; a send is never cancelled."""
    from commrt.errors import CancelledError

    peer = 1 - comm.rank
    if comm.rank == 1:
        comm.recv(np.zeros(1), 0, 9, timeout=30)
        comm.send(np.full(2, 1.0), 0, 4)                 # goes to rank 0's second receive
        comm.send(np.full(2, 2.0), 0, 5)                 # matched before the cancel
        big = np.full(1 << 18, 3.0)
        r = comm.isend(big, 0, 6)
        sent_cancel = r.cancel()
        r.wait(30)
        return sent_cancel
    a, b, c = np.zeros(2), np.zeros(2), np.zeros(2)
    ra = comm.irecv(a, peer, 4)
    out = {"cancel_unmatched": ra.cancel(), "cancelled": ra.cancelled}
    try:
        ra.wait(1)
        out["wait"] = "returned"
    except CancelledError as exc:
        out["wait"] = str(exc)
    out["cancel_again"] = ra.cancel()
    rb = comm.irecv(b, peer, 4)
    rc = comm.irecv(c, peer, 5)
    comm.send(np.zeros(1), peer, 9)
    rc.wait(30)
    out["cancel_matched"] = rc.cancel()
    out["b"] = rb.wait(30).nbytes, b.tolist()
    out["c"] = c.tolist()
    big = np.zeros(1 << 18)
    comm.recv(big, peer, 6, timeout=30)
    out["big"] = float(big[-1])
    return out


# -- fork safety -----------------------------------------------------------------------
class _SlowDataset:
    """Items say what a forked worker saw when it touched the parent's communicator;
    items from 2 on keep the worker busy (and alive) for 25 s."""

    def __init__(self, comm):
        self.comm = comm

    def __len__(self):
        return 8

    def __getitem__(self, i):
        try:
            self.comm.send(np.ones(1), 1 - self.comm.rank, 99, timeout=1)
            seen = "sent"
        except CommError as exc:
            seen = "closed" if "closed" in str(exc) else f"{type(exc).__name__}: {exc}"
        if i >= 2:
            time.sleep(25)
        return seen


def forked_loader_then_peer_killed(comm):
    """Each rank runs a forking torch DataLoader (2 workers); rank 1 is then SIGKILLed.
    Its workers live on, but must not keep its channels open: rank 0 must see
    PeerLostError at once, not wait for the workers to exit."""
    import multiprocessing

    from torch.utils.data import DataLoader

    # a test world's ranks are daemonic processes, which multiprocessing forbids to
    # have children; a launched rank is not
    multiprocessing.current_process().daemon = False
    loader = DataLoader(_SlowDataset(comm), batch_size=1, num_workers=2,
                        multiprocessing_context="fork", collate_fn=lambda b: b[0])
    it = iter(loader)
    seen = [next(it), next(it)]             # both workers are up (and now asleep in item 2, 3)
    comm.barrier(timeout=60)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        comm.recv(np.zeros(1), 1, 5, timeout=20)
        got = "no error"
    except PeerLostError as exc:
        got = ("PeerLostError", exc.rank)
    except CommTimeoutError:
        got = "timed out: the dead rank's channel was held open"
    took = time.monotonic() - t0
    workers = [w.pid for w in getattr(it, "_workers", [])]
    # the loader's SIGCHLD handler raises in this process when a worker dies by a
    # signal, at whatever line runs then: the kill below is ours, not a failure
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in workers:                     # do not wait 25 s for them to wake
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    del it
    return seen, got, took


# -- bad input -------------------------------------------------------------------------
def pointer_buffers_are_refused(comm):
    """Object arrays (and other pointer formats) are refused on send and receive,
    before anything moves: the pair stays usable and in order."""
    import ctypes

    peer = 1 - comm.rank
    out = {}
    objs = np.array([object(), "x", 3], dtype=object)
    structured = np.zeros(2, dtype=[("a", np.float64), ("o", object)])
    pointers = (ctypes.c_void_p * 2)()
    for name, buf in (("object", objs), ("structured", structured), ("void_p", pointers)):
        for op, fn in (("send", lambda b=buf: comm.send(b, peer, 1, timeout=5)),
                       ("isend", lambda b=buf: comm.isend(b, peer, 1)),
                       ("recv", lambda b=buf: comm.recv(b, peer, 1, timeout=5)),
                       ("irecv", lambda b=buf: comm.irecv(b, peer, 1)),
                       ("sendrecv", lambda b=buf: comm.sendrecv(np.zeros(1), peer, b, peer, 1,
                                                                timeout=5))):
            try:
                fn()
                out[(name, op)] = "accepted"
            except TypeError as exc:
                out[(name, op)] = str(exc)
    # named fields that merely contain the letters O or P are plain data
    plain = np.zeros(2, dtype=[("Price", np.float64), ("Open", np.int32)])
    got = np.zeros_like(plain)
    r = comm.irecv(got, peer, 2)
    comm.send(np.ones_like(plain), peer, 2)
    r.wait(10)
    # nothing was sent by the refused calls: the next message on tag 1 is this one
    r = comm.irecv(np.zeros(1), peer, 1)
    comm.send(np.full(1, 4.0), peer, 1)
    st = r.wait(10)
    return out, int(got["Price"][0]), st.nbytes


def bad_numbers(comm):
    out = {}
    x = np.zeros(2)
    for name, fn in (("recv_-1", lambda: comm.recv(x, 1 - comm.rank, 1, timeout=-1)),
                     ("recv_nan", lambda: comm.recv(x, 1 - comm.rank, 1, timeout=float("nan"))),
                     ("send_-1", lambda: comm.send(x, 1 - comm.rank, 1, timeout=-1)),
                     ("wait_-1", lambda: comm.irecv(x, 1 - comm.rank, 1).wait(-1)),
                     ("sendrecv_nan", lambda: comm.sendrecv(x, 1 - comm.rank, x, 1 - comm.rank,
                                                            1, timeout=float("nan"))),
                     ("all_reduce_-1", lambda: comm.all_reduce(x, timeout=-1)),
                     ("barrier_nan", lambda: comm.barrier(timeout=float("nan"))),
                     ("send_2**40", lambda: comm.send(x, 2 ** 40)),
                     ("isend_2**40", lambda: comm.isend(x, 2 ** 40)),
                     ("recv_2**40", lambda: comm.recv(x, 2 ** 40, timeout=1)),
                     ("send_-2", lambda: comm.send(x, -2))):
        try:
            fn()
            out[name] = "no error"
        except BaseException as exc:  # noqa: BLE001 - the class is what is tested
            out[name] = type(exc).__name__
    comm.barrier(timeout=30)
    return out


def mixed_orders(comm, kind):
    """Rank 0 passes a C-ordered array, the others a Fortran-ordered one of the same
    shape: element (i, j) meets element (i, j)."""
    shape = (3, 5)
    base = np.arange(15, dtype=np.float64).reshape(shape) * (comm.rank + 1)
    x = np.ascontiguousarray(base) if comm.rank == 0 else np.asfortranarray(base)
    if kind == "all_reduce":
        comm.all_reduce(x)
    elif kind == "broadcast":
        comm.broadcast(x, root=1)
    elif kind == "all_gather":
        out = np.zeros((comm.size,) + shape) if comm.rank else np.zeros((comm.size,) + shape,
                                                                          order="F")
        comm.all_gather(out, x)
        return out.tolist()
    return x.tolist()


def _collective(sub, kind, algo, x, timeout):
    """One call of collective `kind` by algorithm `algo` on sub, root 0, x the
    buffer each rank contributes (float64)."""
    import commrt.collectives as C

    n, r, m = sub.size, sub.rank, x.size
    kw = {"timeout": timeout} if kind == "barrier" else {"algorithm": algo, "timeout": timeout}
    counts = [m] * n
    calls = {
        "barrier": lambda: C.barrier(sub, **kw),
        "broadcast": lambda: C.broadcast(sub, x, 0, **kw),
        "reduce": lambda: C.reduce(sub, x, 0, C.SUM, **kw),
        "all_reduce": lambda: C.all_reduce(sub, x, C.SUM, **kw),
        "gather": lambda: C.gather(sub, x, np.empty(n * m) if r == 0 else None, 0, **kw),
        "scatter": lambda: C.scatter(sub, x, np.ones(n * m) if r == 0 else None, 0, **kw),
        "all_gather": lambda: C.all_gather(sub, np.empty(n * m), x, **kw),
        "reduce_scatter": lambda: C.reduce_scatter(sub, x, np.ones(n * m), C.SUM, **kw),
        "all_to_all": lambda: C.all_to_all(sub, np.empty(n * m), np.ones(n * m), **kw),
        "all_gatherv": lambda: C.all_gatherv(sub, np.empty(n * m), x, counts, **kw),
        "gatherv": lambda: C.gatherv(sub, x, np.empty(n * m) if r == 0 else None, counts, 0,
                                     **kw),
        "scatterv": lambda: C.scatterv(sub, x, np.ones(n * m) if r == 0 else None, counts, 0,
                                       **kw),
        "all_to_allv": lambda: C.all_to_allv(sub, np.empty(n * m), np.ones(n * m), counts,
                                             counts, **kw),
    }
    calls[kind]()


def each_algorithm_times_out(comm, cases, nbytes):
    """For each (collective, algorithm) in cases, on a fresh group of every rank:
    rank 0's call times out (0.1 s); the others call 0.35 s later with a 30 s
    deadline and must fail at once with the same error.  Returns, per case,
    this rank's error (as _catch gives it)."""
    import commrt.collectives as C

    out = []
    for kind, algo in cases:
        sub = C.new_group(comm, list(range(comm.size)))
        x = np.ones(nbytes // 8)
        comm.barrier()
        if comm.rank == 0:
            r = _catch(lambda: _collective(sub, kind, algo, x, 0.1))
        else:
            time.sleep(0.35)
            r = _catch(lambda: _collective(sub, kind, algo, x, 30))
        out.append(r)
    return out


def planned_calls_time_out(comm, kinds):
    """For each collective kind, on a fresh group: three calls (the later ones on
    the kind's prepared plan), then rank 0's call times out (0.1 s) and the
    others call 0.35 s later with no timeout= (their plan), then every rank
    calls a barrier.  Returns per kind (this rank's error in the call, in the
    barrier), as _catch gives them."""
    import commrt.collectives as C

    out = []
    for kind in kinds:
        sub = C.new_group(comm, list(range(comm.size)))
        x = np.ones(8)
        for _ in range(3):
            _collective(sub, kind, None, x, None)
        comm.barrier()
        if comm.rank == 0:
            now = _catch(lambda: _collective(sub, kind, None, x, 0.1))
        else:
            time.sleep(0.35)
            now = _catch(lambda: _collective(sub, kind, None, x, None))
        out.append((now, _catch(lambda: C.barrier(sub, timeout=10))))
    return out


def rank_dies_in(comm, victim, kind, algo, nbytes):
    """Rank `victim` is SIGKILLed 0.15 s after the others enter one call of `kind`
    by `algo` (30 s deadline; a rank that had not entered it yet fails as it
    does); returns this rank's error, or None if its part of the call
    finished without it."""
    x = np.ones(nbytes // 8)
    comm.barrier()
    if comm.rank == victim:
        time.sleep(0.15)
        os.kill(os.getpid(), signal.SIGKILL)
    return _catch(lambda: _collective(comm, kind, algo, x, 30))


def each_algorithm_mismatched(comm, cases, nbytes):
    """For each (collective, algorithm) in cases, on a fresh group of every rank,
    rank 1 passes one element more than the others.  Returns per case this
    rank's error in the call, and, where the call returned (a rank that only
    sent), the error of the next collective, which must report it."""
    import commrt.collectives as C

    out = []
    for kind, algo in cases:
        sub = C.new_group(comm, list(range(comm.size)))
        x = np.ones(nbytes // 8 + (comm.rank == 1))
        comm.barrier()
        now = _catch(lambda: _collective(sub, kind, algo, x, 20))
        later = None if now is not None else _catch(lambda: C.barrier(sub, timeout=20))
        out.append((now, later))
    return out


BAD_BUFFERS = ("read-only", "non-contiguous", "object dtype")


def _bad_buffer(what):
    if what == "read-only":
        x = np.ones(64)
        x.setflags(write=False)
        return x
    if what == "non-contiguous":
        return np.ones(128)[::2]
    return np.ones(64, dtype=object)


def refused_on_one_rank_then_retried(comm, kinds, what):
    """For each collective kind (on a fresh group): rank 1 passes a bad buffer
    (`what`) where the others pass a good one, then calls again with a good
    one.  Returns per kind (rank 1's error type and text or None, the sum of
    the buffer the call completed with)."""
    import commrt.collectives as C

    out = []
    for kind in kinds:
        sub = C.new_group(comm, list(range(comm.size)))
        comm.barrier()
        err = None
        x = np.ones(64)
        if comm.rank == 1:
            bad = _bad_buffer(what)
            try:
                _collective(sub, kind, None, bad, 20)
                x = bad                     # accepted (it only sends from it)
            except (TypeError, ValueError) as exc:
                err = (type(exc).__name__, str(exc))
        if err is not None or comm.rank != 1:
            _collective(sub, kind, None, x, 20)
        out.append((err, float(x.sum())))
    return out
