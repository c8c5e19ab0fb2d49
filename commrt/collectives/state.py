"""Per-communicator state of the collectives (sequence numbers, poison, history,
scratch memory, caches) and the worker thread that runs ``async_op=True``
collectives in call order; ``execute`` runs one call now or on that worker;
``entry`` enforces the thread rule (one thread at a time inside the
collectives of one communicator).
"""
import array
import contextlib
import functools
import logging
import queue
import sys
import threading
from threading import get_ident

from commrt import _lazy

from commrt import config
from commrt.comm import check_timeout
from commrt.errors import CommTimeoutError, ConcurrentCollectiveError
from commrt.transport.buffers import aligned_empty
from commrt.collectives._entry import History, State
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)

log = logging.getLogger("commrt")


# -- per-communicator state ------------------------------------------------------------
class CommState(State):
    """Sequence numbers, poison, scratch memory, caches and the async worker of one
    communicator (kept in ``comm.state['collectives']``).  The fields the public
    functions' planned path reads and writes (seq, inside, pending, poisoned,
    history, small, the all-reduce's and the other kinds' memos) are C fields of its base,
    _entry.State, which that path (collectives/_entry.pyx) reads in C."""

    def __init__(self, comm):
        self.seq = 0
        self.inside = 0                          # ident of the thread inside a collective (0: none)
        self.poisoned = None                     # the reason, once the context was aborted
        self.history = History()                 # (seq, meta, meta2) of the last 256 calls (a plan's: its base, the seq not in)
        self.current = None                      # the Call running now
        self.cache = {}                          # cost parameters, derived communicators...
        self._scratch = {}
        self.lock = threading.Lock()
        self.pending = 0                         # async calls queued or running
        self.waiters = 0                         # threads blocked in CollRequest.wait
        self.spin = True                         # waits may spin (set_spin; see Call.spin)
        self._queue = None
        self._worker = None
        self.probe_req = None                    # posted receive for probes, once needed
        self.small = {}                          # prepared small all-reduces (_small.py)
        self.last_all_reduce = None              # the plan all_reduce ran last (its memo)
        self.last_named_all_reduce = None        # ... for a call that named its algorithm
        self.tuning = None                       # "all_reduce #3" while it times its candidates
        self.calibrating = False                 # inside the cost model's calibration (cost.params)
        self.probe_buf = array.array("Q", (0, 0))        # a probe: (meta, meta2), uint64
        # knobs, read once per communicator (a collective call must stay cheap)
        self.timeout = config.get("COMMRT_TIMEOUT")
        self.probe_s = config.get("COMMRT_COLL_PROBE_S")

    @contextlib.contextmanager
    def numbers_given_back(self):
        """Calls made inside (by every rank alike: a calibration's, a tuning's) give
        their sequence numbers and history entries back afterwards, so the user's
        calls keep their numbers."""
        seq, history = self.seq, list(self.history)
        try:
            yield
        finally:
            self.seq = seq
            self.history.clear()
            self.history.extend(history)

    def scratch(self, slot, count, dtype):
        """A reusable buffer of `count` elements (one per slot; contents undefined)."""
        dtype = np.dtype(dtype)
        need = max(1, count * dtype.itemsize)
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < need:
            buf = aligned_empty(need, np.uint8)
            self._scratch[slot] = buf
        return buf[: count * dtype.itemsize].view(dtype)

    # async ---------------------------------------------------------------------------
    def submit(self, call, fn):
        req = CollRequest(call)
        with self.lock:
            self.pending += 1
            if self._worker is None:
                _shorten_switch_interval()
                self._queue = queue.SimpleQueue()
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name="commrt-collectives")
                self._worker.start()
        self._queue.put((req, fn))
        return req

    def stop_worker(self, timeout=5.0):
        """End the async worker once what is queued has run (a closing communicator:
        its thread must not outlive it).  A later async call starts a new one."""
        with self.lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._queue.put(None)
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    def _work(self):
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            req, fn = item
            req.call.worker = True
            try:
                req._result = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the waiter's thread
                req._error = exc
            finally:
                with self.lock:
                    self.pending -= 1
                    callbacks, req._callbacks = req._callbacks, None
                req._event.set()
                for fn in callbacks:
                    try:
                        fn(req)
                    except BaseException:  # noqa: BLE001 - a callback's error is its own
                        log.exception("commrt: a collective's done-callback raised")


def _shorten_switch_interval():
    """Let the collectives' worker thread have the GIL back soon after each message.

    It runs an async collective's Python steps (post, reduce, forward) while
    the caller computes.  Python hands the GIL over only every switch interval
    (5 ms by default) to a thread that asks for it while another runs Python
    code, so an 8 MiB async all-reduce beside a Python-heavy backward took
    ~30 ms instead of ~7 ms at 0.5 ms.  Lowered once per process, never raised;
    with no other thread asking for the GIL a short interval costs nothing."""
    us = config.get("COMMRT_SWITCH_INTERVAL_US")
    if us > 0 and sys.getswitchinterval() > us * 1e-6:
        sys.setswitchinterval(us * 1e-6)


def state_of(comm):
    st = comm.state.get("collectives")
    if st is None:
        st = comm.state.setdefault("collectives", CommState(comm))
    if getattr(comm, "_coll_state", st) is None:
        comm._coll_state = st           # the compiled entry's shortcut (_entry._state)
    return st


# -- the thread rule -----------------------------------------------------------------
def entry(fn):
    """The public entry of a collective: one thread at a time per communicator.

    The check costs a thread-ident call and two attribute accesses.  Between
    reading ``st.inside`` and setting it no Python call runs, so CPython
    (3.11, 3.12 with the GIL) never switches threads there: two threads
    cannot both see it free.  The same thread may enter again (a collective
    that calls another on its own communicator)."""
    name = fn.__name__.lstrip("_")      # the user's call: broadcast, not _broadcast

    @functools.wraps(fn)
    def entered(comm, *args, **kwargs):
        st = comm.state.get("collectives") or state_of(comm)
        tid = get_ident()
        inside = st.inside
        if inside == tid:
            return fn(comm, *args, **kwargs)
        if inside:
            raise concurrent(comm, st, name, tid, inside)
        st.inside = tid
        try:
            return fn(comm, *args, **kwargs)
        finally:
            st.inside = 0
    return entered


def concurrent(comm, st, what, tid, inside):
    """The error of a thread that entered a collective while another is inside."""
    def thread(ident):
        t = threading._active.get(ident)
        return f"thread {t.name!r} (id {ident})" if t is not None else f"thread id {ident}"

    cur = st.current
    where = cur.name if cur is not None else "a collective"
    return ConcurrentCollectiveError(
        f"{what}: {thread(tid)} entered a collective of {comm!r} while {thread(inside)} is "
        f"inside {where}; collectives of one communicator are entered by one thread at a time "
        f"(give each thread its own communicator with split() or new_group(), or issue them "
        f"from one thread, async_op=True to overlap)")


class CollRequest:
    """The handle of a collective started with ``async_op=True``.

    wait(timeout=None) blocks until it finishes and returns its result (or
    raises its error here, in the caller's thread); test() says whether it
    has finished.  Collectives of one communicator complete in call order."""

    def __init__(self, call):
        self.call = call
        self._event = threading.Event()
        self._result = None
        self._error = None
        self._callbacks = []                 # None once finished

    def add_done_callback(self, fn):
        """Call fn(self) once it has finished (result or error), on the thread that
        finishes it: the communicator's worker, or this one if it already has.
        fn must not block on collectives of this communicator."""
        with self.call.state.lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)

    @property
    def error(self):
        """The error it finished with, or None."""
        return self._error

    @property
    def result(self):
        return self._result

    def test(self):
        return self._event.is_set()

    @property
    def done(self):
        return self._event.is_set()

    def wait(self, timeout=None):
        if timeout is not None:
            check_timeout(timeout)
        st = self.call.state
        with st.lock:
            st.waiters += 1                      # the worker may spin now (see Call.spin)
        try:
            finished = self._event.wait(timeout)
        finally:
            with st.lock:
                st.waiters -= 1
        if not finished:
            raise CommTimeoutError(f"wait for {self.call.name}", timeout=timeout,
                                   detail="the collective is still running")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self):
        return f"<CollRequest {self.call.name} {'done' if self.done else 'pending'}>"


# -- running a collective -------------------------------------------------------------
def execute(call, fn, async_op):
    """Run fn() for `call` now, or on the communicator's worker when async_op is set
    (or when earlier async collectives are still pending, to keep call order)."""
    st = call.state

    run = functools.partial(call.run, fn)

    if async_op:
        return st.submit(call, run)
    if st.pending:
        return st.submit(call, run).wait()
    return run()
