"""The torch.distributed backend "commrt": a Python ProcessGroup over a Communicator.

``dist.init_process_group("commrt")`` calls ``create`` (registered by
``commrt.torch.register`` with ``extended_api=True, devices=["cpu"]``) on every
rank; ``new_group`` calls it again on the new group's members only, which
derive a sub-communicator of the one world by themselves (no messages: its
context is a hash of the world context, torch's group name and the members).

Every operation maps onto one commrt collective or point-to-point call
(docs/torch.md has the table).  ``opts.asyncOp`` False (a blocking
``dist.all_reduce``): the call runs now in the caller's thread, on the
NumPy fast paths, and returns a completed Work.  True (DDP's buckets,
``async_op=True``): the collective queues on the communicator's own worker
(commrt's async collectives, in call order) and its done-callback, on that
worker, copies results where they belong and completes the Work's Future
(or hands that to a completer thread once Python code has chained on it:
see _Fut); DDP's communication hooks chain on that Future.  No lock is held while
waiting.  commrt's errors reach torch as DistBackendError (a RuntimeError)
with commrt's error as ``__cause__``.
"""
import datetime
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp, Work
from torch.distributed import distributed_c10d as _c10d
from torch.futures import Future

import commrt.collectives as C
from commrt.errors import CommError, CommTimeoutError
from commrt.torch._tensor import as_numpy, contiguous, in_place_ok
from commrt.torch._tensor import view as _view

__all__ = ["ProcessGroupCommrt", "create"]

_RED = ReduceOp.RedOpType
_OPS = {_RED.SUM: C.ReduceOp.SUM, _RED.PRODUCT: C.ReduceOp.PROD, _RED.MIN: C.ReduceOp.MIN,
        _RED.MAX: C.ReduceOp.MAX, _RED.AVG: C.ReduceOp.AVG, _RED.BAND: C.ReduceOp.BAND,
        _RED.BOR: C.ReduceOp.BOR, _RED.BXOR: C.ReduceOp.BXOR}
_SUM, _CSUM = _RED.SUM, C.ReduceOp.SUM
_all_reduce = C.all_reduce          # the blocking fast path calls it without Communicator's level
# allreduce keeps the NumPy view of its last tensor up to this size (and so the
# tensor alive): where the per-call cost counts, never a large buffer
_LAST_BYTES = 64 << 10
_AllreduceOptions = _c10d.AllreduceOptions
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)     # torch's default: commrt's own detection instead


# -- errors -------------------------------------------------------------------------------
def torch_error(exc):
    """commrt's error as torch code expects it: DistBackendError (RuntimeError) with
    the original as __cause__; argument errors stay ValueError/TypeError."""
    if isinstance(exc, (dist.DistBackendError, ValueError, TypeError)) and not isinstance(
            exc, CommError):
        return exc
    # a timeout leads with "Timed out ", as gloo's does (torch's suite matches the words)
    lead = "commrt: Timed out - " if isinstance(exc, CommTimeoutError) else "commrt: "
    err = dist.DistBackendError(f"{lead}{exc}")
    err.__cause__ = exc          # also when it reaches torch through a Future
    return err


def _reraise(exc):
    err = torch_error(exc)
    if err is exc:
        raise exc
    raise err from exc


# -- Work ----------------------------------------------------------------------------------
class _Work(Work):
    """A Work whose Future commrt completes (see the module text)."""

    def __init__(self, fut, source=-1):
        super().__init__()
        self._fut = fut
        self._source = source

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        try:
            self._fut.value()
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    def result(self):
        return self._fut.value()

    def source_rank(self):
        return self._source

    def _source_rank(self):
        return self._source

    def synchronize(self):
        pass


class _Fut(Future):
    """The Future of an asynchronous collective: it knows whether Python code has
    chained work on it (then, add_done_callback), which must not run on the
    communicator's worker (see _Completer); while none has, the worker
    completes it itself, one thread hop sooner (DDP's reducer waits on the
    Future in C++, so a completer thread's wake-up was a second hop, each a
    scheduling delay when ranks outnumber cores)."""

    def __init__(self):
        super().__init__()
        self._lock = threading.RLock()   # re-entered by a callback chained from the worker
        self._chained = False

    def then(self, callback):
        with self._lock:
            self._chained = True
        return super().then(callback)

    def add_done_callback(self, callback):
        with self._lock:
            self._chained = True
        super().add_done_callback(callback)


class _CollWork(_Work):
    """The Work of an asynchronous collective.

    The communicator's worker runs the collective, then (still on the worker)
    moves the results into place and sets ``_ready``: wait() returns on that,
    one thread hop after the data landed.  The Future is completed by whichever
    comes first: wait() (its callbacks then run in the waiting thread), the
    worker itself while no Python callback is chained on it (_Fut), or a
    completer thread (never the worker once one is: see _Completer)."""

    def __init__(self, result):
        super().__init__(_Fut())
        self._value = result
        self._exc = None
        self._ready = threading.Event()
        self._worker = None             # the thread that runs it (set by _run)

    def finished(self, req, after):
        """On the worker, once the collective has finished."""
        exc = req.error
        if exc is None and after is not None:
            try:
                after()
            except BaseException as e:  # noqa: BLE001 - delivered through wait()/the Future
                exc = e
        self._exc = None if exc is None else torch_error(exc)
        self._ready.set()
        fut = self._fut
        with fut._lock:                 # then() now waits until the Future is complete
            if not fut._chained:
                self.complete()         # C++ waiters and C++ callbacks only
                return
        _COMPLETER.put(self)

    def complete(self):
        """Complete the Future once, from any thread but the worker."""
        fut = self._fut
        if fut.done():
            return
        try:
            if self._exc is not None:
                fut.set_exception(self._exc)
            else:
                fut.set_result(self._value)
        except RuntimeError:
            if not fut.done():      # not the other thread's completion racing this one
                raise

    def wait(self, timeout=None):
        secs = None if not timeout else timeout.total_seconds()
        if not self._ready.is_set() and self._worker is threading.current_thread():
            raise dist.DistBackendError(
                "commrt: Work.wait on the communicator's worker thread (a callback run "
                "there) for a collective queued behind the one it finishes would never "
                "return; chain it with Future.then instead")
        if not self._ready.wait(secs):
            raise dist.DistBackendError(f"commrt: Timed out - Work.wait after {timeout}")
        self.complete()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return self._ready.is_set()

    def is_success(self):
        return self._ready.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return self._value


class _Completer:
    """Threads that complete async Works' Futures.

    Not the communicator's worker itself: a Future's callbacks run where it is
    completed, and some block on further collectives (PowerSGD's hook waits on
    an all-reduce inside its then()), which would deadlock the worker that has
    to run them.  For the same reason a completer blocked in a callback must
    not hold up the next completion: when none is idle another one starts (as
    Gloo keeps several worker threads), up to MAX.  stop() ends them; each
    generation of threads has its own queue and idle count, so a thread of an
    old generation finishing late never counts as idle in the new one (it
    did: the next put then found "an idle thread" that did not exist, and its
    Future was never completed, the repeated init/destroy hang)."""

    MAX = 16

    def __init__(self):
        self._lock = threading.Lock()
        self._gen = None            # [queue, threads, idle] of the running generation

    def put(self, work):
        with self._lock:
            gen = self._gen
            if gen is None:
                import queue

                gen = self._gen = [queue.SimpleQueue(), [], 0]
            if gen[2] == 0 and len(gen[1]) < self.MAX:
                t = threading.Thread(target=self._run, args=(gen,), daemon=True,
                                     name=f"commrt-torch-futures-{len(gen[1])}")
                gen[1].append(t)
                gen[2] += 1
                t.start()
            gen[2] -= 1                     # claimed by this item
            gen[0].put(work)

    def _run(self, gen):
        q = gen[0]
        while True:
            work = q.get()
            if work is None:
                return
            try:
                work.complete()
            except BaseException:  # noqa: BLE001 - a callback's error stays in its Future
                pass
            with self._lock:
                gen[2] += 1

    def stop(self):
        """End the threads once what is queued is completed (a world closing)."""
        with self._lock:
            gen, self._gen = self._gen, None
        if gen is None:
            return
        for _ in gen[1]:
            gen[0].put(None)
        me = threading.current_thread()
        for t in gen[1]:
            if t is not me:
                t.join(5.0)


_COMPLETER = _Completer()


class _DoneWork(Work):
    """The Work of a call that finished before returning (blocking calls): no
    Future until someone asks for it.  A process group returns its one
    instance for every blocking call (a pybind construction is ~0.5 µs of an
    8-byte all_reduce's few): torch's blocking wrappers wait on it and drop it,
    and its result() is the latest blocking call's."""

    def __init__(self, result):
        Work.__init__(self)
        self._value = result

    def wait(self, timeout=None):
        return True

    def get_future(self):
        fut = Future()
        fut.set_result(self._value)
        return fut

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._value

    def source_rank(self):
        return -1

    _source_rank = source_rank

    def synchronize(self):
        pass


def _done(result):
    fut = Future()
    fut.set_result(result)
    return _Work(fut)


class _P2PWork(_Work):
    """A point-to-point Work: commrt Requests, waited for in wait(); its Future is
    completed by a waiter thread the first time someone asks for it."""

    def __init__(self, reqs, result, finish=None, source=-1, timeout=None):
        super().__init__(Future(), source)
        self._reqs, self._result, self._finish, self._timeout = reqs, result, finish, timeout
        self._lock = threading.Lock()
        self._waiter = None

    def _complete(self):
        with self._lock:
            if self._fut.done():
                return
            try:
                for q in self._reqs:
                    st = q.wait(self._timeout)
                    if self._source < 0 and st is not None and hasattr(st, "source"):
                        self._source = st.source
                if self._finish is not None:
                    self._finish()
                self._fut.set_result(self._result)
            except BaseException as exc:  # noqa: BLE001 - delivered through the Future
                self._fut.set_exception(torch_error(exc))

    def wait(self, timeout=None):
        self._complete()
        self._fut.wait()
        return True

    def is_completed(self):
        if not self._fut.done() and all(q.test() for q in self._reqs):
            self._complete()
        return self._fut.done()

    def get_future(self):
        if self._waiter is None and not self._fut.done():
            self._waiter = threading.Thread(target=self._complete, daemon=True,
                                            name="commrt-torch-p2p")
            self._waiter.start()
        return self._fut

    def source_rank(self):
        self._complete()
        return self._source

    _source_rank = source_rank


class _CoalescedWork(_Work):
    """The Work of a coalescing block (batch_isend_irecv): all its Works."""

    def __init__(self, works):
        super().__init__(Future())
        self._works = works

    def wait(self, timeout=None):
        for w in self._works:
            w.wait()
        if not self._fut.done():
            self._fut.set_result(None)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def get_future(self):
        futs = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futs).then(lambda _: None) if futs else _done(None)._fut


# -- helpers -------------------------------------------------------------------------------
def _one(tensors, what):
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(f"commrt {what}: expected one tensor, got {len(tensors)}")
    return tensors[0]


def _host(t, writable):
    """(NumPy view or staged copy, copy-back or None)."""
    if t.is_contiguous() and not t.requires_grad:
        try:
            return t.numpy(), None          # zero copy, ~0.3 us (commrt flattens it)
        except (RuntimeError, TypeError):
            pass                            # bfloat16, conj/neg bits, not on the CPU: below
    if in_place_ok(t):
        return _view(t), None
    staged, back = contiguous(t)
    return as_numpy(staged), (back if writable else None)


def _check_dtypes(tensors, dtype, what):
    for t in tensors:
        if t.dtype != dtype:
            raise ValueError(f"commrt {what}: tensors must all be {dtype}, got {t.dtype}")


def _flat_of(tensors):
    """A new flat NumPy buffer holding the tensors' elements one after another."""
    dtype = tensors[0].dtype if tensors else torch.float32
    total = sum(t.numel() for t in tensors)
    buf = torch.empty(total, dtype=dtype)
    off = 0
    for t in tensors:
        n = t.numel()
        buf[off:off + n].copy_(t.reshape(-1))
        off += n
    return buf


def _unflatten_into(tensors, buf):
    off = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(buf[off:off + n].view(t.shape))
            off += n


class ProcessGroupCommrt(ProcessGroup):
    """torch.distributed ProcessGroup over a commrt Communicator (see the module text)."""

    def __init__(self, store, comm, timeout=DEFAULT_TIMEOUT, world=None, name=""):
        super().__init__(comm.rank, comm.size)      # (store, rank, size) is not subclassable
        self._store = store
        self.comm = comm
        self._world = world                 # the world PG closes the world communicator
        self._timeout = None if timeout is None or timeout >= DEFAULT_TIMEOUT else \
            timeout.total_seconds()
        if self._timeout is not None:        # init_process_group(timeout=) bounds every call
            C.state_of(comm).timeout = self._timeout
        self._coalescing = None
        self._done = _DoneWork(None)        # the Work of every blocking call (see _DoneWork)
        self._last = None                   # (tensor, data_ptr, numel, dtype, view) of allreduce
        self._closed = False
        self._name = name
        self._desc = ""

    # -- identity ---------------------------------------------------------------------
    def getBackendName(self):
        return "commrt"

    def _get_backend_name(self):
        return "commrt"

    @property
    def supports_splitting(self):
        return False

    # torch keeps a group's name on its backends, and a Python ProcessGroup has none
    # (torch uses it as its own backend): the name lives here, or destroy_process_group
    # of a sub-group fails with "ProcessGroup name not set".
    def _set_group_name(self, name):
        self._name = name

    @property
    def group_name(self):
        return self._name

    def _set_group_desc(self, desc):
        self._desc = desc

    @property
    def group_desc(self):
        return self._desc

    def __repr__(self):
        return f"<ProcessGroupCommrt rank {self.comm.rank} of {self.comm.size}>"

    # -- running ----------------------------------------------------------------------
    def _op(self, opts_or_op):
        rop = getattr(opts_or_op, "reduceOp", opts_or_op)
        kind = getattr(rop, "op", rop)      # a ReduceOp, or a bare RedOpType (ReduceOp.SUM)
        if kind == _RED.PREMUL_SUM:
            return C.ReduceOp.SUM, rop.factor
        try:
            return _OPS[kind], None
        except KeyError:
            raise ValueError(f"commrt: unsupported ReduceOp {rop}") from None

    def _run(self, launch, after, result, async_op):
        """launch(async_op) -> CollRequest | None; after() moves results into place."""
        if not async_op:
            try:
                launch(False)
                if after is not None:
                    after()
            except Exception as exc:  # noqa: BLE001
                _reraise(exc)
            return self._finished(result)
        work = _CollWork(result)
        try:
            req = launch(True)
        except Exception as exc:  # noqa: BLE001
            _reraise(exc)
        work._worker = C.state_of(self.comm)._worker
        req.add_done_callback(lambda r: work.finished(r, after))
        return self._record(work)

    def _finished(self, result):
        """The Work of a blocking call, done now (no Future until one is asked for)."""
        work = self._done
        work._value = result
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _record(self, work):
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    @staticmethod
    def _async(opts):
        return True if opts is None else bool(getattr(opts, "asyncOp", True))

    # -- all-reduce -------------------------------------------------------------------
    def allreduce(self, tensors, opts=None, *args):
        # dist.all_reduce(t) of one dense CPU tensor, SUM, blocking: straight to
        # commrt's prepared plan (~1 us), nothing built per call
        if type(opts) is _AllreduceOptions and not opts.asyncOp and type(tensors) is list \
                and len(tensors) == 1 and self._coalescing is None and opts.reduceOp == _SUM:
            t = tensors[0]
            m = self._last
            # the same small tensor as last time, its memory, size and type unchanged:
            # its NumPy view again (t.numpy() builds one per call, ~0.6 us)
            if m is not None and m[0] is t and t.data_ptr() == m[1] and t.numel() == m[2] \
                    and t.dtype is m[3] and t.is_contiguous():
                a = m[4]
            else:
                try:
                    # numpy() refuses what commrt cannot use in place (requires_grad,
                    # bfloat16, conj/neg bits, not on the CPU); is_contiguous() a sparse t
                    a = t.numpy() if t.is_contiguous() else None
                except (RuntimeError, TypeError):
                    a = None
                if a is not None and a.nbytes <= _LAST_BYTES:
                    self._last = (t, t.data_ptr(), t.numel(), t.dtype, a)
            if a is not None:
                try:
                    _all_reduce(self.comm, a, _CSUM)
                except Exception as exc:  # noqa: BLE001
                    _reraise(exc)
                work = self._done
                work._value = tensors
                return work
        return self._allreduce(tensors, opts)

    def _allreduce(self, tensors, opts):
        if isinstance(opts, (ReduceOp, _RED)):
            opts, rop = None, opts
        else:
            rop = opts.reduceOp if opts is not None else ReduceOp.SUM
        t = _one(tensors, "allreduce")
        tensors = [t] if isinstance(tensors, torch.Tensor) else tensors
        op, factor = self._op(rop)
        if t.layout is torch.sparse_coo:
            return self._sparse_allreduce(t, op, tensors)
        if factor is not None:
            with torch.no_grad():
                t.mul_(factor)
        a, back = _host(t, True)
        comm = self.comm
        return self._run(lambda aop: comm.all_reduce(a, op, async_op=aop), back, tensors,
                         self._async(opts))

    def _sparse_allreduce(self, t, op, tensors):
        """SUM of sparse COO tensors (as gloo): every rank's indices and values are
        gathered (variable sizes), summed and coalesced, and copied into t."""
        if op is not C.ReduceOp.SUM:
            raise ValueError(f"commrt: sparse all-reduce supports SUM only, not {op.name}")
        comm = self.comm
        try:
            s = t.coalesce()
            idx = s.indices().contiguous()
            val = s.values().contiguous()
            nnz = np.array([idx.shape[1]], np.int64)
            counts = np.empty(comm.size, np.int64)
            comm.all_gather(counts, nnz)
            sd, dense = idx.shape[0], val.shape[1:]
            per = int(np.prod(dense)) if len(dense) else 1
            all_idx = torch.empty(sd * int(counts.sum()), dtype=torch.int64)
            comm.all_gatherv(as_numpy(all_idx), as_numpy(idx), [int(c) * sd for c in counts])
            all_val = torch.empty(per * int(counts.sum()), dtype=val.dtype)
            comm.all_gatherv(as_numpy(all_val), as_numpy(val), [int(c) * per for c in counts])
        except Exception as exc:  # noqa: BLE001
            _reraise(exc)
        parts, off = [], 0
        for c in counts.tolist():
            i = all_idx[off * sd:(off + c) * sd].view(sd, c)
            v = all_val[off * per:(off + c) * per].view((c,) + tuple(dense))
            parts.append(torch.sparse_coo_tensor(i, v, t.shape))
            off += c
        total = parts[0]
        for q in parts[1:]:
            total = total + q
        with torch.no_grad():
            t.copy_(total.coalesce())
        return self._record(_done(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        op, factor = self._op(opts.reduceOp if opts is not None else ReduceOp.SUM)
        if not tensors:
            return _done(tensors)
        _check_dtypes(tensors, tensors[0].dtype, "allreduce_coalesced")
        buf = _flat_of(tensors)
        if factor is not None:
            buf.mul_(factor)
        a = as_numpy(buf)
        comm = self.comm
        return self._run(lambda aop: comm.all_reduce(a, op, async_op=aop),
                         lambda: _unflatten_into(tensors, buf), tensors, self._async(opts))

    # -- broadcast / reduce ---------------------------------------------------------------
    def broadcast(self, tensors, opts=None, *args):
        if isinstance(opts, int):
            opts, root = None, opts
        else:
            root = opts.rootRank if opts is not None else 0
        t = _one(tensors, "broadcast")
        tensors = [t] if isinstance(tensors, torch.Tensor) else tensors
        a, back = _host(t, self.comm.rank != root)
        comm = self.comm
        return self._run(lambda aop: comm.broadcast(a, root, async_op=aop), back, tensors,
                         self._async(opts))

    def reduce(self, tensors, opts=None, *args):
        if isinstance(opts, int):
            root, rop, opts = opts, (args[0] if args else ReduceOp.SUM), None
        else:
            root = opts.rootRank if opts is not None else 0
            rop = opts.reduceOp if opts is not None else ReduceOp.SUM
        t = _one(tensors, "reduce")
        tensors = [t] if isinstance(tensors, torch.Tensor) else tensors
        op, factor = self._op(rop)
        if factor is not None:
            with torch.no_grad():
                t.mul_(factor)
        a, back = _host(t, True)
        comm = self.comm
        return self._run(lambda aop: comm.reduce(a, root, op, async_op=aop), back, tensors,
                         self._async(opts))

    # -- gathers ----------------------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        outs = output_tensors[0] if output_tensors and isinstance(output_tensors[0], list) \
            else output_tensors
        if len(outs) != self.comm.size:
            raise ValueError(f"commrt allgather: expected {self.comm.size} output tensors, "
                             f"got {len(outs)}")
        _check_dtypes(outs, t.dtype, "allgather")
        a, _ = _host(t, False)
        counts = [o.numel() for o in outs]
        if counts[self.comm.rank] != t.numel():
            raise ValueError(f"commrt allgather: output {self.comm.rank} has {counts[self.comm.rank]} "
                             f"elements, the input {t.numel()}")
        buf = torch.empty(sum(counts), dtype=t.dtype)
        out = as_numpy(buf)
        comm = self.comm
        if len(set(counts)) == 1:
            def launch(aop):
                return comm.all_gather(out, a, async_op=aop)
        else:
            def launch(aop):
                return comm.all_gatherv(out, a, counts, async_op=aop)
        return self._run(launch, lambda: _unflatten_into(outs, buf), output_tensors,
                         self._async(opts))

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != self.comm.size * input.numel() or output.dtype != input.dtype:
            raise ValueError(f"commrt all_gather_into_tensor: output must hold {self.comm.size} x "
                             f"{input.numel()} elements of {input.dtype}, got {output.numel()} of "
                             f"{output.dtype}")
        a, _ = _host(input, False)
        out, back = _host(output, True)
        comm = self.comm
        return self._run(lambda aop: comm.all_gather(out, a, async_op=aop), back, [output],
                         self._async(opts))

    _allgather_base = all_gather_single
    allgather_into_tensor = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[q][i] receives rank q's input_list[i]: one all-gather per tensor."""
        n = self.comm.size
        if len(output_lists) != n:
            raise ValueError(f"commrt allgather_coalesced: expected {n} output lists, got "
                             f"{len(output_lists)}")
        for i, t in enumerate(input_list):
            self.allgather([[output_lists[q][i] for q in range(n)]], [t],
                           _sync_opts(_c10d.AllgatherOptions()))
        return _done(output_lists)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, _sync_opts(_c10d.AllgatherOptions()))
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None, *args):
        if isinstance(opts, int):
            root, opts = opts, None
        else:
            root = opts.rootRank if opts is not None else 0
        t = _one(input_tensors, "gather")
        a, _ = _host(t, False)
        comm = self.comm
        outs = None
        if comm.rank == root:
            outs = output_tensors[0] if output_tensors and isinstance(output_tensors[0], list) \
                else output_tensors
            if len(outs) != comm.size:
                raise ValueError(f"commrt gather: expected {comm.size} output tensors, got "
                                 f"{len(outs)}")
            _check_dtypes(outs, t.dtype, "gather")
        counts = [o.numel() for o in outs] if outs is not None else None
        buf = torch.empty(sum(counts) if counts else 0, dtype=t.dtype)
        out = as_numpy(buf) if outs is not None else None

        def launch(aop):
            return comm.gatherv(a, out, counts, root, async_op=aop)

        after = (lambda: _unflatten_into(outs, buf)) if outs is not None else None
        return self._run(launch, after, output_tensors, self._async(opts))

    def scatter(self, output_tensors, input_tensors, opts=None, *args):
        if isinstance(opts, int):
            root, opts = opts, None
        else:
            root = opts.rootRank if opts is not None else 0
        t = _one(output_tensors, "scatter")
        comm = self.comm
        out, back = _host(t, True)
        flat, counts = None, None
        if comm.rank == root:
            ins = input_tensors[0] if input_tensors and isinstance(input_tensors[0], list) \
                else input_tensors
            if len(ins) != comm.size:
                raise ValueError(f"commrt scatter: expected {comm.size} input tensors, got "
                                 f"{len(ins)}")
            _check_dtypes(ins, t.dtype, "scatter")
            counts = [i.numel() for i in ins]
            flat = as_numpy(_flat_of(ins))

        def launch(aop):
            return comm.scatterv(out, flat, counts, root, async_op=aop)
        return self._run(launch, back, output_tensors, self._async(opts))

    # -- reduce-scatter ---------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None, *args):
        t = _one(output_tensors, "reduce_scatter")
        ins = input_tensors[0] if input_tensors and isinstance(input_tensors[0], list) \
            else input_tensors
        if len(ins) != self.comm.size:
            raise ValueError(f"commrt reduce_scatter: expected {self.comm.size} input tensors, "
                             f"got {len(ins)}")
        _check_dtypes(ins, t.dtype, "reduce_scatter")
        if any(i.numel() != t.numel() for i in ins):
            raise ValueError("commrt reduce_scatter: every input tensor must have the output's "
                             "number of elements")
        rop = opts.reduceOp if opts is not None and not isinstance(opts, ReduceOp) else (
            opts if isinstance(opts, ReduceOp) else ReduceOp.SUM)
        return self._reduce_scatter(t, _flat_of(ins), rop, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        if input.numel() != self.comm.size * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"commrt reduce_scatter_tensor: input must hold {self.comm.size} x "
                             f"{output.numel()} elements of {output.dtype}, got {input.numel()} "
                             f"of {input.dtype}")
        return self._reduce_scatter(output, input, opts.reduceOp if opts is not None
                                    else ReduceOp.SUM, opts)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor = reduce_scatter_single

    def _reduce_scatter(self, output, input, rop, opts):
        op, factor = self._op(rop)
        if factor is not None:
            input = input * factor
        a, _ = _host(input, False)
        out, back = _host(output, True)
        comm = self.comm
        return self._run(lambda aop: comm.reduce_scatter(out, a, op, async_op=aop), back,
                         [output], self._async(opts) if not isinstance(opts, ReduceOp) else True)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            o2 = _c10d.ReduceScatterOptions()
            o2.reduceOp = opts.reduceOp
            self.reduce_scatter_single(o, i, _sync_opts(o2))
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all-to-all -------------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        n = self.comm.size
        if output.dtype != input.dtype:
            raise ValueError(f"commrt all_to_all_single: output is {output.dtype}, input "
                             f"{input.dtype}")
        row_out = output[0].numel() if output.dim() and output.shape[0] else 0
        row_in = input[0].numel() if input.dim() and input.shape[0] else 0
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(f"commrt all_to_all_single: input and output must hold the "
                                 f"same multiple of {n} elements")
            a, _ = _host(input, False)
            out, back = _host(output, True)
            comm = self.comm
            return self._run(lambda aop: comm.all_to_all(out, a, async_op=aop), back,
                             [output], self._async(opts))
        if not input_split_sizes:
            input_split_sizes = [input.shape[0] // n] * n
        if not output_split_sizes:
            output_split_sizes = [output.shape[0] // n] * n
        send = [int(s) * row_in for s in input_split_sizes]
        recv = [int(s) * row_out for s in output_split_sizes]
        if len(send) != n or len(recv) != n or sum(send) != input.numel() or \
                sum(recv) != output.numel():
            raise ValueError(f"commrt all_to_all_single: split sizes {output_split_sizes} / "
                             f"{input_split_sizes} do not match the tensors of {n} ranks")
        a, _ = _host(input, False)
        out, back = _host(output, True)
        comm = self.comm
        return self._run(lambda aop: comm.all_to_allv(out, a, send, recv, async_op=aop), back,
                         [output], self._async(opts))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.comm.size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"commrt alltoall: expected {n} input and {n} output tensors")
        dtype = input_tensors[0].dtype
        _check_dtypes(list(input_tensors) + list(output_tensors), dtype, "alltoall")
        send = [t.numel() for t in input_tensors]
        recv = [t.numel() for t in output_tensors]
        ins = as_numpy(_flat_of(input_tensors))
        buf = torch.empty(sum(recv), dtype=dtype)
        out = as_numpy(buf)
        comm = self.comm
        return self._run(lambda aop: comm.all_to_allv(out, ins, send, recv, async_op=aop),
                         lambda: _unflatten_into(output_tensors, buf), output_tensors,
                         self._async(opts))

    # -- barrier ----------------------------------------------------------------------------
    def barrier(self, opts=None):
        comm = self.comm
        return self._run(lambda aop: comm.barrier(async_op=aop), None, [],
                         self._async(opts) if not isinstance(opts, datetime.timedelta) else False)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier(_sync_opts(_c10d.BarrierOptions()))

    # -- point to point -----------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        t = _one(tensors, "send")
        a, _ = _host(t, False)
        try:
            req = self.comm.isend(a, int(dst), _tag(tag))
        except Exception as exc:  # noqa: BLE001
            _reraise(exc)
        return self._record(_P2PWork([req], tensors, timeout=self._timeout))

    def recv(self, tensors, src, tag=0):
        return self._recv(tensors, int(src), tag)

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, -1, tag)

    def _recv(self, tensors, src, tag):
        t = _one(tensors, "recv")
        a, back = _host(t, True)
        from commrt.comm import ANY_SOURCE
        try:
            req = self.comm.irecv(a, ANY_SOURCE if src < 0 else src, _tag(tag))
        except Exception as exc:  # noqa: BLE001
            _reraise(exc)
        return self._record(_P2PWork([req], tensors, back, source=src, timeout=self._timeout))

    # -- coalescing -------------------------------------------------------------------------
    def _start_coalescing(self, device=None):
        if self._coalescing is not None:
            raise RuntimeError("commrt: coalescing already started")
        self._coalescing = []

    def _end_coalescing(self, device=None):
        works, self._coalescing = self._coalescing or [], None
        return _CoalescedWork(works)

    # -- lifetime -----------------------------------------------------------------------
    def _has_hooks(self):
        return False

    def _wait_for_pending_works(self):
        if self.comm.state.get("collectives") is not None and C.state_of(self.comm).pending:
            self.comm.barrier()

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        self._last = None
        st = self.comm.state.get("collectives")
        if st is not None:
            st.stop_worker()
        if self._world is None:
            _drop_world(self.comm)

    def abort(self):
        self.shutdown()

    def _set_sequence_number_for_group(self):
        pass


def _tag(tag):
    tag = int(tag)
    if tag < 0:
        raise ValueError(f"commrt: tag must be >= 0, got {tag}")
    return tag


def _sync_opts(opts):
    opts.asyncOp = False
    return opts


# -- the creator ----------------------------------------------------------------------------
_worlds = {}          # id(world comm) -> world comm, while its default group lives
_current = [None]     # the world communicator of the current default group


def _drop_world(comm):
    if _current[0] is comm:
        _current[0] = None
    _COMPLETER.stop()
    try:
        comm.close()
    except Exception:  # noqa: BLE001 - closing a broken world must not mask the caller's error
        pass


def create(opts, backend_options=None):
    """Backend.register_backend's creator (extended_api=True)."""
    from commrt.torch._bootstrap import build_world

    timeout = opts.timeout
    members = list(opts.global_ranks_in_group or [])
    group = opts.group_id
    if not members or (_current[0] is None):
        # the default group: build the world
        # the bootstrap waits for every rank to start: at least a minute, whatever
        # the (per-operation) timeout, so a short one does not fail a slow start
        timeout_s = min(max(timeout.total_seconds(), 60.0), 300.0) if timeout else 300.0
        try:
            comm = build_world(opts.store, opts.group_rank, opts.group_size, timeout_s)
        except Exception as exc:  # noqa: BLE001
            _reraise(exc)
        if _current[0] is not None:
            _drop_world(_current[0])
        _current[0] = comm
        if members and members != list(range(comm.size)):
            sub = comm.channel.derive(members, ("torch", group))
            return ProcessGroupCommrt(opts.store, sub, timeout, world=comm, name=group)
        return ProcessGroupCommrt(opts.store, comm, timeout, name=group)
    world = _current[0]
    sub = world.channel.derive(members, ("torch", group))
    if sub is None:
        raise RuntimeError(f"commrt: rank {world.rank} asked to join group {group!r} of ranks "
                           f"{members}, which it is not in")
    return ProcessGroupCommrt(opts.store, sub, timeout, world=world, name=group)
