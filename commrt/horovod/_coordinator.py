"""The background coordinator: Horovod's controller, response cache and fusion.

Operations are matched across ranks by name, not by call order.  A caller
submits an Op (a kind, a name, this rank's signature and its buffers) and
gets on with its work; one background thread per job, the only thread that
issues collectives on the coordinator's communicators, runs rounds:

1. Every rank contributes a byte vector, reduced with MIN on the process
   set's negotiation communicator: byte 0 is 0 when some rank has requests
   the cache does not know, byte 1 is 0 when some rank shuts down, byte
   2+b is 1 when this rank has the request of cache entry b pending.  After
   the reduction, entry b is ready everywhere exactly when its byte is 1:
   a steady training step negotiates with this one small all-reduce.
2. When byte 0 is 0, every rank all-gathers its uncached requests (name and
   signature) and the names of its pending cache entries; every rank then
   holds the same table of name -> {rank: signature}.  An entry present on
   every rank that has not joined is ready: signatures that disagree fail
   it on every rank (HorovodMismatchError), others run and enter the cache.
3. The ready operations run in one order everywhere (cache bits ascending,
   then table order); ready allreduces of one dtype, op and scaling are
   packed into fusion buffers of at most HOROVOD_FUSION_THRESHOLD bytes and
   reduced together.

Every rank derives the same table, cache and join state from the same
gathered data, so no rank ever decides alone.  Process sets have their own
state and communicators; a rank runs the rounds of its sets in id order, so
rounds of different sets never wait on each other in a cycle.

Waiting: the coordinator's collectives wait for the other ranks' coordinators
while the caller computes (backward, beside it on the same cores).  Their
waits do not spin then (collectives.set_spin): a spinning wait took a core
and the GIL from the training thread 20 times a step.  They spin again while
some caller waits in wait() (synchronize), when nothing else needs the core;
COMMRT_HOROVOD_SPIN=1 lets them spin always.

Failure: any error in a round or a collective (a lost peer, an abort) stops
the coordinator: every pending and later operation raises
HorovodInternalError, and the communicators are aborted so that the other
ranks stop too.
"""
import math
import sys
import threading
import time

import numpy as np

from commrt import config
from commrt.collectives import set_spin
from commrt.collectives.ops import MAX, MIN, PROD, SUM
from commrt.horovod.errors import HorovodInternalError, HorovodMismatchError
from commrt.transport.buffers import aligned_empty

# Horovod's reduction codes (horovod.common.basics): Average 0, Sum 1, Adasum 2, Min 3, Max 4, Product 5
AVERAGE, SUM_OP, ADASUM, MIN_OP, MAX_OP, PRODUCT = 0, 1, 2, 3, 4, 5
_KERNEL_OP = {AVERAGE: SUM, SUM_OP: SUM, MIN_OP: MIN, MAX_OP: MAX, PRODUCT: PROD}
_CACHEABLE = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
WAIT_CYCLE_S = 0.001  # rounds that finish nothing, while a caller waits: this far apart
IDLE_S = 0.05        # an idle rank still joins a round this often (shutdown, liveness)
JOIN = "__join__"


class Op:
    """One submitted operation.  sig: what every rank must agree on (per kind,
    see _check); bufs: this rank's arrays (reduced or broadcast in place).
    done turns True once result/error are set; waiters sleep on the
    coordinator's `finished` condition, notified once per round (no Event per
    op: making one costs more than the rest of a tiny tensor's submission)."""

    __slots__ = ("kind", "name", "sig", "bufs", "ps", "result", "error", "done")

    def __init__(self, kind, name, sig, bufs, ps):
        self.kind, self.name, self.sig, self.bufs, self.ps = kind, name, sig, bufs, ps
        self.result = self.error = None
        self.done = False

    def finish(self, result=None, error=None):
        """Set the outcome; the caller then notifies Coordinator.finished."""
        self.result, self.error = result, error
        self.done = True


class SetState:
    """The coordinator's view of one process set (identical on its members)."""

    def __init__(self, set_id, ranks, me, neg, data):
        self.id, self.ranks = set_id, list(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(me) if me in self.ranks else -1
        self.neg, self.data = neg, data          # None on non-members
        self.incoming = []                       # submitted, not yet seen by a round (lock)
        self.inflight = set()                    # names in flight here (lock)
        self.unsent = []                         # uncached requests for the next full round
        self.claimed = {}                        # cache bit -> Op pending here
        self.waiting = {}                        # name -> Op in the table
        self.table = {}                          # name -> {rank: sig}, in insertion order
        self.cache = []                          # bit -> (name, sigs by rank, {rank: sig})
        self.lookup = {}                         # (name, my sig) -> bit
        self.by_name = {}                        # name -> bit
        self.joined = []                         # ranks that joined, in order

    @property
    def member(self):
        return self.rank >= 0


class Coordinator:
    """One per hvd.init().  world: the communicator hvd.init was given."""

    def __init__(self, world, timeline=None):
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.threshold = config.get("HOROVOD_FUSION_THRESHOLD")
        self.cycle_s = max(0.0, config.get("HOROVOD_CYCLE_TIME")) / 1000.0
        self.capacity = max(0, config.get("HOROVOD_CACHE_CAPACITY"))
        self.timeout = config.get("COMMRT_TIMEOUT")
        self.always_spin = config.get("COMMRT_HOROVOD_SPIN")
        self.waiters = 0                         # callers blocked in wait() (finished's lock)
        self._spinning = True                    # what set_spin last set on the communicators
        self.timeline = timeline
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.finished = threading.Condition(threading.Lock())   # some ops are done
        self._idle = False                       # the loop waits on `wake` (lock)
        self._pausing = False                    # the loop sleeps out a cycle on `wake` (lock)
        self._hurry = False                      # a caller began to wait: round now (lock)
        self._progress = False                   # the last cycle's rounds ran something
        self.stopping = False
        self.broken = None                       # HorovodInternalError once the job broke
        self.sets = {}
        self.next_set_id = 1
        self._fusion = {}
        self._running = []                       # ops of the round being run
        self._cycle_start = 0.0
        # counters the tests and the benchmark read: rounds, full negotiations, fused buffers
        self.stats = {"rounds": 0, "negotiations": 0, "cached": 0, "buffers": 0, "tensors": 0,
                      "max_fused": 0}
        # the global set: its own contexts for negotiation and data, split off the
        # caller's communicator here, before the thread starts (one thread per comm)
        neg = world.split(0)
        data = world.split(0)
        self.sets[0] = SetState(0, range(self.size), self.rank, neg, data)
        self._set_spin(self.always_spin)
        _shorten_switch_interval()
        self.thread = threading.Thread(target=self._main, name="horovod-coordinator",
                                       daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ caller side
    def submit(self, kind, name, sig, bufs, set_id=0):
        """Queue an operation -> Op (its event is set when it has finished)."""
        with self.lock:
            if self.broken is not None:
                raise HorovodInternalError(str(self.broken))
            if self.stopping:
                raise HorovodInternalError("Horovod has been shut down")
            ps = self.sets.get(set_id)
            if ps is None:
                raise ValueError(f"process set {set_id} is not registered")
            if not ps.member:
                raise ValueError(f"rank {self.rank} is not in process set {set_id} "
                                 f"(ranks {ps.ranks})")
            if ps.rank in ps.joined and kind != JOIN:
                raise ValueError("this rank has joined: it submits nothing more until every "
                                 "rank has joined")
            if name in ps.inflight:
                raise ValueError(f"Requested to {kind} a tensor with the same name as another "
                                 f"tensor that is currently being processed: {name!r}")
            op = Op(kind, name, sig, bufs, ps)
            ps.inflight.add(name)
            ps.incoming.append(op)
            if self._idle:                       # wake the loop once, not per tensor
                self._idle = False
                self.wake.notify()
        if self.timeline is not None:
            self.timeline.start(name, "NEGOTIATE_" + kind.upper())
        return op

    def wait(self, op):
        """Block until op finished; its result, or its error raised."""
        if not op.done:
            with self.lock:
                # this rank's caller has submitted what it will before it waits: the
                # next round need not wait out the cycle (once: a caller that keeps
                # waiting for what other ranks have not submitted gets rounds a cycle
                # apart, not a busy loop)
                self._hurry = True
                if self._pausing:
                    self.wake.notify()
            with self.finished:
                self.waiters += 1                # the coordinator may spin now (_round)
                try:
                    ok = self.finished.wait_for(lambda: op.done, self.timeout)
                finally:
                    self.waiters -= 1
                if not ok:
                    raise HorovodInternalError(f"{op.kind} {op.name!r} did not finish within "
                                               f"COMMRT_TIMEOUT={self.timeout:g} s")
        if op.error is not None:
            raise op.error
        return op.result

    def stop(self):
        """Leave the job: the round that carries the stop ends the loop everywhere."""
        with self.lock:
            self.stopping = True
            self.wake.notify()
        self.thread.join(self.timeout)
        self._fail_all(HorovodInternalError("Horovod has been shut down"))

    # ------------------------------------------------------------ the loop
    def _main(self):
        try:
            while self._cycle():
                pass
        except BaseException as exc:             # a lost peer, an abort, a bug: the job broke
            self._break(exc)
            return
        if not self.stopping:                    # another rank called shutdown()
            err = HorovodInternalError("Horovod has been shut down: another rank called "
                                       "hvd.shutdown()")
            with self.lock:
                self.broken = err
            self._fail_all(err)

    def _cycle(self):
        with self.lock:
            busy = any(ps.incoming or ps.unsent or ps.claimed or ps.waiting or ps.joined
                       for ps in self.sets.values())
            if not busy and not self.stopping:
                self._idle = True
                self.wake.wait(IDLE_S)
                self._idle = False
            stopping = self.stopping
            if self.cycle_s and not stopping and not self._hurry:
                # rounds start at most once a cycle, as Horovod's: what is submitted
                # within one cycle is negotiated, and fused, together; a caller that
                # starts waiting ends the pause (wait()).  While a caller waits, the
                # next round starts at once after a round that finished something (its
                # result may be one round away; the other ranks' coordinators pace
                # it), else within WAIT_CYCLE_S: a long cycle spaces the rounds only
                # while the caller computes
                pause = self.cycle_s
                if self.waiters:
                    pause = 0.0 if self._progress else min(pause, WAIT_CYCLE_S)
                left = self._cycle_start + pause - time.monotonic()
                if left > 0:
                    self._pausing = True
                    self.wake.wait(left)
                    self._pausing = False
            self._hurry = False
        self._cycle_start = time.monotonic()
        self._progress = False
        if self.timeline is not None:
            self.timeline.cycle()
        for set_id in sorted(self.sets):
            ps = self.sets.get(set_id)
            if ps is None or not ps.member:
                continue
            if not self._round(ps, stopping) and set_id == 0:
                return False
        return True

    def _round(self, ps, stopping):
        """One negotiation round of process set ps; False when the job stops."""
        with self.lock:
            new, ps.incoming = ps.incoming, []
        use_cache = self.capacity > 0 and not ps.joined
        for op in new:
            bit = ps.lookup.get((op.name, op.sig)) if use_cache else None
            if bit is None or op.kind == JOIN:
                ps.unsent.append(op)
            else:
                ps.claimed[bit] = op
        vec = np.zeros(2 + len(ps.cache), np.uint8)
        vec[0] = 0 if (ps.unsent or (ps.claimed and not use_cache)) else 1
        vec[1] = 0 if (stopping and ps.id == 0) else 1
        if use_cache:
            for bit in ps.claimed:
                vec[2 + bit] = 1
        spin = self.always_spin or self.waiters > 0
        if spin is not self._spinning:
            self._set_spin(spin)
        ps.neg.all_reduce(vec, op=MIN)
        self.stats["rounds"] += 1
        ready = []
        if use_cache:
            cache, claimed = ps.cache, ps.claimed
            for bit in np.flatnonzero(vec[2:]).tolist():
                name, _, sigs, info = cache[bit]
                ready.append((name, sigs, claimed.pop(bit), info))
            self.stats["cached"] += len(ready)
        if vec[0] == 0:
            self.stats["negotiations"] += 1
            ready += self._negotiate(ps)
        if ready:
            self._progress = True
        self._run(ps, ready)
        self._notify_finished()
        return vec[1] == 1

    def _negotiate(self, ps):
        """The full round: gather uncached requests, complete table entries."""
        mine = [(op.name, op.sig, None) for op in ps.unsent]
        mine += [(op.name, None, bit) for bit, op in ps.claimed.items()]
        for op in ps.unsent:
            ps.waiting[op.name] = op
        for op in ps.claimed.values():
            ps.waiting[op.name] = op
        ps.unsent, ps.claimed = [], {}
        everyone = ps.neg.all_gather_obj(mine)
        joined_now = []
        for r, items in enumerate(everyone):
            for name, sig, bit in items:
                if sig is None:
                    sig = ps.cache[bit][1][r]
                if name == JOIN:
                    ps.joined.append(r)
                    joined_now.append(r)
                else:
                    ps.table.setdefault(name, {})[r] = sig
        ready = []
        if ps.joined and len(ps.joined) == ps.size:
            last = max(joined_now) if joined_now else ps.joined[-1]
            ready.append((JOIN, last, ps.waiting.pop(JOIN, None), None))
            ps.joined = []
        active = [r for r in range(ps.size) if r not in ps.joined]
        for name in list(ps.table):
            sigs = ps.table[name]
            if all(r in sigs for r in active):
                del ps.table[name]
                ready.append((name, sigs, ps.waiting.pop(name, None), None))
        return ready

    # ------------------------------------------------------------ running
    def _run(self, ps, ready):
        """Run the ready operations in the same order on every rank.  ready: (name,
        sigs, op, info) with info from the response cache, or None for a table entry
        (checked and remembered here); a JOIN carries the last rank in sigs."""
        self._running = [item[2] for item in ready if item[2] is not None]
        fusable, others = [], []
        for name, sigs, op, info in ready:
            if name == JOIN:
                self._done(ps, op, result=sigs)
                continue
            if info is None:                     # cache entries were checked on entry
                full = sigs if isinstance(sigs, dict) else dict(enumerate(sigs))
                error = _check(name, full, ps)
                if error is not None:
                    self._done(ps, op, error=HorovodMismatchError(error))
                    continue
                info = self._remember(ps, name, full)
                sigs = full
            if info[0] == "allreduce":
                fusable.append((name, sigs, op, info))
            else:
                others.append((name, sigs, op))
        if fusable:
            for group in self._fuse(fusable):
                self._allreduce(ps, group)
        for name, sigs, op in others:
            self._timeline_begin(op, name, sigs)
            try:
                result = _RUNNERS[next(iter(sigs.values()))[0]](self, ps, name, sigs, op)
            except HorovodMismatchError as exc:
                self._done(ps, op, error=exc)
                continue
            self._done(ps, op, result=result)

    def _remember(self, ps, name, sigs):
        """Enter a negotiated entry in the response cache (the same on every rank)
        -> its info: (kind, fusion key, bytes), what a cached round needs of it."""
        sig = next(iter(sigs.values()))
        kind = sig[0]
        info = (kind, (sig[1], sig[3], sig[4], sig[5]), _nbytes(sig)) if kind == "allreduce" \
            else (kind, None, 0)
        if kind not in _CACHEABLE or ps.joined or not self.capacity or len(sigs) != ps.size:
            return info
        row = tuple(sigs[r] for r in range(ps.size))
        bit = ps.by_name.get(name)
        if bit is None:
            if len(ps.cache) >= self.capacity:
                return info
            bit = len(ps.cache)
            ps.cache.append(None)
            ps.by_name[name] = bit
        else:
            ps.lookup.pop((name, ps.cache[bit][1][ps.rank]), None)
        ps.cache[bit] = (name, row, sigs, info)  # sigs: the rank -> sig dict _run takes
        ps.lookup[(name, row[ps.rank])] = bit
        return info

    def _fuse(self, items):
        """Groups of ready allreduces that reduce together: one dtype, op and scaling,
        at most `threshold` bytes (a larger tensor goes alone)."""
        threshold = self.threshold
        if not threshold:
            return [[(name, sigs, op)] for name, sigs, op, _ in items]
        groups, open_ = [], {}
        for name, sigs, op, (_, key, nbytes) in items:
            grp = open_.get(key)
            if grp is None or grp[1] + nbytes > threshold:
                grp = open_[key] = [[], 0]
                groups.append(grp)
            grp[0].append((name, sigs, op))
            grp[1] += nbytes
        return [g[0] for g in groups]

    def _allreduce(self, ps, group):
        sig = next(iter(group[0][1].values()))
        dtype, code, pre, post = _dtype(sig[1]), sig[3], sig[4], sig[5]
        arrays = []
        for name, sigs, op in group:
            self._timeline_begin(op, name, sigs)
            arrays += op.bufs if op is not None else [np.zeros(s, dtype) for s in sig_shapes(sigs)]
        stats = self.stats
        stats["buffers"] += 1
        stats["tensors"] += len(arrays)
        if len(arrays) > stats["max_fused"]:
            stats["max_fused"] = len(arrays)
        if len(arrays) == 1:
            flat = data = arrays[0].reshape(-1)
        else:
            total = sum(a.size for a in arrays)
            flat = self._fusion_buffer(dtype, total)
            data = flat[:total]
            self._activity(group, "MEMCPY_IN_FUSION_BUFFER")
            # one C call packs them all (the arrays are flat views, or zeros of any shape)
            np.concatenate([a if a.ndim == 1 else a.reshape(-1) for a in arrays], out=data)
            flat[total:] = 0
        self._activity(group, "GLOO_ALLREDUCE")
        _scale(data, pre)
        if flat.size:
            ps.data.all_reduce(flat, op=_KERNEL_OP[code])
        if code == AVERAGE:
            _divide(data, ps.size)
        _scale(data, post)
        if len(arrays) > 1:
            self._activity(group, "MEMCPY_OUT_FUSION_BUFFER")
            off = 0
            for a in arrays:
                end = off + a.size
                (a if a.ndim == 1 else a.reshape(-1))[:] = data[off:end]
                off = end
        self._done_group(ps, [op for _, _, op in group])

    def _set_spin(self, spin):
        """Let the waits of every set's communicators spin, or not (see the module text)."""
        self._spinning = spin
        for ps in list(self.sets.values()):
            for comm in (ps.neg, ps.data):
                if comm is not None:
                    set_spin(comm, spin)

    def _fusion_buffer(self, dtype, n):
        """A view of n elements or a little more (see _padded) of the dtype's buffer."""
        n = _padded(n)
        buf = self._fusion.get(dtype)
        if buf is None or buf.size < n:
            # 64-aligned on every rank, and on huge pages from 2 MiB: the buffer
            # the fused all-reduces read each other's memory from
            buf = self._fusion[dtype] = aligned_empty(max(n, 1024), dtype)
        return buf[:n]

    def _done_group(self, ps, ops):
        """_done for a fused group's ops, under one lock."""
        ops = [op for op in ops if op is not None]
        with self.lock:
            for op in ops:
                ps.inflight.discard(op.name)
        for op in ops:
            if self.timeline is not None:
                self.timeline.end(op.name)
            op.finish()

    def _done(self, ps, op, result=None, error=None):
        if op is None:                           # a joined rank took part with zeros
            return
        with self.lock:
            ps.inflight.discard(op.name)
        if self.timeline is not None:
            self.timeline.end(op.name)
        op.finish(result, error)

    # ------------------------------------------------------------ failure
    def _break(self, exc):
        msg = (f"Horovod's coordinator on rank {self.rank} stopped: {type(exc).__name__}: {exc}"
               if not isinstance(exc, HorovodInternalError) else str(exc))
        err = HorovodInternalError(msg)
        with self.lock:
            self.broken = err
        for ps in list(self.sets.values()):
            for comm in (ps.neg, ps.data):
                _abort(comm, msg)
        self._fail_all(err)

    def _fail_all(self, err):
        with self.lock:
            ops, self._running = self._running, []
            for ps in self.sets.values():
                ops += ps.incoming + ps.unsent + list(ps.claimed.values()) + list(ps.waiting.values())
                ps.incoming, ps.unsent, ps.claimed, ps.waiting = [], [], {}, {}
                ps.inflight.clear()
        for op in ops:
            if not op.done:
                op.finish(error=err)
        self._notify_finished()

    def _notify_finished(self):
        with self.finished:
            self.finished.notify_all()

    # ------------------------------------------------------------ timeline
    def _timeline_begin(self, op, name, sigs):
        if self.timeline is not None:
            self.timeline.end(name)
            self.timeline.start(name, next(iter(sigs.values()))[0].upper())

    def _activity(self, group, activity):
        if self.timeline is not None:
            for name, _, _ in group:
                self.timeline.activity(name, activity)


def _padded(n):
    """n rounded up to one of four sizes per power of two (at most 25% more).  A
    fused buffer's length is whatever was ready in a round, so it differs from round
    to round; the collectives prepare a plan per buffer shape, and a length drawn
    from a few sizes reuses one where exact lengths would prepare a new one nearly
    every round.  The padding is zeroed and reduced with the rest, then ignored."""
    if n <= 1024:
        return n
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step


def _shorten_switch_interval():
    """The coordinator needs the GIL between messages while the caller runs Python
    (backward's hooks); Python hands it over only every switch interval, 5 ms by
    default: lower it to COMMRT_SWITCH_INTERVAL_US, as async collectives do."""
    us = config.get("COMMRT_SWITCH_INTERVAL_US")
    if us > 0 and sys.getswitchinterval() > us * 1e-6:
        sys.setswitchinterval(us * 1e-6)


def _abort(comm, reason):
    if comm is None:
        return
    abort = getattr(comm, "abort", None) or comm._abort
    try:
        abort(reason)
    except Exception:        # best effort: a closed or already failed communicator
        pass


# ---------------------------------------------------------------- signatures
# allreduce:     ("allreduce", dtype, shapes, op, prescale, postscale)
# reducescatter: ("reducescatter", dtype, shapes, op, prescale, postscale)
# broadcast:     ("broadcast", dtype, shapes, root)
# allgather:     ("allgather", dtype, shapes)          first dims may differ
# alltoall:      ("alltoall", dtype, shape, splits)    first dim and splits differ
# barrier:       ("barrier",); add_set: ("add_set", ranks); remove_set: ("remove_set", id)

def sig_shapes(sigs):
    return next(iter(sigs.values()))[2]


def _nbytes(sig):
    return _dtype(sig[1]).itemsize * sum(math.prod(s) for s in sig[2])


def describe(sig):
    kind = sig[0]
    if kind in ("allreduce", "reducescatter"):
        return (f"{kind} of {_dt(sig[1])} {_shape_text(sig[2])} with op {_OP_NAMES[sig[3]]}"
                f" (prescale {sig[4]:g}, postscale {sig[5]:g})")
    if kind == "broadcast":
        return f"broadcast of {_dt(sig[1])} {_shape_text(sig[2])} from root {sig[3]}"
    if kind in ("allgather", "alltoall"):
        return f"{kind} of {_dt(sig[1])} {_shape_text(sig[2])}"
    return kind


def _dtype(code):
    """The NumPy dtype of a signature's dtype code ("bfloat16": commrt's BFLOAT16)."""
    dt = _DTYPES.get(code)
    if dt is None:
        if code == "bfloat16":
            from commrt.kernels.bfloat16 import BFLOAT16
            dt = BFLOAT16
        else:
            dt = np.dtype(code)
        _DTYPES[code] = dt
    return dt


_DTYPES = {}             # code -> dtype: np.dtype(code) per tensor per round adds up


def _dt(code):
    return "bfloat16" if code == "bfloat16" else np.dtype(code).name


_OP_NAMES = {AVERAGE: "Average", SUM_OP: "Sum", ADASUM: "Adasum", MIN_OP: "Min",
             MAX_OP: "Max", PRODUCT: "Product"}


def _shape_text(shapes):
    if shapes and isinstance(shapes[0], tuple):
        return ", ".join(str(tuple(s)) for s in shapes)
    return str(tuple(shapes))


def _check(name, sigs, ps):
    """Why the ranks' signatures for `name` cannot run together, or None."""
    ranks = sorted(sigs)
    first = ranks[0]
    a = sigs[first]
    for r in ranks[1:]:
        b = sigs[r]
        if a[0] != b[0]:
            return _mismatch(name, "operations", first, a, r, b)
        if a[0] in _CACHEABLE and a[1] != b[1]:
            return _mismatch(name, "data types", first, a, r, b)
        kind = a[0]
        if kind in ("allreduce", "reducescatter", "broadcast"):
            if a[2] != b[2]:
                return _mismatch(name, "tensor shapes", first, a, r, b)
            if a[3:] != b[3:]:
                what = "root ranks" if kind == "broadcast" else "reduction ops or scale factors"
                return _mismatch(name, what, first, a, r, b)
        elif kind == "allgather":
            if len(a[2]) != len(b[2]) or any(len(x) != len(y) or x[1:] != y[1:]
                                              for x, y in zip(a[2], b[2])):
                return _mismatch(name, "tensor shapes (beyond the first dimension)", first, a,
                                 r, b)
        elif kind == "alltoall":
            if len(a[2]) != len(b[2]) or a[2][1:] != b[2][1:]:
                return _mismatch(name, "tensor shapes (beyond the first dimension)", first, a,
                                 r, b)
        elif a != b:
            return _mismatch(name, "requests", first, a, r, b)
    if ps.joined and a[0] in ("allgather", "alltoall", "reducescatter"):
        return (f"{a[0]} {name!r}: not supported with Join at this time (ranks "
                f"{sorted(ps.joined)} have joined), as in Horovod")
    if a[0] == "broadcast" and a[3] in ps.joined:
        return f"broadcast {name!r}: root rank {a[3]} has joined and has no tensor to send"
    return None


def _mismatch(name, what, ra, a, rb, b):
    return (f"Mismatched {what} for {name!r}: rank {ra} submitted {describe(a)}, "
            f"rank {rb} submitted {describe(b)}")


# ---------------------------------------------------------------- arithmetic
# float16 (Compression.fp16) is scaled by the C loop: NumPy's float16 arithmetic
# converts one element at a time in software, ~60x slower (0.9 ms to average a
# 110 K-element fused buffer, against 0.01-0.02), the same bits
_F16 = np.dtype(np.float16)


def _scale(flat, factor):
    if factor != 1.0 and flat.size:
        if flat.dtype.kind in "iu":
            flat[:] = np.trunc(flat * factor).astype(flat.dtype)
        elif flat.dtype == _F16 and _f16_scale() is not None:
            _f16_scale()(flat, factor)
        else:
            flat *= flat.dtype.type(factor)


def _divide(flat, n):
    if n == 1 or not flat.size:
        return
    if flat.dtype.kind in "iu":                  # Horovod truncates toward zero
        flat[:] = np.sign(flat) * (np.abs(flat) // n)
    elif flat.dtype == _F16 and _f16_scale() is not None:
        _f16_scale()(flat, n, True)
    else:
        flat /= flat.dtype.type(n)


_F16_SCALE = []


def _f16_scale():
    """kernels' f16_scale where this build has the float16 loops, else None."""
    if not _F16_SCALE:
        from commrt.kernels import _combine

        _F16_SCALE.append(_combine.f16_scale if _combine.HAVE_FLOAT16 else None)
    return _F16_SCALE[0]


# ---------------------------------------------------------------- the other kinds
def _allgather(co, ps, name, sigs, op):
    sig0 = next(iter(sigs.values()))
    dtype = _dtype(sig0[1])
    outs = []
    for i, shape in enumerate(sig0[2]):
        rest = tuple(shape[1:])
        dims = [sigs[r][2][i][0] if r in sigs else 0 for r in range(ps.size)]
        mine = op.bufs[i] if op is not None else np.zeros((0,) + rest, dtype)
        outs.append(gather_rows(ps.data, mine.reshape((dims[ps.rank],) + rest), dims, rest,
                                dtype))
    return outs


def gather_rows(comm, mine, dims, rest, dtype):
    """All ranks' rows in rank order; first dimensions `dims` may differ."""
    row = int(np.prod(rest)) if rest else 1
    out = np.empty((sum(dims),) + rest, dtype)
    if out.size:
        comm.all_gatherv(out.reshape(-1), np.ascontiguousarray(mine).reshape(-1),
                         [d * row for d in dims])
    return out


def _broadcast(co, ps, name, sigs, op):
    sig0 = next(iter(sigs.values()))
    bufs = op.bufs if op is not None else [np.zeros(s, _dtype(sig0[1])) for s in sig0[2]]
    for b in bufs:
        if b.size:
            ps.data.broadcast(b.reshape(-1), root=sig0[3])
    return None


def _alltoall(co, ps, name, sigs, op):
    sig0 = next(iter(sigs.values()))
    dtype, rest = _dtype(sig0[1]), tuple(sig0[2][1:])
    row = int(np.prod(rest)) if rest else 1
    n, me = ps.size, ps.rank
    splits = [sigs[q][3] if q in sigs else (0,) * n for q in range(n)]
    received = [splits[q][me] for q in range(n)]
    out = np.empty((sum(received),) + rest, dtype)
    src = (op.bufs[0] if op is not None else np.zeros((0,) + rest, dtype)).reshape(-1)
    if any(any(s) for s in splits):
        ps.data.all_to_allv(out.reshape(-1), src, [k * row for k in splits[me]],
                            [k * row for k in received])
    return out, np.array(received, np.int32)


def scatter_rows(dim0, n):
    """Rows of each rank in Horovod's reducescatter: the first dim0 % n get one more."""
    q, r = divmod(dim0, n)
    return [q + (1 if i < r else 0) for i in range(n)]


def _reducescatter(co, ps, name, sigs, op):
    sig0 = next(iter(sigs.values()))
    dtype, code, pre, post = _dtype(sig0[1]), sig0[3], sig0[4], sig0[5]
    outs = []
    for i, shape in enumerate(sig0[2]):
        buf = op.bufs[i] if op is not None else np.zeros(shape, dtype)
        flat = np.array(buf, dtype, copy=True).reshape(-1)
        _scale(flat, pre)
        if flat.size:
            ps.data.all_reduce(flat, op=_KERNEL_OP[code])
        if code == AVERAGE:
            _divide(flat, ps.size)
        _scale(flat, post)
        rows = scatter_rows(shape[0], ps.size)
        lo = sum(rows[:ps.rank])
        rowlen = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        outs.append(flat[lo * rowlen:(lo + rows[ps.rank]) * rowlen]
                    .reshape((rows[ps.rank],) + tuple(shape[1:])).copy())
    return outs


def _barrier(co, ps, name, sigs, op):
    ps.data.barrier()


def _add_set(co, ps, name, sigs, op):
    ranks = list(next(iter(sigs.values()))[1])
    neg = ps.data.new_group(ranks)
    data = ps.data.new_group(ranks)
    with co.lock:
        set_id = co.next_set_id
        co.next_set_id += 1
        co.sets[set_id] = SetState(set_id, ranks, co.rank, neg, data)
    for comm in (neg, data):
        if comm is not None:
            set_spin(comm, co._spinning)
    return set_id


def _remove_set(co, ps, name, sigs, op):
    set_id = next(iter(sigs.values()))[1]
    with co.lock:
        gone = co.sets.pop(set_id, None)
    if gone is not None:
        err = HorovodInternalError(f"process set {set_id} was removed")
        for pending in gone.incoming + gone.unsent + list(gone.claimed.values()) + \
                list(gone.waiting.values()):
            pending.finish(error=err)
    return None

_RUNNERS = {"allgather": _allgather, "broadcast": _broadcast, "alltoall": _alltoall,
            "reducescatter": _reducescatter, "barrier": _barrier, "add_set": _add_set,
            "remove_set": _remove_set}
