"""What every collective shares: the call's fingerprint, checked sends and
receives, waits with deadlines and mismatch probes, scratch memory, and the
per-communicator worker that runs ``async_op=True`` collectives in order.

Rules the algorithms follow (and this module enforces):

* Traffic goes through ``comm.channel`` (commrt.comm.Channel: the
  communicator's own context for collectives), tag ``TAG``.  Between
  two ranks messages of one (context, tag) match in the order sent, so an
  algorithm only has to post its receives from one peer in the order that
  peer sends.
* Each collective call gets the next sequence number of its communicator
  and a fingerprint (sequence, kind, algorithm, count, dtype, op, root).
  Every message carries the fingerprint packed in the header's two 64-bit
  words (``meta``, ``meta2``); every receive checks it and the payload size.  A difference is
  a mismatch: the rank that sees it aborts the collective context on every
  rank (``Channel.abort``), so each one raises CollectiveMismatchError naming
  both calls, and the context stays poisoned (later collectives raise too).
* Two mismatched calls can also leave ranks waiting on each other with no
  message in flight (rank 0 in reduce waiting on rank 1, rank 1 in
  broadcast waiting on rank 0).  A wait that lasts COMMRT_COLL_PROBE_S
  sends a probe (tag ``PROBE_TAG``) to the peer it waits on and listens
  for probes: a rank that receives a probe for a sequence number it has
  called compares fingerprints, and a difference aborts as above.  So a
  mismatch never hangs until the timeout.
* Collectives of one communicator run one at a time in call order (async
  ones on a worker thread; a blocking call waits for earlier async ones),
  so their messages never interleave; collectives of different
  communicators use different contexts and run concurrently.
* The thread rule: collectives of one communicator are entered by one
  thread at a time (``entry`` below).  A second thread entering while one is
  inside gets ConcurrentCollectiveError at once, naming both threads, before
  it touches any state (no sequence number taken, nothing sent): two
  threads' calls would take sequence numbers in a different order on each
  rank.  The async worker runs calls the owning thread queued: not a
  violation.  Point-to-point has no such rule.
* A collective that fails on one rank (timeout, lost peer, any error, Ctrl-C)
  aborts its collective context on every rank (``Call.fail_everywhere``)
  with a FailureCode and the culprit rank, so no rank carries on alone; the
  first abort wins everywhere, so every rank names the rank that failed
  first, not one that merely left after seeing it.

The fingerprint travels in the header's two 64-bit words (meta, meta2;
layout at pack below).
"""
import collections
import functools
import logging
import queue
import sys
import threading
import time
from threading import get_ident

import numpy as np

from commrt import config
from commrt.comm import check_timeout
from commrt.errors import (AbortedError, CollectiveMismatchError, CommError, CommTimeoutError,
                           ConcurrentCollectiveError, FailureCode, MessageTruncatedError,
                           PeerLostError)
from commrt.kernels.bfloat16 import BFLOAT16

log = logging.getLogger("commrt")

TAG = 7
PROBE_TAG = 8

# Internal call kinds beside the registry's collectives (registry.BORROWS says
# whose algorithm codes they carry).
INTERNAL_KINDS = ("broadcast_obj", "all_gather_obj", "gather_obj", "split", "new_group",
                  "calibrate")
_KINDS = []
KIND_BITS = 6


def kinds():
    """Every call kind, by wire code: "none", the registry's collectives, the
    internal kinds (built once; the same on every rank of one installation)."""
    if not _KINDS:
        from commrt.collectives import registry

        names = ("none",) + registry.collectives() + INTERNAL_KINDS
        if len(names) > 1 << KIND_BITS:
            raise ImportError(f"{len(names)} call kinds do not fit the fingerprint's "
                              f"{KIND_BITS}-bit kind field")
        _KINDS.extend(names)
        KIND_CODE.update({k: i for i, k in enumerate(names)})
    return _KINDS


KIND_CODE = {}


def kind_code(kind):
    return KIND_CODE.get(kind) or kinds().index(kind)


def algo_code(kind, algo):
    from commrt.collectives import registry

    return registry.code(kind, algo)


DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                np.float64, np.complex64, np.complex128)] + [BFLOAT16]
DTYPE_CODE = {d: i + 1 for i, d in enumerate(DTYPES)}

OP_NAMES = ("-", "SUM", "PROD", "MIN", "MAX", "AVG", "LAND", "LOR", "BAND", "BOR", "BXOR")


# -- fingerprints ------------------------------------------------------------------
# Two 64-bit header words (wire version 2, docs/transport.md): meta holds the
# sequence number (40 bits), kind, algorithm (6 bits each), op (4), dtype (6);
# meta2 the root (24 bits) and the element count (40).  Every field is whole
# for any real job (10^12 calls, 16 M ranks, 10^12 elements).
SEQ_MASK = (1 << 40) - 1


def pack(seq, kind, algo, count, dtype, op, root):
    """(meta, meta2) of a call's fingerprint."""
    return ((seq & SEQ_MASK) | (kind & 0x3F) << 40 | (algo & 0x3F) << 46 | (op & 0xF) << 52
            | (dtype & 0x3F) << 56,
            (root & 0xFFFFFF) | (count & ((1 << 40) - 1)) << 24)


def unpack(meta, meta2=0):
    return {"seq": meta & SEQ_MASK, "kind": meta >> 40 & 0x3F, "algo": meta >> 46 & 0x3F,
            "op": meta >> 52 & 0xF, "dtype": meta >> 56 & 0x3F, "root": meta2 & 0xFFFFFF,
            "count": meta2 >> 24}


def describe_meta(meta, meta2=0):
    """Text for a packed fingerprint."""
    f = unpack(meta, meta2)
    names = kinds()
    kind = names[f["kind"]] if f["kind"] < len(names) else f"kind{f['kind']}"
    dt = DTYPES[f["dtype"] - 1].name if 0 < f["dtype"] <= len(DTYPES) else "-"
    parts = [f"count={f['count']}", f"dtype={dt}"]
    if f["op"]:
        parts.append(f"op={OP_NAMES[f['op']] if f['op'] < len(OP_NAMES) else f['op']}")
    parts.append(f"root={f['root']}")
    if f["algo"]:
        from commrt.collectives import registry

        parts.append(f"algo={registry.name_of(kind, f['algo'])}")
    return f"#{f['seq']} {kind}({', '.join(parts)})"


def _diff(mine, theirs):
    """The fields that differ between two fingerprints, each (meta, meta2)."""
    a, b = unpack(*mine), unpack(*theirs)
    return [k for k in ("seq", "kind", "algo", "count", "dtype", "op", "root") if a[k] != b[k]]


# -- per-communicator state ------------------------------------------------------------
class CommState:
    """Sequence numbers, poison, scratch memory, caches and the async worker of one
    communicator (kept in ``comm.state['collectives']``)."""

    def __init__(self, comm):
        self.seq = 0
        self.inside = 0                          # ident of the thread inside a collective (0: none)
        self.poisoned = None                     # the reason, once the context was aborted
        self.history = collections.deque(maxlen=256)   # (seq, meta, meta2) of recent calls
        self.current = None                      # the Call running now
        self.cache = {}                          # cost parameters, derived communicators...
        self._scratch = {}
        self.lock = threading.Lock()
        self.pending = 0                         # async calls queued or running
        self.waiters = 0                         # threads blocked in CollRequest.wait
        self._queue = None
        self._worker = None
        self.probe_req = None                    # posted receive for probes, once needed
        self.small = {}                          # prepared small all-reduces (_small.py)
        self.probe_buf = np.zeros(2, np.uint64)           # a probe: (meta, meta2)
        # knobs, read once per communicator (a collective call must stay cheap)
        self.timeout = config.get("COMMRT_TIMEOUT")
        self.probe_s = config.get("COMMRT_COLL_PROBE_S")

    def scratch(self, slot, count, dtype):
        """A reusable buffer of `count` elements (one per slot; contents undefined)."""
        dtype = np.dtype(dtype)
        need = max(1, count * dtype.itemsize)
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < need:
            buf = np.empty(need, np.uint8)
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
    return st


# -- the thread rule -----------------------------------------------------------------
def entry(fn):
    """The public entry of a collective: one thread at a time per communicator.

    The check costs a thread-ident call and two attribute accesses.  Between
    reading ``st.inside`` and setting it no Python call runs, so CPython
    (3.11, 3.12 with the GIL) never switches threads there: two threads
    cannot both see it free.  The same thread may enter again (a collective
    that calls another on its own communicator)."""
    name = fn.__name__

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


# -- one call ------------------------------------------------------------------------
class Recv:
    __slots__ = ("req", "src", "nbytes")

    def __init__(self, req, src, nbytes):
        self.req, self.src, self.nbytes = req, src, nbytes


class Combine:
    """A receive in flight that combines into buf once done (Call.irecv_combine)."""
    __slots__ = ("rv", "buf", "tmp", "red")

    def __init__(self, rv, buf, tmp, red):
        self.rv, self.buf, self.tmp, self.red = rv, buf, tmp, red


class Call:
    """One collective call on one rank: its fingerprint and its messages."""

    def __init__(self, comm, kind, *, count=0, dtype=None, op=None, root=0, algo="-",
                 timeout=None, seq=None, serving=None, label=None):
        """seq: the sequence number of a call already begun (and recorded) by the
        small-message path (collectives/_small.py), which hands it over here.
        serving: the user's collective (its kind) this internal call runs for, on
        every rank at the same point (calibrate): it takes the sequence number
        that call is about to take, without consuming it, so errors and
        sequence numbers name the user's calls only.
        label: the name errors give this call (a step of the user's call on a
        derived communicator, e.g. hierarchical's host reduce)."""
        st = state_of(comm)
        if st.poisoned is not None:
            raise comm.channel.aborted() or AbortedError(f"communicator unusable after an "
                                                        f"earlier failure: {st.poisoned}")
        self.comm = comm
        self.chan = comm.channel
        self.state = st
        self.rank, self.size = comm.rank, comm.size
        resumed = seq is not None
        self.serving, self.label = serving, label
        if not resumed:
            seq = st.seq
            if serving is None:
                st.seq += 1
        self.seq = seq
        self.kind = kind
        self.algo = algo
        self.count = count
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.op = op
        self.root = root
        self.meta, self.meta2 = pack(
            self.seq, kind_code(kind), algo_code(kind, algo), count,
            DTYPE_CODE.get(self.dtype, 63) if self.dtype is not None else 0,
            op.value if op is not None else 0, root)
        if not resumed:
            st.history.append((self.seq, self.meta, self.meta2))
        self.timeout = st.timeout if timeout is None else check_timeout(timeout)
        self.deadline = None
        self.sends = []
        self.probe_s = st.probe_s
        self.worker = False                      # run by the async worker thread

    @property
    def spin(self):
        """Whether waits may spin before they sleep: not on the async worker while
        the caller computes (the spin would take the caller's core), yes once the
        caller itself waits for the result."""
        return not self.worker or self.state.waiters > 0

    @property
    def name(self):
        if self.label is not None:
            return self.label
        if self.serving is not None:
            return f"{self.serving} #{self.seq} (its {self.kind})"
        return f"{self.kind} #{self.seq}"

    def start(self):
        self.deadline = time.monotonic() + self.timeout
        self.state.current = self

    def end(self):
        self.finish()
        self.state.current = None

    # messages ------------------------------------------------------------------------
    def isend(self, buf, dst):
        req = self.chan.isend(buf, dst, TAG, self.meta, self.meta2)
        self.sends.append(req)
        return req

    def irecv(self, buf, src):
        return Recv(self.chan.irecv(buf, src, TAG), src, buf.nbytes)

    def irecv_reduce(self, buf, src, hook):
        """Receive into buf combining (buf = buf OP message) as the data lands, with
        the C loop at address hook (``reduce.hook``); checked by wait like any
        receive, and buf is untouched unless the message is the one expected."""
        return Recv(self.chan.irecv_reduce(buf, src, TAG, self.meta, hook, self.meta2), src,
                    buf.nbytes)

    def recv(self, buf, src):
        self.wait(self.irecv(buf, src))

    def irecv_combine(self, buf, src, red, slot):
        """Start receiving a message from src to combine into buf (buf = buf OP
        message, the message the right operand): a reduce-receive where red has
        a C loop, else a receive into the scratch `slot` that wait_combine
        reduces from.  Two combines in flight need different slots."""
        if red.hook:
            return Combine(self.irecv_reduce(buf, src, red.hook), buf, None, red)
        tmp = self.state.scratch(slot, buf.size, buf.dtype)
        return Combine(self.irecv(tmp, src), buf, tmp, red)

    def wait_combine(self, cb):
        """Wait for an irecv_combine (checked as by wait) and finish its combine."""
        self.wait(cb.rv)
        if cb.tmp is not None:
            cb.red(cb.buf, cb.tmp)

    def recv_combine(self, buf, src, red, slot="combine"):
        """Receive from src and combine the message into buf (see irecv_combine)."""
        self.wait_combine(self.irecv_combine(buf, src, red, slot))

    def send(self, buf, dst):
        """Start a send; it completes by end() (the algorithm must not modify buf before)."""
        self.isend(buf, dst)

    def wait(self, rv):
        """Wait for a receive and check its fingerprint and size."""
        st = self._wait_req(rv.req, rv.src)
        if st.meta != self.meta or st.meta2 != self.meta2 or st.nbytes != rv.nbytes:
            self._mismatch(rv.src, (st.meta, st.meta2), st.nbytes, rv.nbytes)
        return st

    def exchange(self, sbuf, dst, rbuf, src, hook=0):
        """Send sbuf to dst and receive rbuf from src (checked as by wait); the
        send completes by end() or wait_sends().  One engine call when the
        answer comes within the probe interval, as it does in a healthy run.
        hook: combine the message into rbuf instead (as irecv_reduce)."""
        # the async worker beside a computing caller only posts here (the engine's
        # wait spins); complete_exchange then waits without spinning
        wait = self.probe_s if self.spin else 0.0
        try:
            rq, sq = self.chan.exchange(sbuf, dst, rbuf, src, TAG, self.meta, wait, hook,
                                        self.meta2)
        except CommError as exc:
            self._failed(exc, src)
        return self.complete_exchange(rq, sq, src, rbuf.nbytes)

    def exchange_combine(self, sbuf, dst, rbuf, src, red, slot="xcombine"):
        """exchange() whose received message is combined into rbuf (rbuf = rbuf OP
        message): as it lands where red has a C loop, else through scratch."""
        if red.hook:
            return self.exchange(sbuf, dst, rbuf, src, red.hook)
        tmp = self.state.scratch(slot, rbuf.size, rbuf.dtype)
        st = self.exchange(sbuf, dst, tmp, src)
        red(rbuf, tmp)
        return st

    def complete_exchange(self, rq, sq, src, nbytes):
        """Finish an exchange already posted (by exchange(), or by the small path
        before it handed the call over): wait for the receive and check it."""
        self.sends.append(sq)
        st = self._wait_req(rq, src)
        if st.meta != self.meta or st.meta2 != self.meta2 or st.nbytes != nbytes:
            self._mismatch(src, (st.meta, st.meta2), st.nbytes, nbytes)
        return st

    def waitall(self, recvs):
        for rv in recvs:
            self.wait(rv)

    def test(self, rv):
        """True when the receive finished (checked as by wait)."""
        try:
            done = rv.req.test()
        except CommError as exc:
            self._failed(exc, rv.src)
        if done:
            self.wait(rv)
        return done

    def wait_sends(self):
        sends, self.sends = self.sends, []
        for req in sends:
            self._wait_req(req, None)

    def finish(self):
        self.wait_sends()

    # waiting -------------------------------------------------------------------------
    def _wait_req(self, req, peer):
        probe_at = time.monotonic() + self.probe_s
        while True:
            now = time.monotonic()
            left = self.deadline - now
            if left <= 0:
                raise CommTimeoutError(self.name, peer, TAG, self.timeout,
                                       detail=f"rank {self.rank} of {self.size}")
            try:
                return req.wait(min(left, max(probe_at - now, 0.001)), self.spin)
            except CommTimeoutError:
                pass
            except CommError as exc:
                self._failed(exc, peer)
            if time.monotonic() >= probe_at:
                # aborted meanwhile (another rank failed) while this request was
                # already matched, so the abort did not fail it: stop waiting
                first = self.chan.aborted()
                if first is not None:
                    raise first
                self._probe(peer)
                probe_at = time.monotonic() + min(self.probe_s, 0.5)

    def _failed(self, exc, peer):
        """A request of this call failed with exc: raise what this rank reports
        (the abort of every rank happens in fail_everywhere)."""
        if isinstance(exc, MessageTruncatedError):
            fp = ((self.meta, self.meta2) if exc.meta is None
                  else (exc.meta, getattr(exc, "meta2", 0) or 0))
            self._mismatch(exc.source, fp, exc.message_bytes, exc.buffer_bytes)
        raise exc

    def fail_everywhere(self, exc):
        """The call failed here with exc: abort the collective context on every
        rank (the code and culprit travel with it), and return the error to
        raise: the first failure heard, if another rank's abort came first."""
        if isinstance(exc, ConcurrentCollectiveError):
            return exc
        told = getattr(exc, "origin", None) is not None      # made from a received abort
        if not told and not isinstance(exc, AbortedError):
            code, culprit = FailureCode.ERROR, self.rank
            if isinstance(exc, PeerLostError):
                code, culprit = FailureCode.PEER_LOST, exc.rank
            elif isinstance(exc, CommTimeoutError):
                code, culprit = FailureCode.TIMEOUT, exc.peer if exc.peer is not None else self.rank
            elif isinstance(exc, CommError):
                code = exc.code
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            reason = f"rank {self.rank} in {self.name}: {what}"[:250]
            try:
                self.chan.abort(reason, code=code, culprit=culprit)
            except CommError:
                pass
        try:
            first = self.chan.aborted()
        except CommError:
            first = None
        if self.state.poisoned is None:
            self.state.poisoned = str(first if first is not None else exc)
        if told or first is None or first.origin == self.rank:
            return exc                      # ours is the first failure (or the one we heard)
        return first                        # another rank failed first: name its culprit

    def _mismatch(self, src, fp, nbytes, expected):
        reason = self._differs(src, fp, nbytes, expected)
        self._abort_everywhere(f"collective mismatch: {reason}")

    def _differs(self, src, fp, nbytes, expected):
        """What differs between this call and the message of rank src (its
        fingerprint fp = (meta, meta2), nbytes) that this rank received for it."""
        ours = (self.meta, self.meta2)
        mine = describe_meta(*ours)
        if fp == ours:
            return (f"rank {self.rank} called {mine}; rank {src} sent {self._bytes(nbytes)} "
                    f"where this rank expected {self._bytes(expected)} from it (their counts "
                    f"differ)")
        seq = fp[0] & SEQ_MASK
        earlier = None
        if seq != self.seq:
            earlier = next((e for e in reversed(self.state.history)
                            if e[0] == seq and e[0] != self.seq), None)
        if earlier is None:
            return (f"rank {self.rank} called {mine}; rank {src} called {describe_meta(*fp)} "
                    f"[{', '.join(_diff(ours, fp))} differ]")
        # a message of an earlier call nobody received in it (every rank only sent,
        # e.g. each passed itself as a broadcast's root): that call was the mismatch
        theirs = earlier[1:]
        fields = [f for f in _diff(theirs, fp) if f != "seq"] or ["count"]
        # (kept short: the abort carries the reason to every rank in 255 bytes)
        return (f"in the earlier call #{earlier[0]} [{', '.join(fields)} differ]: rank "
                f"{self.rank} called {describe_meta(*theirs)}, rank {src} "
                f"{describe_meta(*fp)}; no rank received in it, {self.name} saw it")

    def _bytes(self, nbytes):
        dt = self.dtype
        if dt is None or not dt.itemsize or nbytes % dt.itemsize:
            return f"{nbytes} B"
        return f"{nbytes} B ({nbytes // dt.itemsize} x {dt.name})"

    def _abort_everywhere(self, reason):
        self.state.poisoned = reason
        try:
            self.chan.abort(reason)
        except CommError:
            pass
        raise CollectiveMismatchError(reason, rank=self.rank, origin=self.rank)

    # probes ----------------------------------------------------------------------------
    def _probe(self, peer):
        """Tell `peer` what we are waiting in, and answer probes sent to us."""
        st = self.state
        if peer is not None:
            msg = np.array([self.meta, self.meta2], np.uint64)
            try:
                self.chan.isend(msg, peer, PROBE_TAG, self.meta, self.meta2)
            except CommError:
                pass
        check_probes(st, self)


def check_probes(st, call):
    """Handle probes that arrived: a probe for a sequence number this rank has
    called with a different fingerprint is a mismatch (abort); others are
    ignored (the prober is only waiting for a slower rank)."""
    from commrt.errors import CommError as _CE

    chan = call.chan
    while True:
        if st.probe_req is None:
            st.probe_req = chan.irecv(st.probe_buf, -1, PROBE_TAG)
        try:
            if not st.probe_req.test():
                return
            status = st.probe_req.wait(0)
        except CollectiveMismatchError as exc:
            st.probe_req = None
            call._failed(exc, None)
        except _CE:
            st.probe_req = None
            return
        st.probe_req = None
        theirs = (int(st.probe_buf[0]), int(st.probe_buf[1]))
        seq = theirs[0] & SEQ_MASK
        # every call this rank made at that sequence number (an internal call,
        # calibrate, shares its user call's): a mismatch if none is theirs
        ours = [(meta, meta2) for s, meta, meta2 in st.history if s == seq]
        if ours and theirs not in ours:
            mine = ours[-1]
            reason = (f"collective mismatch: rank {call.rank} called {describe_meta(*mine)}; "
                      f"rank {status.source} called {describe_meta(*theirs)} "
                      f"[{', '.join(_diff(mine, theirs)) or 'count'} differ]")
            call._abort_everywhere(reason)


# -- running a collective -------------------------------------------------------------
def execute(call, fn, async_op):
    """Run fn() for `call` now, or on the communicator's worker when async_op is set
    (or when earlier async collectives are still pending, to keep call order)."""
    st = call.state

    def run():
        call.start()
        try:
            result = fn()
            call.end()
            return result
        except BaseException as exc:
            err = call.fail_everywhere(exc)
            if err is exc:
                raise
            raise err from exc
        finally:
            st.current = None

    if async_op:
        return st.submit(call, run)
    if st.pending:
        return st.submit(call, run).wait()
    return run()


def bounds(n, parts):
    """Chunk boundaries splitting n elements into `parts` (the first n % parts one longer)."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def segments(lo, hi, seg):
    """[lo, hi) in pieces of at most seg elements; an empty range is one empty piece."""
    if hi <= lo:
        return [(lo, lo)]
    return [(s, min(s + seg, hi)) for s in range(lo, hi, seg)]


_SEG_BYTES = []


def seg_elems(itemsize):
    """Elements per segment of the pipelined algorithms (COMMRT_RING_SEGMENT_BYTES, read once)."""
    if not _SEG_BYTES:
        _SEG_BYTES.append(config.get("COMMRT_RING_SEGMENT_BYTES"))
    return max(1, _SEG_BYTES[0] // itemsize)


def offsets(counts):
    """Start of each block of a packed buffer holding blocks of `counts` elements,
    and the total at the end (the variable-size collectives)."""
    offs = [0] * (len(counts) + 1)
    for i, c in enumerate(counts):
        offs[i + 1] = offs[i] + c
    return offs
