# cython: language_level=3
"""commrt.transport._core: the compiled transport.

One Engine per process and world.  It owns an epoll set, the shared-memory
and TCP channels to every peer, the matching queues and a progress thread.
Python hands it connected file descriptors (commrt.transport.connect makes
and authenticates them) and then only posts requests.

Each entry from Python follows the same three beats: describe the buffer
(buffer protocol; other kinds are staged by commrt.transport.buffers), take
the lock without the GIL and post or wait, then turn the C result into a
Status or an exception.  Files included below, in dependency order:

    structs.pxi   wire header and C structures
    queues.pxi    matching queues, completion, poisoned contexts
    shm.pxi       shared-memory rings, doorbells, process_vm_readv
    tcp.pxi       TCP framing and the receive state machine
    engine.pxi    message handling, progress, sleeping, progress thread
    chain.pxi     persistent exchange chains (after the Engine: they use its internals)
"""
cimport cython
from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer)
from cpython.exc cimport PyErr_CheckSignals
from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memmove, memset, strlen, strncpy

from sysdecl cimport *

import os
import weakref

include "structs.pxi"
include "queues.pxi"
include "shm.pxi"
include "tcp.pxi"
include "engine.pxi"

ANY_SOURCE = -1
ANY_TAG = -1
HEADER_BYTES = HDR_BYTES
WIRE_VERSION = HDR_VERSION        # what connect.py checks at connect time
FAILURE_CODES = range(FAILURE_CODE_MIN, FAILURE_CODE_MAX + 1)   # = commrt.errors.FailureCode
SHM_CONTROL_BYTES = CTL_PAGE


def shm_segment_bytes(uint64_t ring_bytes):
    """Bytes of a shared-memory pair segment with rings of ring_bytes."""
    return CTL_PAGE + 2 * ring_bytes


cdef class Status:
    """What a completed receive (or send) reports: source, tag, nbytes, and the
    two 64-bit words of the sender's meta (meta, meta2; docs/transport.md)."""
    cdef readonly int source
    cdef readonly int tag
    cdef readonly object nbytes
    cdef readonly object meta
    cdef readonly object meta2

    def __init__(self, source, tag, nbytes, meta=0, meta2=0):
        self.source = source
        self.tag = tag
        self.nbytes = nbytes
        self.meta = meta
        self.meta2 = meta2

    def __iter__(self):
        return iter((self.source, self.tag, self.nbytes))

    def __eq__(self, other):
        if isinstance(other, Status):
            return (self.source, self.tag, self.nbytes, self.meta, self.meta2) == \
                   (other.source, other.tag, other.nbytes, other.meta, other.meta2)
        return NotImplemented

    def __hash__(self):
        return hash((self.source, self.tag, self.nbytes, self.meta, self.meta2))

    def __repr__(self):
        return f"Status(source={self.source}, tag={self.tag}, nbytes={self.nbytes})"


# no_gc_clear: Cython's generated tp_clear would drop the reference a Py_buffer
# holds (Py_CLEAR(view.obj)) without releasing the buffer, when the garbage
# collector breaks a cycle through this object: the exporter then dies with an
# export open ("deallocated bytearray object has exported buffers"; a memoryview
# in that state crashes the process) and __dealloc__'s release finds nothing.
# Cycles through these objects are broken at the other objects in them.
@cython.no_gc_clear
cdef class Request:
    """A non-blocking operation.  Holds its buffer until it completes.

    wait(timeout=None) -> Status; test() -> bool.  Errors surface in the
    thread that waits or tests, naming rank, operation and tag."""
    cdef req_t r
    cdef Engine eng
    cdef Py_buffer view
    cdef bint has_view
    cdef object keep            # staging buffer for non-host memory
    cdef object on_done         # copies staged data back (GPU receive)
    cdef object rank_of         # world rank -> communicator rank (None: identity)
    cdef object _status
    cdef object _error

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False

    @property
    def op(self):
        return "send" if self.r.kind == K_SEND else "recv"

    @property
    def done(self):
        return self.r.state >= S_DONE

    def test(self):
        """True when the operation has finished (raising if it failed)."""
        if self.r.state < S_DONE:
            self.eng._test(self)
        if self.r.state < S_DONE:
            return False
        self._finish()
        return True

    def wait(self, timeout=None, spin=True):
        """Block until done, or raise CommTimeoutError after `timeout` seconds
        (default COMMRT_TIMEOUT; the request stays posted: wait again, or
        cancel it).  spin=False sleeps at once instead of spinning first: for
        a helper thread whose caller computes meanwhile."""
        if self.r.state < S_DONE:
            self.eng._wait(self, timeout, spin)
        return self._finish()

    def cancel(self):
        """Cancel a receive that has not matched a message (MPI_Cancel): it is
        unposted, so the next matching message goes to a later receive, and
        its wait/test raise CancelledError.  Returns True if it was cancelled;
        False if it had matched already (it then completes normally: wait for
        it), had finished, or is a send.  A send cannot be cancelled: once
        posted it is on its way (eager) or announced to the receiver
        (rendezvous), and it completes when the receiver takes it or fails
        when the peer is lost, the communicator aborted or closed."""
        if self.r.state >= S_DONE or self.r.kind != K_RECV:
            return False
        return self.eng._unpost(self)

    @property
    def cancelled(self):
        """True once cancel() unposted this receive."""
        return self.r.state == S_ERROR and self.r.err == E_CANCELLED

    @property
    def status(self):
        return self._finish() if self.r.state >= S_DONE else None

    cdef object _finish(self):
        if self._status is not None:
            return self._status
        if self._error is not None:
            raise self._error
        self.eng._sweep()
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
        if self.r.state == S_ERROR:
            self._error = self.eng._make_error(self)
            self.keep = None
            raise self._error
        if self.on_done is not None:
            self.on_done()
            self.on_done = None
        self.keep = None
        src = self.r.st_src if self.r.kind == K_RECV else self.eng.rank
        if self.rank_of is not None and src >= 0:
            src = self.rank_of(src)
        nbytes = self.r.nbytes
        self._status = Status(src, self.r.st_tag if self.r.kind == K_RECV else self.r.tag,
                              nbytes, self.r.meta, self.r.meta2)
        return self._status

    def __repr__(self):
        state = {S_NEW: "new", S_PENDING: "pending", S_ACTIVE: "active",
                 S_DONE: "done", S_ERROR: "failed"}.get(self.r.state, "?")
        who = f"to {self.r.peer}" if self.r.kind == K_SEND else f"from {self.r.peer}"
        return f"<Request {self.op} {who} tag={self.r.tag} {self.r.cap} B {state}>"


COPY_BY_RECEIVER = COPIER_RECEIVER    # irecv(copier=...): who copies a large shm message
COPY_BY_SENDER = COPIER_SENDER        # (commrt.comm.Channel's RECEIVER, SENDER, EXCHANGE)
COPY_IN_EXCHANGE = COPIER_EXCHANGE


COPIERS = (COPIER_AUTO, COPIER_RECEIVER, COPIER_SENDER, COPIER_EXCHANGE)


cdef inline int check_copier(int copier) except -1:
    """The check of a receive's copier (irecv, irecv_reduce; a chain message's
    is part of its format, make_chain)."""
    if copier not in COPIERS:
        raise ValueError(f"copier must be 0, 1 (receiver), 2 (sender) or 3 (exchange), "
                         f"got {copier}")
    return 0


cdef class Engine:
    """The transport of one rank: channels to every peer, matching, progress.

    Python-visible state (the set of live requests) changes only with the
    GIL held; the C state only with E.lock held (see engine.pxi).

    Lifetime (uvloop style: every state and what may happen in it):

    * open (after __cinit__; channels added, start() called): every method
      works.
    * closed (after close(), or after fork in the child, _forget_in_child):
      every method raises CommError("... closed"), except close() (a no-op)
      and poison_of.  close() fails every request still pending with
      CommError("... closed with this operation pending") -- a thread
      blocked in a wait is woken with it -- then releases the channels,
      descriptors, segments, queues and the progress thread.  The eng_t
      struct itself (lock, condition variables, flags) stays allocated until
      the Engine object is freed: a Request holds a reference to its Engine,
      so a thread still inside a wait, or a request waited on after close,
      only ever touches memory that is alive.  There is no reopening.
    * freed (__dealloc__): releases what close() did not, then the struct.

    Every Python entry takes the engine through _live(), which raises once
    closed; the C functions below it may assume an open engine except
    block() and progress(), which a woken waiter may run once after close
    (every peer is then marked lost and every request finished, so they do
    nothing)."""
    cdef eng_t *E
    cdef object __weakref__     # the fork handler's registry of engines
    cdef set live
    cdef list lent              # failed receives a lost peer might still write into: kept
    cdef readonly int rank
    cdef readonly int size
    cdef readonly double default_timeout
    # Fault a shared-memory pair's segment in when it is mapped (build_engine sets
    # it where the host's segments are small enough): otherwise the first pass
    # through each ring pays a page fault every 4 KiB on both sides, ~0.1 us a
    # message for the first 16 K zero-byte messages of a pair (1 MiB rings).
    cdef public bint shm_populate

    def __cinit__(self, int rank, int size, *, uint64_t eager_limit=16384, uint64_t chunk=262144,
                  double spin_us=50.0, double spin_max_us=10000.0, bint oversubscribed=False,
                  double oversub_spin_max_us=250.0,
                  double timeout=300.0, double progress_delay_us=1000.0,
                  uint64_t cma_min_bytes=12582912, uint64_t credit_bytes=4194304,
                  double heartbeat_s=0.5, double liveness_timeout_s=8.0):
        cdef epoll_event ev
        cdef pthread_condattr_t ca
        if size < 1 or rank < 0 or rank >= size:
            raise ValueError(f"rank {rank} out of range for world size {size}")
        self.E = <eng_t *>calloc(1, sizeof(eng_t))
        if self.E == NULL:
            raise MemoryError()
        self.E.peers = <peer_t *>calloc(size, sizeof(peer_t))
        if self.E.peers == NULL:
            raise MemoryError()
        self.rank = rank
        self.size = size
        self.default_timeout = timeout
        self.live = set()
        self.lent = []
        self.E.rank = rank
        self.E.size = size
        self.E.eager_limit = eager_limit
        # whole 64-byte multiples: a reduce-receive combines each chunk as it lands,
        # so a chunk must never split an element (every dtype's size divides 64)
        self.E.chunk = max(<uint64_t>64, chunk & ~(<uint64_t>63))
        self.E.cma_min = cma_min_bytes
        self.E.credit_bytes = max(credit_bytes, <uint64_t>MIN_CREDIT)
        if not heartbeat_s >= 0 or not liveness_timeout_s >= 0:
            raise ValueError(f"heartbeat_s and liveness_timeout_s must be >= 0, got "
                             f"{heartbeat_s} and {liveness_timeout_s}")
        self.E.beat_ns = <int64_t>(heartbeat_s * 1e9)
        self.E.silent_ns = <int64_t>(liveness_timeout_s * 1e9)
        self.E.spin_ns = <int64_t>(spin_us * 1000.0)
        self.E.spin_min_ns = self.E.spin_ns
        self.E.pt_delay_ns = <int64_t>(progress_delay_us * 1000.0)
        self.E.spin_max_ns = max(self.E.spin_ns, <int64_t>(spin_max_us * 1000.0))
        self.E.oversub_spin_max_ns = max(self.E.spin_ns, <int64_t>(oversub_spin_max_us * 1000.0))
        self.E.oversub = oversubscribed
        self.E.next_id = 1
        pthread_mutex_init(&self.E.lock, NULL)
        pthread_mutex_init(&self.E.beat_lock, NULL)
        pthread_condattr_init(&ca)
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC)
        pthread_cond_init(&self.E.done_cond, &ca)
        pthread_cond_init(&self.E.pt_cond, &ca)
        pthread_cond_init(&self.E.beat_cond, &ca)
        for i in range(size):
            self.E.peers[i].rank = i
            self.E.peers[i].fd = -1
            self.E.peers[i].peer_efd = -1
        self.E.epfd = epoll_create1(EPOLL_CLOEXEC)
        self.E.iofd = epoll_create1(EPOLL_CLOEXEC)
        self.E.doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        self.E.kickfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.E.epfd < 0 or self.E.iofd < 0 or self.E.doorbell < 0 or self.E.kickfd < 0:
            raise OSError(errno, "cannot create epoll/eventfd")
        ev.events = EPOLLIN
        ev.data.u64 = (<uint64_t>EV_IO) << 32
        epoll_ctl(self.E.epfd, EPOLL_CTL_ADD, self.E.iofd, &ev)
        ev.data.u64 = (<uint64_t>EV_DOORBELL) << 32
        epoll_ctl(self.E.epfd, EPOLL_CTL_ADD, self.E.doorbell, &ev)
        ev.data.u64 = (<uint64_t>EV_KICK) << 32
        epoll_ctl(self.E.epfd, EPOLL_CTL_ADD, self.E.kickfd, &ev)
        self.E.peers[rank].ops = &SELF_OPS
        self.E.peers[rank].tx_credit = <int64_t>self.E.credit_bytes    # messages to oneself
        _ENGINES.add(self)

    def __dealloc__(self):
        if self.E != NULL:
            if not self.E.released:
                self._release(False)
            self._free()

    cdef eng_t *_live(self) except NULL:
        """The engine's state, or CommError if it was closed."""
        if self.E == NULL or self.E.closed:
            raise _errors().CommError("the communicator is closed")
        return self.E

    # ------------------------------------------------------------ set-up
    @property
    def closed(self):
        """True once close() began (every later call raises CommError)."""
        return self.E == NULL or self.E.closed

    @property
    def doorbell_fd(self):
        """The eventfd shared-memory peers write to wake this rank."""
        return self._live().doorbell

    @property
    def eager_limit(self):
        return self._live().eager_limit

    @property
    def cma_min(self):
        """Smallest shared-memory message read with process_vm_readv where the
        receive leaves the copier to the transport (COMMRT_CMA_MIN_BYTES, auto
        resolved); smaller ones above the eager limit stream through the ring."""
        return self._live().cma_min

    @property
    def oversubscribed(self):
        """Whether this host's ranks of the job outnumber the cores they may run on
        (connect.build_engine): waiters yield and sleep soon, large messages
        are read earlier."""
        return bool(self._live().oversub)

    @property
    def credit_bytes(self):
        """Bytes of unexpected messages this rank holds for each peer (the
        eager credit it grants; COMMRT_UNEXPECTED_BYTES)."""
        return self.E.credit_bytes

    def add_tcp_peer(self, int rank, int fd, credit=None, lanes=()):
        """Adopt a connected, authenticated, non-blocking TCP socket (fd is owned from
        now on); credit: the bytes of unexpected messages the peer holds for us (its
        grant, told at connect time; None: the same as ours).  lanes: more such
        sockets to the same peer (owned too), extra streams that DATA is striped
        over (COMMRT_TCP_STREAMS, tcp.pxi), in the order both sides agree on."""
        cdef peer_t *p
        cdef peer_t *q
        cdef int k
        cdef int n = len(lanes)
        if n > MAX_LANES or (n and not 0 <= rank < (1 << 24)):
            for lfd in lanes:
                close(lfd)
            close(fd)
            raise ValueError(f"at most {MAX_LANES} extra TCP streams per peer (ranks < 2**24), "
                             f"got {n}")
        p = self._peer_for_setup(rank, credit)
        p.ops = &TCP_OPS
        p.fd = fd
        for lfd in lanes:                   # owned from now on: released with the channel
            if p.lanes == NULL:
                p.lanes = <peer_t *>calloc(n, sizeof(peer_t))
                if p.lanes == NULL:
                    for x in lanes:
                        close(x)
                    raise MemoryError()
            q = &p.lanes[p.nlanes]
            q.rank = rank
            q.ops = &TCP_OPS
            q.main = p
            q.lane_ix = p.nlanes
            q.fd = lfd
            q.heard_at = p.heard_at
            p.nlanes += 1
        for k in range(-1, p.nlanes):
            q = p if k < 0 else &p.lanes[k]
            q.rxbuf = <char *>malloc(RXBUF_BYTES)
            if q.rxbuf == NULL:
                raise MemoryError()
            _tcp_watch(self.E, q)
        _count_channel(self.E, p)

    def add_shm_peer(self, int rank, int memfd, uint64_t ring_bytes, int side, int peer_efd,
                     int live_fd, int pid, bint cma, credit=None):
        """Adopt a shared-memory pair: the memfd segment, the peer's doorbell
        eventfd, and the Unix socket whose EOF tells that the peer died;
        credit as for add_tcp_peer."""
        cdef epoll_event ev
        cdef peer_t *p = self._peer_for_setup(rank, credit)
        cdef size_t seg_len = CTL_PAGE + 2 * ring_bytes
        if ring_bytes & (ring_bytes - 1) or ring_bytes < 4 * CTL_PAGE:
            raise ValueError(f"ring_bytes must be a power of two >= 16 KiB, got {ring_bytes}")
        cdef int flags = MAP_SHARED | (MAP_POPULATE if self.shm_populate else 0)
        cdef void *seg = mmap(NULL, seg_len, PROT_READ | PROT_WRITE, flags, memfd, 0)
        if seg == MAP_FAILED:
            raise OSError(errno, f"mmap of the shared-memory segment for rank {rank}")
        close(memfd)
        shm_map(p, <char *>seg, seg_len, side, ring_bytes)
        p.ops = &SHM_OPS
        p.peer_efd = peer_efd
        p.fd = live_fd
        p.pid = pid
        p.cma_ok = cma
        ev.events = EPOLLIN | EPOLLRDHUP
        ev.data.u64 = (<uint64_t>EV_PEER << 32) | <uint64_t>rank
        if epoll_ctl(self.E.iofd, EPOLL_CTL_ADD, live_fd, &ev) != 0:
            raise OSError(errno, f"epoll_ctl for the liveness socket of rank {rank}")
        p.in_epoll = True
        _count_channel(self.E, p)
        if self.E.chunk > ring_bytes // 4:
            self.E.chunk = ring_bytes // 4
        if self.E.eager_limit > ring_bytes // 4 - HDR_SPACE:
            self.E.eager_limit = ring_bytes // 4 - HDR_SPACE

    cdef peer_t *_peer_for_setup(self, int rank, object grant) except NULL:
        self._live()
        cdef uint64_t credit = self.E.credit_bytes if grant is None else grant
        if rank < 0 or rank >= self.size or rank == self.rank:
            raise ValueError(f"peer rank {rank} invalid (world size {self.size}, own rank {self.rank})")
        if self.E.peers[rank].ops != NULL:
            raise ValueError(f"rank {rank} already has a channel")
        if credit < MIN_CREDIT:
            raise ValueError(f"rank {rank} grants {credit} bytes of credit, less than the "
                             f"{MIN_CREDIT} a channel needs")
        self.E.peers[rank].tx_credit = <int64_t>credit
        if self.E.eager_limit + MSG_COST > credit // 4:     # an eager message must always fit
            self.E.eager_limit = credit // 4 - MSG_COST
        return &self.E.peers[rank]

    def start(self, bint progress_thread=True):
        """Check every peer has a channel; start the progress thread."""
        self._live()
        missing = [i for i in range(self.size) if self.E.peers[i].ops == NULL]
        if missing:
            raise _errors().BootstrapError(f"rank {self.rank}: no channel to ranks {missing}")
        if progress_thread and not self.E.pt_running:
            if pthread_create(&self.E.pt, NULL, pt_main, <void *>self.E) != 0:
                raise OSError(errno, "cannot start the progress thread")
            self.E.pt_running = True
        # liveness (engine.pxi); heartbeat_s=0: no heartbeat thread at all, for a
        # harness whose peers are played by hand (they would be found silent)
        if self.size > 1 and self.E.beat_ns > 0 and not self.E.beat_running:
            if pthread_create(&self.E.beat, NULL, beat_main, <void *>self.E) != 0:
                raise OSError(errno, "cannot start the heartbeat thread")
            self.E.beat_running = True

    def peer_kind(self, int rank):
        """The channel's kind: 'self', 'shm' or 'tcp' (chan_ops_t.name), or 'none'."""
        self._live()
        self._check_rank(rank, "rank")
        if self.E.peers[rank].ops == NULL:
            return "none"
        return (<bytes>self.E.peers[rank].ops.name).decode()

    # ------------------------------------------------------------ posting
    cdef int _check_rank(self, int rank, str what) except -1:
        if rank < 0 or rank >= self.size:
            raise ValueError(f"{what} {rank} out of range: world size is {self.size}")
        return 0

    cdef int _describe(self, Request q, object buf, bint writable) except -1:
        cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT | (PyBUF_WRITABLE if writable else 0)
        if PyObject_CheckBuffer(buf):
            try:
                PyObject_GetBuffer(buf, &q.view, flags)
            except (BufferError, ValueError) as exc:
                raise ValueError(_buffer_problem(buf, writable, exc)) from None
            q.has_view = True
            if q.view.format != NULL and has_pointers(q.view.format):
                fmt = (<bytes>q.view.format).decode("ascii", "replace")
                PyBuffer_Release(&q.view)
                q.has_view = False
                raise TypeError(_pointer_problem(buf, fmt, writable))
            q.r.buf = <char *>q.view.buf
            q.r.cap = <uint64_t>q.view.len
            return 0
        from commrt.transport.buffers import stage
        host, back = stage(buf, writable)
        PyObject_GetBuffer(host, &q.view, flags)
        q.has_view = True
        q.r.buf = <char *>q.view.buf
        q.r.cap = <uint64_t>q.view.len
        q.keep = host
        q.on_done = back
        return 0

    cdef Request _new(self, int kind, object buf, int peer, uint32_t ctx, int tag, uint64_t meta,
                      object rank_of, uint64_t meta2=0):
        self._live()
        cdef Request q = Request.__new__(Request)
        q.eng = self
        q.rank_of = rank_of
        q.r.kind = kind
        q.r.peer = peer
        q.r.ctx = ctx
        q.r.tag = tag
        q.r.meta = meta
        q.r.meta2 = meta2
        q.r.err_rank = -1
        self._describe(q, buf, kind == K_RECV)
        if kind == K_SEND:
            q.r.nbytes = q.r.cap
        q.r.pyobj = <void *>q
        return q

    cdef void _post(self, Request q, bint wake_progress):
        cdef eng_t *E = self.E
        self.live.add(q)
        with nogil:
            pthread_mutex_lock(&E.lock)
            if E.closed:                    # closed by another thread since _new
                E.outstanding += 1
                fail(E, &q.r, E_SHUTDOWN, E.rank)
            elif q.r.kind == K_SEND:
                post_send(E, &q.r)
            else:
                post_recv(E, &q.r)
            if wake_progress and q.r.state < S_DONE and E.pt_parked and E.drivers == 0:
                wake_progress_thread(E)
            pthread_mutex_unlock(&E.lock)

    def isend(self, buf, int dst, uint32_t ctx=0, int tag=0, uint64_t meta=0, rank_of=None,
              uint64_t meta2=0):
        """Post a send; returns a Request.  meta, meta2: two 64-bit words the
        receiver's Status shows (the collectives' fingerprint)."""
        self._check_rank(dst, "dst")
        if tag < 0:
            raise ValueError(f"tag must be >= 0, got {tag}")
        q = self._new(K_SEND, buf, dst, ctx, tag, meta, rank_of, meta2)
        self._post(q, True)
        return q

    def irecv(self, buf, int src=-1, uint32_t ctx=0, int tag=-1, rank_of=None, int copier=0):
        """Post a receive (src/tag -1: any); returns a Request.  copier: which
        process copies a large message from a shared-memory peer, where
        process_vm_readv/writev are permitted: 0 the transport's choice
        (streamed through the ring below COMMRT_CMA_MIN_BYTES, both cores
        copying; read by this rank from there up), COPIER_RECEIVER (1) this
        rank reads it from the sender's buffer at any size where ranks share
        cores, COPIER_SENDER (2) the sender writes it into buf,
        COPIER_EXCHANGE (3) as 1, and with a core per rank from a quarter of
        COMMRT_CMA_MIN_BYTES up (this receive is half of an exchange: the
        rank's core also streams what it sends).  Other channels ignore it."""
        if src != -1:
            self._check_rank(src, "src")
        if tag < -1:
            raise ValueError(f"tag must be >= 0 or ANY_TAG, got {tag}")
        q = self._new(K_RECV, buf, src, ctx, tag, 0, rank_of)
        check_copier(copier)
        q.r.copier = copier
        self._post(q, True)
        return q

    def irecv_reduce(self, buf, int src, uint32_t ctx, int tag, uint64_t meta, size_t hook,
                     int itemsize, rank_of=None, uint64_t meta2=0, int copier=0):
        """Post a reduce-receive from src; returns a Request.

        Instead of copying the message into buf, the transport combines it
        in: hook(buf + off, piece, n) for each piece as it lands (a ring
        chunk, a CMA piece in a bounce buffer, a TCP read), hook being the
        address of a C function void f(void *dst, const void *src, int64_t n)
        over n elements of `itemsize` bytes.  Only the expected message is
        combined: meta and meta2 equal to `meta`, `meta2` and exactly len(buf) bytes.  Any other
        completes the request leaving buf untouched; its status then shows
        the meta and size that came, for the caller to report.  copier
        COPIER_SENDER (2): over shared memory, stream it whatever its size
        (where ranks have a core each), so the sender's core copies while
        this one combines (irecv's copier)."""
        self._check_rank(src, "src")
        if tag < 0:
            raise ValueError(f"tag must be >= 0, got {tag}")
        check_copier(copier)
        q = self._new(K_RECV, buf, src, ctx, tag, 0, rank_of)
        q.r.copier = copier
        self._arm_reduce(q, meta, hook, itemsize, meta2)
        self._post(q, True)
        return q

    cdef int _arm_reduce(self, Request q, uint64_t meta, size_t hook, int itemsize,
                         uint64_t meta2) except -1:
        if hook == 0 or not combinable_size(itemsize):
            raise ValueError(f"reduce-receive needs a combine function and an element size "
                             f"dividing 64, got hook={hook:#x}, itemsize={itemsize}")
        if q.keep is not None:
            raise ValueError("reduce-receive needs a host buffer (a GPU buffer would be "
                             "staged, and the combine would miss its contents)")
        if q.r.cap % <uint64_t>itemsize:
            raise ValueError(f"reduce-receive buffer of {q.r.cap} B is not a whole number of "
                             f"{itemsize}-byte elements")
        q.r.hook = <combine_fn>hook
        q.r.itemsize = itemsize
        q.r.want_meta = meta
        q.r.want_meta2 = meta2
        return 0

    def send(self, buf, int dst, uint32_t ctx=0, int tag=0, uint64_t meta=0, timeout=None,
             uint64_t meta2=0):
        """Blocking send: returns when buf may be reused.  A send that times out
        cannot be taken back (see Request.cancel): it may still be delivered,
        and buf stays in use until then."""
        if timeout is not None:
            check_timeout(timeout)
        self._check_rank(dst, "dst")
        if tag < 0:
            raise ValueError(f"tag must be >= 0, got {tag}")
        q = self._new(K_SEND, buf, dst, ctx, tag, meta, None, meta2)
        self._post(q, False)
        if q.r.state < S_DONE:
            self._wait(q, timeout)
        q._finish()

    def recv(self, buf, int src=-1, uint32_t ctx=0, int tag=-1, timeout=None, rank_of=None):
        """Blocking receive -> Status.  If it times out or is interrupted (Ctrl-C)
        before a message matched, the receive is cancelled: the next matching
        message goes to a later receive, never into this abandoned buffer."""
        if timeout is not None:
            check_timeout(timeout)
        if src != -1:
            self._check_rank(src, "src")
        if tag < -1:
            raise ValueError(f"tag must be >= 0 or ANY_TAG, got {tag}")
        q = self._new(K_RECV, buf, src, ctx, tag, 0, rank_of)
        self._post(q, False)
        if q.r.state < S_DONE:
            self._wait_or_unpost(q, timeout)
        return q._finish()

    cdef int _wait_or_unpost(self, Request q, object timeout) except -1:
        """Wait for a blocking receive; if the wait ends in an exception (timeout,
        Ctrl-C), cancel the receive first.  One that matched just as the time
        ran out is already receiving into buf: it gets one more timeout to
        finish, and its status is returned."""
        try:
            self._wait(q, timeout)
        except BaseException as exc:
            if self._unpost(q) or not isinstance(exc, _errors().CommTimeoutError):
                raise
            if q.r.state < S_DONE:
                self._wait(q, timeout)
        return 0

    cdef bint _unpost(self, Request q) except -1:
        """Remove a posted, unmatched receive (it fails with E_CANCELLED): True if
        it was removed, False if it had matched or finished."""
        cdef eng_t *E = self.E
        cdef bint done = False
        if E.released:
            return False
        with nogil:
            pthread_mutex_lock(&E.lock)
            if q.r.kind == K_RECV and q.r.state == S_PENDING:
                posted_remove(E, &q.r)
                complete(E, &q.r, E_CANCELLED)
                done = True
            pthread_mutex_unlock(&E.lock)
        self._sweep()
        return done

    def exchange(self, sendbuf, int dst, recvbuf, int src, uint32_t ctx, int tag, uint64_t meta,
                 double wait, rank_of=None, size_t hook=0, int itemsize=0, uint64_t meta2=0,
                 int copier=0):
        """Post a receive from src, then a send to dst, and wait for the receive
        up to `wait` seconds (spinning, then sleeping) -> (recv, send) Requests.
        With a hook the receive is a reduce-receive (irecv_reduce) expecting
        the send's meta and meta2.  copier: the receive's (irecv's).

        The building block of sendrecv and of every pairwise exchange in the
        collectives: one call instead of four (irecv, isend, two waits), and
        the receive is posted before the send, so two ranks exchanging with
        each other never queue the other's message as unexpected.  Neither
        request is raised on here: the caller waits or tests them."""
        self._check_rank(dst, "dst")
        self._check_rank(src, "src")
        if tag < 0:
            raise ValueError(f"tag must be >= 0, got {tag}")
        check_copier(copier)
        rq = self._new(K_RECV, recvbuf, src, ctx, tag, 0, rank_of)
        rq.r.copier = copier
        if hook:
            self._arm_reduce(rq, meta, hook, itemsize, meta2)
        sq = self._new(K_SEND, sendbuf, dst, ctx, tag, meta, rank_of, meta2)
        self._post(rq, False)
        self._post(sq, False)
        # (block() hands a send left behind to the progress thread as it returns)
        self._block_until(rq, now_ns() + <int64_t>(wait * 1e9), True)
        return rq, sq

    def exchange_chain(self, steps, tmp, int64_t count, uint32_t ctx, int tag, rank_of=None,
                       int64_t nbytes=-1, int itemsize=0, int64_t in_nbytes=-1):
        """Bind a chain of steps once -> ExchangeChain (chain.pxi).

        A step is ([(kind, peer, where, off, len, rhook[, src_where, src_off]),
        ...], hook): its messages, each receiving (kind 0), sending (1) or
        copying locally from [src_off, +len) of src_where (2, no peer) bytes
        [off, off+len) of the
        in/out buffer (where 0: nbytes long, bound at each run), the input
        buffer (1: in_nbytes long, bound at each run, sent from only) or tmp
        (2), a receive combining as it lands with the C loop rhook over
        `itemsize`-byte elements when rhook is not 0 (irecv_reduce); then
        the C function at address hook (0: none) as hook(in/out, tmp, count).
        Two short forms: (dst, src, hook) sends the whole in/out buffer to
        dst and receives tmp from src; (dst, src, s_off, s_len, r_off,
        r_len, rhook) sends and receives ranges of the in/out buffer.  Every
        run posts a step's sends, then its receives, each in the order given
        (chain.pxi's post_step says why)."""
        return make_chain(self, steps, tmp, count, ctx, tag, rank_of, nbytes, itemsize,
                          in_nbytes)

    # ------------------------------------------------------------ waiting
    cdef int _wait(self, Request q, object timeout, bint spin=True) except -1:
        cdef double t = self.default_timeout if timeout is None else check_timeout(timeout)
        if self._block_until(q, now_ns() + <int64_t>(t * 1e9), spin):
            return 0
        self._sweep()
        peer = q.r.peer
        shown = q.rank_of(peer) if q.rank_of is not None and peer >= 0 else peer
        detail = ""
        if q.r.kind == K_SEND and q.r.held and peer == self.rank:
            detail = (f"rank {self.rank}'s message to itself waits for its matching receive: "
                      f"it already holds its share of unmatched messages to itself "
                      f"(COMMRT_UNEXPECTED_BYTES) or this one is larger; post the receive "
                      f"first (irecv) or use sendrecv")
        elif q.r.kind == K_SEND and q.r.held:
            detail = (f"rank {self.rank}'s message to rank {shown} is held for flow-control "
                      f"credit: rank {shown} already holds its share of unmatched messages from "
                      f"rank {self.rank} (COMMRT_UNEXPECTED_BYTES) and has not posted the "
                      f"matching receives; if both ranks send before they receive, use "
                      f"sendrecv or non-blocking sends")
        raise _errors().CommTimeoutError(q.op, shown if peer >= 0 else None,
                                         q.r.tag if q.r.tag >= 0 else None, t, detail)

    cdef int _block_until(self, Request q, int64_t deadline, bint spin) except -1:
        """Wait for q until deadline (ns); 1 if it finished, 0 if the time ran out."""
        cdef eng_t *E = self.E
        cdef int64_t slice_end
        cdef bint done = False
        while True:
            if E.released and q.r.state < S_DONE:      # forked child: the parent's request
                raise _errors().CommError(f"{q.op}: the communicator is closed")
            slice_end = now_ns() + 200000000     # check for signals (Ctrl-C) every 200 ms
            if slice_end > deadline:
                slice_end = deadline
            with nogil:
                done = block(E, &q.r, slice_end, spin)
            if done:
                return 1
            PyErr_CheckSignals()
            if now_ns() >= deadline:
                return 0

    cdef int _test(self, Request q) except -1:
        cdef eng_t *E = self.E
        if E.released:                      # closed: every request has finished
            return 0
        with nogil:
            pthread_mutex_lock(&E.lock)
            progress(E, True)
            pthread_mutex_unlock(&E.lock)
        return 0

    cdef void _sweep(self):
        """Forget finished requests (they no longer need the engine to keep them alive)."""
        cdef eng_t *E = self.E
        cdef req_t *r
        cdef req_t *head
        if E.done_head == NULL:
            return
        with nogil:
            pthread_mutex_lock(&E.lock)
            head = E.done_head
            E.done_head = NULL
            pthread_mutex_unlock(&E.lock)
        while head != NULL:
            r = head
            head = r.done_next
            r.done_next = NULL
            if r.lent:                      # its sender may still write into its buffer
                self.lent.append(<object>r.pyobj)
            self.live.discard(<object>r.pyobj)

    def progress(self):
        """Drive progress once (for callers that poll)."""
        cdef eng_t *E = self._live()
        with nogil:
            pthread_mutex_lock(&E.lock)
            progress(E, True)
            pthread_mutex_unlock(&E.lock)
        self._sweep()

    cdef object _make_error(self, Request q):
        errors = _errors()
        cdef int err = q.r.err
        rank = q.r.err_rank
        shown = rank
        if q.rank_of is not None and rank >= 0:
            try:
                shown = q.rank_of(rank)
            except Exception:
                shown = rank
        tag = q.r.tag if q.r.tag >= 0 else None
        if err == E_TRUNC:
            src = q.r.st_src
            if q.rank_of is not None and src >= 0:
                src = q.rank_of(src)
            return errors.MessageTruncatedError(q.r.err_a, q.r.cap, src, q.r.st_tag, q.r.meta,
                                                q.r.meta2)
        if err == E_SHUTDOWN:
            return errors.CommError(f"{q.op}: the communicator was closed with this operation "
                                    f"pending")
        if err == E_CANCELLED:
            return errors.CancelledError(f"{q.op} (tag {tag}) was cancelled before it matched")
        if err == E_ABORTED or self.poison_of(q.r.ctx) is not None:
            # aborted, or failed by the cascade of an abort (a peer that left
            # after seeing the first failure): report the first failure
            return self._abort_error(q)
        detail = ""
        if 0 <= rank < self.size:
            detail = (<bytes>self.E.peers[rank].reason).decode("utf-8", "replace")
        if err == E_SILENT:
            return errors.PeerUnresponsiveError(shown, detail, op=q.op, tag=tag)
        return errors.PeerLostError(shown, detail, op=q.op, tag=tag)

    cdef object _abort_error(self, Request q):
        """The error of the abort that poisoned q's context, its ranks shown as q's
        communicator numbers them."""
        z = self.poison_of(q.r.ctx)
        if z is None:
            return _errors().AbortedError("context aborted")
        code, culprit, origin, reason = z

        def shown(w):
            if w < 0:
                return None
            if q.rank_of is None:
                return w
            try:
                return q.rank_of(w)
            except Exception:
                return w
        return _errors().error_for(code, reason, shown(culprit), shown(origin), op=q.op)

    # ------------------------------------------------------------ control
    def abort(self, uint32_t ctx, ranks, reason, int code=1, int culprit=-1, bint pair=False):
        """Abort context ctx here and at `ranks` (world ranks): every receive posted
        on it fails, and every later operation on it, with the error that
        errors.error_for(code, reason, culprit, origin=this rank) makes.  If ctx
        is already aborted, the first abort's code, culprit and reason are what
        the ranks are told (so every rank names the first failure).  pair: ctx ^ 1
        too, in the same message, so no rank ever sees one aborted and not the
        other (a communicator's point-to-point and collective contexts)."""
        cdef bytes text = str(reason).encode("utf-8")[:ABORT_TEXT_MAX]
        cdef poison_t *z
        cdef peer_t *p
        cdef const char *ctext = text
        cdef eng_t *E = self._live()
        if not FAILURE_CODE_MIN <= code <= FAILURE_CODE_MAX:
            raise ValueError(f"abort code {code} is not a FailureCode "
                             f"({FAILURE_CODE_MIN}..{FAILURE_CODE_MAX})")
        if not -1 <= culprit < self.size:
            raise ValueError(f"culprit {culprit} out of range: world size is {self.size}")
        with nogil:
            pthread_mutex_lock(&E.lock)
            poison_ctx(E, ctx, ctext, E.rank, code, culprit, E.rank)
            z = find_poison(E, ctx)
            if pair:
                poison_ctx(E, ctx ^ 1, z.reason, E.rank, z.code, z.culprit, z.origin)
            pthread_mutex_unlock(&E.lock)
        for rk in ranks:
            if rk == self.rank or not (0 <= rk < self.size):
                continue
            p = &E.peers[<int>rk]
            with nogil:
                pthread_mutex_lock(&E.lock)
                send_abort(E, p, z, pair)
                pthread_mutex_unlock(&E.lock)
        self._sweep()

    def poison_of(self, uint32_t ctx):
        """(code, culprit, origin, reason) of the abort of ctx (world ranks), or None."""
        cdef poison_t *z
        if self.E == NULL:
            return None
        z = find_poison(self.E, ctx)
        if z == NULL:
            return None
        return (z.code, z.culprit, z.origin, (<bytes>z.reason).decode("utf-8", "replace"))

    def poison_reason(self, uint32_t ctx):
        z = self.poison_of(ctx)
        return None if z is None else z[3]

    def clear_poison(self, uint32_t ctx):
        self._live()
        for i in range(MAX_POISON):
            if self.E.poison[i].used and self.E.poison[i].ctx == ctx:
                self.E.poison[i].used = False

    def peer_lost(self, int rank):
        """None if the peer is alive, else why it is not."""
        self._live()
        self._check_rank(rank, "rank")
        if not self.E.peers[rank].lost:
            return None
        return (<bytes>self.E.peers[rank].reason).decode("utf-8", "replace")

    def stats(self):
        """Per peer (world rank): payload bytes and messages each way, and header bytes."""
        out = {}
        cdef peer_t *p
        self._live()
        for i in range(self.size):
            p = &self.E.peers[i]
            hs, hr = p.hdr_sent, p.hdr_recv
            for k in range(p.nlanes):           # extra TCP streams' DATA headers
                hs += p.lanes[k].hdr_sent
                hr += p.lanes[k].hdr_recv
            out[i] = {"bytes_sent": p.bytes_sent, "msgs_sent": p.msgs_sent,
                      "bytes_recv": p.bytes_recv, "msgs_recv": p.msgs_recv,
                      "header_bytes_sent": hs, "header_bytes_recv": hr,
                      "transport": self.peer_kind(i), "streams": 1 + p.nlanes,
                      # large messages from it copied in two halves, its core writing
                      # one (shared) or, its sender busy elsewhere, this one both (alone)
                      "split_copies": {"shared": p.splits_shared, "alone": p.splits_alone},
                      # messages to it this rank wrote whole into its buffer (its receive's
                      # copier SENDER: process_vm_writev)
                      "pushes": p.pushes,
                      # bytes read from each TCP stream (the channel's first, then its lanes)
                      "stream_bytes_recv": [p.rx_raw] + [p.lanes[k].rx_raw
                                                         for k in range(p.nlanes)]}
        return out

    def liveness_info(self):
        """beats_paid: heartbeat rounds whose TCP beats and silence checks a
        progress pass made because the beat thread could not have the engine
        lock (engine.pxi beat_main)."""
        self._live()
        return {"beats_paid": self.E.beats_paid}

    def _drive_holding_lock(self, double seconds):
        """Tests only: drive progress for `seconds` without ever letting go of the
        engine lock (the worst case of a waiter that drives a long receive)."""
        cdef eng_t *E = self._live()
        cdef int64_t until = now_ns() + <int64_t>(seconds * 1e9)
        with nogil:
            pthread_mutex_lock(&E.lock)
            while now_ns() < until:
                progress(E, True)
                cpu_relax()
            pthread_mutex_unlock(&E.lock)
        self._sweep()

    def memory_info(self):
        """Bytes the transport holds: per peer and for unexpected messages, and
        how many sends wait for flow-control credit."""
        cdef peer_t *p
        self._live()
        per_peer = {}
        for i in range(self.size):
            p = &self.E.peers[i]
            per_peer[i] = p.ops.memory(p) if p.ops != NULL else 0
        cdef int held = 0
        cdef frame_t *f
        cdef req_t *r
        cdef eng_t *E = self.E
        with nogil:
            pthread_mutex_lock(&E.lock)
            for i in range(E.size):
                f = E.peers[i].held
                while f != NULL:
                    held += 1
                    f = f.next
            r = E.peers[E.rank].await_head      # sends to oneself waiting for their receive
            while r != NULL:
                held += 1
                r = r.next
            pthread_mutex_unlock(&E.lock)
        return {"per_peer": per_peer, "unexpected_bytes": self.E.unexp_bytes,
                "sends_held_for_credit": held,
                "unexpected_messages": self.E.unexp_count, "live_requests": len(self.live)}

    @property
    def spin_us(self):
        """The waiters' current spin budget in microseconds (it adapts)."""
        return self._live().spin_ns / 1000.0

    def pending(self):
        """Number of posted, unfinished requests."""
        return self._live().outstanding

    def close(self, double linger=2.0):
        """Say goodbye to every peer, stop the progress thread, release the channels.

        First waits (at most `linger` seconds) until every frame for a live
        peer -- an ABORT that names the first failure, the BYE -- is handed
        to its channel and, over TCP, acknowledged by the peer's kernel: a
        socket closed with unread bytes from the peer resets the connection
        and throws away what its kernel had not sent.  Operations still
        pending fail with CommError; every later call raises (see the class
        text).  Idempotent."""
        cdef eng_t *E = self.E
        cdef int64_t deadline
        cdef peer_t *p
        cdef req_t *r
        cdef int waiting
        if E == NULL or E.closed:
            return
        with nogil:
            pthread_mutex_lock(&E.lock)
            E.closing = True
            while E.posted_head != NULL:    # no receive can match from now on
                r = E.posted_head
                posted_remove(E, r)
                fail(E, r, E_SHUTDOWN, E.rank)
            for i in range(E.size):
                p = &E.peers[i]
                if p.ops != NULL and p.ops.remote and p.lost == 0:
                    send_ctrl(E, p, OP_BYE, 0, 0, 0, 0)
                    for k in range(p.nlanes):       # behind each lane's DATA (tcp.pxi)
                        send_ctrl(E, &p.lanes[k], OP_BYE, 0, 0, 0, 0)
            deadline = now_ns() + <int64_t>(linger * 1e9)
            while now_ns() < deadline:
                progress(E, True)
                waiting = _tx_pending(E)
                if not waiting:
                    break
                pthread_mutex_unlock(&E.lock)
                if waiting == 2:
                    sched_yield()
                else:                       # only the peers' acknowledgements: no hurry
                    usleep(200)
                pthread_mutex_lock(&E.lock)
            E.closed = True
            pthread_mutex_unlock(&E.lock)
        self._release(True)

    cdef void _release(self, bint sweep):
        """Fail what is pending, stop the progress thread, close every descriptor,
        unmap the segments, free the queues.  The struct stays (see the class
        text).  sweep: forget finished requests in the live set; not from
        __dealloc__, where the garbage collector may be freeing that set and its
        requests (a request's dealloc can be what drops the engine's last
        reference: sweeping then would free it a second time)."""
        cdef eng_t *E = self.E
        cdef peer_t *p
        cdef umsg_t *u
        cdef req_t *r
        if E == NULL or E.released:
            return
        if E.beat_running:
            with nogil:
                pthread_mutex_lock(&E.beat_lock)
                E.beat_stop = True
                pthread_cond_signal(&E.beat_cond)
                pthread_mutex_unlock(&E.beat_lock)
                pthread_join(E.beat, NULL)
            E.beat_running = False
        E.closed = True
        if E.pt_running:
            with nogil:
                pthread_mutex_lock(&E.lock)
                E.pt_stop = True
                pthread_cond_signal(&E.pt_cond)
                pthread_mutex_unlock(&E.lock)
                kick(E)
                pthread_join(E.pt, NULL)
            E.pt_running = False
        with nogil:
            pthread_mutex_lock(&E.lock)
            for i in range(E.size):
                p = &E.peers[i]
                if p.ops != NULL and p.ops.remote:
                    peer_lost(E, p, E_SHUTDOWN, b"the communicator was closed")
            while E.posted_head != NULL:
                r = E.posted_head
                posted_remove(E, r)
                fail(E, r, E_SHUTDOWN, E.rank)
            fail_list(E, &E.peers[E.rank].await_head, E_SHUTDOWN, E.rank)   # sends to oneself
            while E.unexp_head != NULL:
                u = E.unexp_head
                unexp_remove(E, u)
                if u.waiter != NULL:
                    fail(E, u.waiter, E_SHUTDOWN, E.rank)
                free_umsg(E, u)
            pool_drain(E)
            E.released = True
            pthread_cond_broadcast(&E.done_cond)    # waiters: your request has finished
            kick(E)
            pthread_mutex_unlock(&E.lock)
        if sweep:
            self._sweep()
        self._close_fds()
        # the epoll sets and eventfds too (a woken waiter finds its request done and
        # only ever polls them once more: a closed descriptor (-1) answers at once)
        for fd in (E.epfd, E.iofd, E.doorbell, E.kickfd):
            if fd >= 0:
                close(fd)
        E.epfd = E.iofd = E.doorbell = E.kickfd = -1
        if E.cbuf != NULL:
            free(E.cbuf)
            E.cbuf = NULL
            E.cbuf_bytes = 0

    cdef void _close_fds(self):
        """Release every channel (ops.release: its descriptors, segment, buffers)."""
        cdef eng_t *E = self.E
        cdef peer_t *p
        for i in range(E.size):
            p = &E.peers[i]
            p.in_epoll = False
            if p.ops != NULL and p.ops.release != NULL:
                p.ops.release(p)

    cdef void _free(self):
        cdef eng_t *E = self.E
        for fd in (E.epfd, E.iofd, E.doorbell, E.kickfd):
            if fd >= 0:
                close(fd)
        pthread_cond_destroy(&E.done_cond)
        pthread_cond_destroy(&E.pt_cond)
        pthread_cond_destroy(&E.beat_cond)
        pthread_mutex_destroy(&E.beat_lock)
        pthread_mutex_destroy(&E.lock)
        free(E.peers)
        free(E)
        self.E = NULL

    cdef void _forget_in_child(self):
        """After fork, in the child: this engine is the parent's.  Close the
        child's copies of its descriptors and mappings (so the child never holds
        a channel open: a rank's death must stay visible to its peers as EOF)
        and mark it closed, touching no peer and no lock (a parent thread may
        have held it at fork: the child's copy is made anew)."""
        cdef eng_t *E = self.E
        cdef pthread_condattr_t ca
        if E == NULL or E.released:
            return
        pthread_mutex_init(&E.lock, NULL)
        pthread_mutex_init(&E.beat_lock, NULL)
        pthread_condattr_init(&ca)
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC)
        pthread_cond_init(&E.done_cond, &ca)
        pthread_cond_init(&E.pt_cond, &ca)
        pthread_cond_init(&E.beat_cond, &ca)
        E.pt_running = False                # the threads were not forked
        E.beat_running = False
        E.closed = True
        E.released = True
        for i in range(E.size):
            E.peers[i].lost = E_SHUTDOWN
            E.peers[i].txq = NULL           # the parent's frames: never sent from here
            E.peers[i].txq_tail = NULL
            E.peers[i].unexp_head = E.peers[i].unexp_tail = NULL
        E.posted_head = E.posted_tail = NULL
        E.unexp_head = E.unexp_tail = NULL
        E.done_head = NULL
        self.live = set()
        self._close_fds()
        for fd in (E.epfd, E.iofd, E.doorbell, E.kickfd):
            close(fd)
        E.epfd = E.iofd = E.doorbell = E.kickfd = -1


_ENGINES = weakref.WeakSet()


def _after_fork_in_child():
    for eng in list(_ENGINES):
        (<Engine>eng)._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


MAX_TIMEOUT_S = 1e9            # ~31 years: longer is "forever" (and fits int64 ns)


cpdef double check_timeout(object timeout) except -1.0:
    """A timeout in seconds as a float: >= 0 and not NaN, else ValueError;
    infinity and anything beyond MAX_TIMEOUT_S is MAX_TIMEOUT_S."""
    cdef double t
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}") from None
    if not t >= 0.0:
        raise ValueError(f"timeout must be >= 0 seconds (or None for the default), got {timeout!r}")
    return t if t < MAX_TIMEOUT_S else MAX_TIMEOUT_S


# A large local copy in pieces.  glibc's memcpy leaves `rep movsb` above its
# rep_movsb_stop_threshold (1 MiB here: the L2 of AMD cores) for a vector loop
# whose stores first read each line (RFO), while `rep movsb` writes whole
# lines without reading them.  Both cores copying 32 MiB at once from freshly
# written buffers took 3.1-3.7 ms in one memcpy and 2.6-2.8 ms in 512 KiB
# pieces, and N = 2 all-gathers, all-to-alls, scatters and gathers of 64 MiB
# (32 MiB own blocks) took 0.88-0.98 of the time in pieces (alternated slice
# by slice in one job, 2026-12-06; docs/transport.md).  At 16 MiB (8 MiB
# blocks) the same test went both ways, within the spread of an A/A run, so
# pieces start at the size of the last-level cache (copy_pieces_from:
# sysfs's figure; glibc's sysconf says 320 MiB on this virtual machine, sysfs
# 32; 32 MiB where sysfs says nothing).
# OpenMPI's Allgather copies its own block as fast: N = 2, 64 MiB, 7.8-8.0 ms
# against 8.9 with one NumPy copy.
def _last_cache_bytes(cpu="/sys/devices/system/cpu/cpu0/cache"):
    """The size of cpu 0's highest-level data or unified cache (sysfs), or 32 MiB."""
    best = (0, 32 << 20)
    try:
        for entry in os.listdir(cpu):
            if not entry.startswith("index"):
                continue
            d = os.path.join(cpu, entry)
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            n = int(size.rstrip("KMG")) * mult
            if level > best[0] and n > 0:
                best = (level, n)
    except (OSError, ValueError):
        pass
    return best[1]


cdef uint64_t copy_piece = 524288
cdef uint64_t copy_pieces_from = 0          # 0: not read yet (size_copies)


cdef int size_copies() except -1:
    """Read the cache's size once, where a copy or a chain first needs it (not
    at import: sysfs costs ~170 us)."""
    global copy_pieces_from
    if copy_pieces_from == 0:
        copy_pieces_from = _last_cache_bytes()
    return 0


def _bounce_at(size_t base, uint64_t addr):
    """Where a CMA read of the peer's addr lands in a bounce buffer at base
    (shm.pxi aligned_like): base plus at most 2 * CMA_ALIGN - 2, at addr's
    offset mod CMA_ALIGN.  For the tests."""
    return <size_t>aligned_like(<char *>base, addr)


def _set_cma_piece(uint64_t piece):
    """Reduce-receives over CMA read in pieces of `piece` bytes (a multiple of
    4096, at least 4096); to measure one size against another.  The old size.
    Engines make their bounce buffer again at their next such receive."""
    global cma_piece
    if piece < 4096 or piece % 4096:
        raise ValueError(f"CMA piece of {piece} bytes: a multiple of 4096 from 4096")
    old = cma_piece
    cma_piece = piece
    return old


def _set_copy_piece(uint64_t piece, from_bytes=None):
    """Pieces of `piece` bytes (0: one memcpy) for copies of from_bytes up (None:
    unchanged); to measure one against the other.  The old (piece, from)."""
    global copy_piece, copy_pieces_from
    size_copies()
    old = (copy_piece, copy_pieces_from)
    copy_piece = piece
    if from_bytes is not None:
        copy_pieces_from = from_bytes
    return old


cdef void copy_bytes(char *dst, const char *src, uint64_t n) noexcept nogil:
    """memcpy of non-overlapping ranges, in copy_piece pieces from copy_pieces_from
    up (one memcpy before size_copies has run)."""
    cdef uint64_t k = 0
    cdef uint64_t piece = copy_piece
    if piece == 0 or copy_pieces_from == 0 or n < copy_pieces_from or n < 2 * piece:
        memcpy(dst, src, n)
        return
    while n - k > piece:
        memcpy(dst + k, src + k, piece)
        k += piece
    memcpy(dst + k, src + k, n - k)


cdef void move_bytes(char *dst, const char *src, uint64_t n) noexcept nogil:
    """memmove: copy_bytes where the ranges do not meet."""
    if dst + n <= src or src + n <= dst:
        copy_bytes(dst, src, n)
    elif dst != src:
        memmove(dst, src, n)


cdef uint64_t get_copy_pair(dst, src, Py_buffer *d, Py_buffer *s) except? 0:
    """Both buffers of a local copy (C-contiguous, dst writable, the same bytes),
    held in d and s (the caller releases both); their bytes.  Reads the copy
    sizes first (size_copies)."""
    size_copies()
    PyObject_GetBuffer(dst, d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        PyObject_GetBuffer(src, s, PyBUF_C_CONTIGUOUS)
    except BaseException:
        PyBuffer_Release(d)
        raise
    if d.len != s.len:
        PyBuffer_Release(s)
        PyBuffer_Release(d)
        raise ValueError(f"local copy: dst holds {d.len} bytes, src {s.len}")
    return <uint64_t>d.len


def copy_into(dst, src):
    """Copy src's bytes into dst: both C-contiguous buffers of the same number
    of bytes (the ranges may overlap), the GIL released from 64 KiB, large copies
    in pieces (copy_bytes)."""
    cdef Py_buffer d
    cdef Py_buffer s
    cdef uint64_t n = get_copy_pair(dst, src, &d, &s)
    try:
        if n >= 65536:
            with nogil:
                move_bytes(<char *>d.buf, <const char *>s.buf, n)
        else:
            move_bytes(<char *>d.buf, <const char *>s.buf, n)
    finally:
        PyBuffer_Release(&s)
        PyBuffer_Release(&d)


cdef enum:
    MAX_LANES = 7           # extra TCP streams per peer (COMMRT_TCP_STREAMS <= 8)


cdef int _tcp_watch(eng_t *E, peer_t *q) except -1:
    """Put a TCP stream (a peer's channel or one of its lanes) in the channel set."""
    cdef epoll_event ev
    ev.events = EPOLLIN | EPOLLRDHUP
    ev.data.u64 = tcp_tag(q)
    if epoll_ctl(E.iofd, EPOLL_CTL_ADD, q.fd, &ev) != 0:
        raise OSError(errno, f"epoll_ctl for a TCP connection to rank {q.rank}")
    q.ev_mask = ev.events
    q.in_epoll = True
    return 0


cdef void _count_channel(eng_t *E, peer_t *p) noexcept nogil:
    if p.ops.polled_fd:
        E.n_fd_polled += 1
    if p.ops.poll != NULL:
        E.n_polled += 1


cdef int _tx_pending(eng_t *E) noexcept nogil:
    """What a closing engine still waits for: 2 frames queued for a live peer,
    1 bytes in a channel the peer has not taken yet (ops.unsent), 0 nothing."""
    cdef peer_t *p
    cdef int most = 0
    for i in range(E.size):
        p = &E.peers[i]
        if p.lost:
            continue
        if p.txq != NULL:
            return 2
        for k in range(p.nlanes):
            if p.lanes[k].txq != NULL:
                return 2
        if p.ops != NULL and p.ops.unsent != NULL and p.ops.unsent(p) > 0:
            most = 1
    return most


cdef bint has_pointers(const char *fmt) noexcept:
    """Whether a buffer's struct format (PEP 3118) holds pointers: 'O' (Python
    objects), 'P' (void *) or '&' (pointer to), outside field names (:name:)."""
    cdef bint in_name = False
    cdef char c
    while fmt[0] != 0:
        c = fmt[0]
        if c == b':':
            in_name = not in_name
        elif not in_name and (c == b'O' or c == b'P' or c == b'&'):
            return True
        fmt += 1
    return False


def _pointer_problem(buf, fmt, writable, name="buf"):
    """The refusal of a buffer that holds pointers (also the collectives':
    buffers.host_array)."""
    kind = type(buf).__name__
    dtype = getattr(buf, "dtype", None)
    what = f"a {kind} of dtype {dtype}" if dtype is not None else f"a {kind} of format {fmt!r}"
    return (f"{name}: {what} holds pointers (Python objects or addresses), not plain data: "
            f"{'receiving bytes into it would let the peer choose pointer values' if writable else 'sending it would ship raw heap addresses'}; "
            f"send plain numbers, or objects with send_obj/recv_obj (collectives: the *_obj ones)")


def _buffer_problem(buf, writable, exc):
    """Explain why a buffer was refused, naming the argument."""
    kind = type(buf).__name__
    try:
        m = memoryview(buf)
    except TypeError:
        return f"buf: a {kind} does not expose a buffer ({exc})"
    if not m.contiguous:
        return f"buf: a non-contiguous {kind} cannot be sent or received in place; pass a contiguous copy (e.g. numpy.ascontiguousarray)"
    if writable and m.readonly:
        return f"buf: a read-only {kind} cannot receive data"
    return f"buf: unusable {kind}: {exc}"


include "chain.pxi"


_errors_mod = None


def _errors():
    global _errors_mod
    if _errors_mod is None:
        import commrt.errors as m
        _errors_mod = m
    return _errors_mod
