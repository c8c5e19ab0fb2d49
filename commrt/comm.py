"""The Communicator: ranks, point-to-point messages, sub-groups, statistics.

``commrt.init()`` builds the world from the environment; every other
communicator derives from it (``split``, ``new_group``).  A communicator is
a group of world ranks plus a context id: messages only match within one
context, so traffic of different communicators never crosses.  Each
communicator has a shadow (``_coll``) with its own context for collective
traffic, so collectives never match user point-to-point messages.

Buffers: anything contiguous with the buffer protocol (NumPy arrays,
bytearray, memoryview), DLPack, or ``__cuda_array_interface__`` (staged
through host memory).  Two families: ``send/recv`` move buffers,
``send_obj/recv_obj`` move pickled objects between authenticated peers.
"""
import hashlib
import numbers
import pickle
import threading

from commrt import config
from commrt.errors import CommError, FailureCode
from commrt.transport._core import ANY_SOURCE, ANY_TAG, Request, Status  # noqa: F401
from commrt.transport._core import check_timeout  # noqa: F401  (the one timeout rule)
from commrt.transport._core import COPY_BY_RECEIVER, COPY_BY_SENDER, COPY_IN_EXCHANGE
from commrt.transport._core import copy_answering_recvs, copy_into

__all__ = ["init", "Communicator", "Request", "Status", "wait_all", "ANY_SOURCE", "ANY_TAG"]

OBJ_INLINE = 4096           # pickles up to this size travel in one message


def wait_all(requests, timeout=None):
    """Wait for every request; returns their Statuses in order.

    Raises the first error after every request has finished or failed, so no
    buffer is left in use behind the caller's back."""
    statuses, first_error = [], None
    for req in requests:
        try:
            statuses.append(req.wait(timeout))
        except CommError as exc:
            statuses.append(None)
            if first_error is None:
                first_error = exc
    if first_error is not None:
        raise first_error
    return statuses


class Channel:
    """What the collectives layer (commrt.collectives) uses of a Communicator: its
    own context for collective traffic, and the few operations beyond the public
    point-to-point API that the algorithms need.  ``comm.channel`` gives it; the
    collectives touch nothing else of the Communicator (docs/algorithms.md lists
    these methods).  Ranks are the communicator's.

        rank, size, state          this rank, the group's size, the dict where the
                                   collectives keep their per-communicator state
        host_of(q), transport_of(q), world_rank(q)
        cma_min                    the transport's single-copy threshold (a receive
                                   with copier 0 reads from this size, streams below);
                                   Channel.default_cma_min(crowded) without one
        parent                     the channel of the communicator this one was
                                   derived from, or None (cost parameters are shared)
        isend(buf, dst, tag, meta, meta2) -> Request   (meta, meta2: the two header
                                   words that carry the call's fingerprint)
        irecv(buf, src, tag, copier=0) -> Request   (src -1: any; copier: who copies
                                   a shared-memory peer's large message, where the
                                   OS permits: 0 the transport's choice, RECEIVER
                                   this rank, from the sender's buffer, at any size
                                   where ranks share cores (a scatter's receivers:
                                   the root's core copies nothing for them), SENDER
                                   the sender, into buf (a gather's root: its core
                                   copies only its own block), EXCHANGE as RECEIVER
                                   and with a core per rank from a quarter of the
                                   single-copy threshold up (half of an exchange:
                                   an all-to-all's); the same message either way)
        irecv_reduce(buf, src, tag, meta, hook, meta2, copier=0) -> Request
                                   a receive that combines the message into buf as
                                   it lands with the C loop at hook, and only the
                                   message with this meta, meta2 and buf's size
        exchange(sbuf, dst, rbuf, src, tag, meta, wait, hook=0, meta2=0) -> (recv, send)
                                   a pairwise step in one transport call, its
                                   receive waited for up to `wait` seconds
        exchange_chain(steps, tmp, count, tag, nbytes=-1, itemsize=0, in_nbytes=-1)
                                   a persistent chain of steps of messages (prepared plans)
        abort(reason, code=MISMATCH, culprit=None)
                                   fail every pending and later operation on the
                                   collective context, here and on every rank, with
                                   errors.error_for(code, reason, culprit)
        aborted(read=False) -> error | None
                                   the error of that abort (the first one heard);
                                   read: drive the transport once first, so an abort
                                   that came in but was not read yet counts
        derive(ranks, salt) -> Communicator | None
                                   a sub-communicator every member derives alike
        copy(dst, src)             a local copy of src into dst (C-contiguous, the same
                                   bytes), the GIL released, a large one in the
                                   pieces this CPU copies fastest (transport
                                   copy_into): an algorithm's own block
        copy_answering(dst, src, reqs)
                                   copy, answering meanwhile the senders of reqs
                                   (receives posted before it) that write their
                                   messages (copier SENDER) and wait to be told to
                                   (transport copy_answering_recvs)
    """
    __slots__ = ("_comm", "_coll", "rank", "size", "state", "_coll_state")

    def __init__(self, comm):
        self._comm = comm
        self._coll = comm._coll
        self._coll_state = None           # set by collectives.state.state_of
        self.rank, self.size, self.state = comm.rank, comm.size, comm.state

    @property
    def parent(self):
        p = self._comm._parent
        return None if p is None else p.channel

    def host_of(self, q):
        return self._comm.host_of(q)

    def transport_of(self, q):
        return self._comm.transport_of(q)

    @property
    def cma_min(self):
        """The transport's single-copy threshold (Engine.cma_min): from this size a
        shared-memory message whose receive leaves the copier to it is read."""
        return self._coll._engine.cma_min

    @staticmethod
    def default_cma_min(crowded):
        """The threshold the transport would set on a host whose ranks outnumber
        its cores (crowded) or not (COMMRT_CMA_MIN_BYTES, auto resolved), for
        a model with no communicator."""
        from commrt.transport.connect import cma_min_bytes    # (as build_engine: on use)

        return cma_min_bytes(crowded)

    def world_rank(self, q):
        return self._comm.world_rank(q)

    def isend(self, buf, dst, tag, meta=0, meta2=0):
        return self._coll.isend(buf, dst, tag, meta=meta, meta2=meta2)

    copy = staticmethod(copy_into)

    def copy_answering(self, dst, src, reqs):
        copy_answering_recvs(self._coll._engine, dst, src, reqs)

    # irecv's copier (transport Engine.irecv)
    RECEIVER, SENDER, EXCHANGE = COPY_BY_RECEIVER, COPY_BY_SENDER, COPY_IN_EXCHANGE

    def irecv(self, buf, src, tag, copier=0):
        if copier:
            return self._coll._irecv_copier(buf, src, tag, copier)
        return self._coll.irecv(buf, src, tag)

    def irecv_reduce(self, buf, src, tag, meta, hook, meta2=0, copier=0):
        return self._coll._irecv_reduce(buf, src, tag, meta, hook, meta2, copier)

    def exchange(self, sbuf, dst, rbuf, src, tag, meta, wait, hook=0, meta2=0):
        return self._coll._exchange(sbuf, dst, rbuf, src, tag, meta, wait, hook, meta2)

    def exchange_chain(self, steps, tmp, count, tag, nbytes=-1, itemsize=0, in_nbytes=-1):
        return self._coll._exchange_chain(steps, tmp, count, tag, nbytes, itemsize, in_nbytes)

    def abort(self, reason, code=FailureCode.MISMATCH, culprit=None):
        coll, comm = self._coll, self._comm
        first = coll._engine.poison_of(coll._ctx)
        # the first abort heard was the communicator's own (Communicator.abort: both
        # contexts in one message): a relay passes both on, else a rank that hears
        # it first from a relay could still send point to point (its own copy from
        # the rank that aborted comes later, on another channel)
        pair = first is not None and comm is not coll and first == comm._engine.poison_of(
            comm._ctx)
        coll._abort(reason, code=code, culprit=culprit, pair=pair)

    def aborted(self, read=False):
        """The error the abort of the collective context makes here, or None.
        read: first read what peers sent (Engine.progress, 0.3-0.5 us): an abort frame
        waits unread in an idle rank's ring until something drives the transport
        (its next wait, or the heartbeat thread, every COMMRT_HEARTBEAT_S)."""
        if read:
            self._coll._engine.progress()
        return self._coll._aborted()

    def derive(self, ranks, salt):
        return self._comm._derive(ranks, salt)


class Communicator:
    """A group of ranks that exchange messages.

    rank, size; send/recv/isend/irecv; send_obj/recv_obj; the collectives
    (barrier, broadcast, all_reduce, ...; see commrt.collectives); split,
    new_group; stats; close (also as a context manager)."""

    def __init__(self, engine, world_ranks, ctx, *, hosts, owner=None, parent=None):
        self._engine = engine
        self._world = list(world_ranks)
        self._ctx = ctx
        self._hosts = list(hosts)             # host id of each world rank
        self._owner = owner                   # the world's resources (store, server), or None
        self._parent = parent
        self._index = {w: i for i, w in enumerate(self._world)}
        self._identity = self._world == list(range(engine.size))
        self._rank_of = None if self._identity else self._index.__getitem__
        self.rank = self._index[engine.rank]
        self.size = len(self._world)
        self._coll_comm = None
        self._derive_lock = threading.Lock()
        self._closed = False
        self.state = {}                       # per-communicator state of the collectives layer
        self._coll_state = None               # state["collectives"], once it exists (state_of)
        self._channel = None

    # ------------------------------------------------------------ helpers
    def _peer(self, r, what):
        if type(r) is not int and (not isinstance(r, numbers.Integral)  # np.int64 too
                                   or isinstance(r, bool)):
            raise TypeError(f"{what} must be an int rank, got {type(r).__name__}")
        if r < 0 or r >= self.size:
            raise ValueError(f"{what} {r} out of range: communicator size is {self.size}")
        return self._world[r]

    def _src(self, src):
        if src == ANY_SOURCE:
            return ANY_SOURCE
        return self._peer(src, "src")

    def __repr__(self):
        return f"<Communicator rank {self.rank} of {self.size}, context {self._ctx:#x}>"

    # ------------------------------------------------------------ point to point
    def send(self, buf, dst, tag=0, *, timeout=None, meta=0, meta2=0):
        """Send buf to dst; returns when buf may be reused.  meta, meta2: two 64-bit
        words the receiver's Status shows."""
        self._engine.send(buf, dst if self._identity and type(dst) is int and 0 <= dst < self.size
                          else self._peer(dst, "dst"), self._ctx, tag, meta, timeout, meta2)

    def recv(self, buf, src=ANY_SOURCE, tag=ANY_TAG, *, timeout=None):
        """Receive into buf -> Status(source, tag, nbytes)."""
        if not (self._identity and type(src) is int and -1 <= src < self.size):
            src = self._src(src)
        return self._engine.recv(buf, src, self._ctx, tag, timeout, self._rank_of)

    def isend(self, buf, dst, tag=0, *, meta=0, meta2=0):
        """Start sending buf to dst -> Request."""
        return self._engine.isend(buf, self._peer(dst, "dst"), self._ctx, tag, meta, self._rank_of,
                                  meta2)

    def irecv(self, buf, src=ANY_SOURCE, tag=ANY_TAG):
        """Start receiving into buf -> Request."""
        return self._engine.irecv(buf, self._src(src), self._ctx, tag, self._rank_of)

    def sendrecv(self, sendbuf, dst, recvbuf, src, tag=0, *, timeout=None, meta=0, meta2=0):
        """Send sendbuf to dst and receive recvbuf from src at once (MPI_Sendrecv)
        -> Status of the receive.  Safe for pairwise exchanges: the receive is
        posted before the send, so two ranks exchanging never wait on each other."""
        if timeout is not None:
            check_timeout(timeout)
        # the receive is half of an exchange (this rank sends as it receives): a
        # large message is read with process_vm_readv from cma_min / 4 up rather
        # than streamed, which would cost this core two copies per byte
        rq, sq = self._exchange(sendbuf, dst, recvbuf, src, tag, meta, 0.0, meta2=meta2,
                                copier=COPY_IN_EXCHANGE)
        try:
            wait_all([rq, sq], timeout)
        except BaseException:
            rq.cancel()                      # a blocking call: leave no receive posted
            raise
        return rq.status

    def _exchange(self, sendbuf, dst, recvbuf, src, tag, meta, wait, hook=0, meta2=0, copier=0):
        """(recv, send) Requests of a sendrecv whose receive was waited for up to
        `wait` seconds (the collectives' pairwise step, in one engine call).
        hook: the receive combines into recvbuf with this C loop (_irecv_reduce);
        copier: the receive's (_irecv_copier's)."""
        isz = recvbuf.itemsize if hook else 0
        if self._identity and type(dst) is int and type(src) is int and 0 <= dst < self.size \
                and 0 <= src < self.size:
            return self._engine.exchange(sendbuf, dst, recvbuf, src, self._ctx, tag, meta, wait,
                                         None, hook, isz, meta2, copier)
        return self._engine.exchange(sendbuf, self._peer(dst, "dst"), recvbuf,
                                     self._peer(src, "src"), self._ctx, tag, meta, wait,
                                     self._rank_of, hook, isz, meta2, copier)

    def _irecv_copier(self, buf, src, tag, copier):
        """irecv saying which process copies a large shared-memory message
        (transport Engine.irecv's copier: 1 this rank, 2 the sender, 3 this rank in an
        exchange)."""
        return self._engine.irecv(buf, self._src(src), self._ctx, tag, self._rank_of, copier)

    def _irecv_reduce(self, buf, src, tag, meta, hook, meta2=0, copier=0):
        """A receive that combines the message into buf as it lands, with the C loop
        at address hook (transport Engine.irecv_reduce), instead of copying it:
        the collectives' reduction without a scratch buffer.  Only a message
        with this meta and meta2 and exactly buf's size is combined; any other
        completes the request with buf untouched and its own meta, meta2 and
        size in the status.  copier SENDER: streamed over shared memory whatever
        its size, the sender's core copying while this one combines."""
        return self._engine.irecv_reduce(buf, self._peer(src, "src"), self._ctx, tag, meta, hook,
                                         buf.itemsize, self._rank_of, meta2, copier)

    def _exchange_chain(self, steps, tmp, count, tag, nbytes=-1, itemsize=0, in_nbytes=-1):
        """A persistent chain of steps on this context (the collectives' prepared
        plans; transport/chain.pxi, Engine.exchange_chain): steps are (dst, src,
        hook address) with tmp the receive buffer and count the hook's element
        count; ranged steps (dst, src, s_off, s_len, r_off, r_len, rhook) within
        an nbytes buffer; or ([(kind, peer, where, off, len, rhook[, src_where, src_off]), ...],
        hook) (Engine.exchange_chain)."""
        out = []
        for st in steps:
            if len(st) == 2 and isinstance(st[0], (list, tuple)):
                msgs = [(m[0], self._peer(m[1], "dst" if m[0] else "src")) + tuple(m[2:])
                        for m in st[0]]
                out.append((msgs, st[1]))
            else:
                out.append((self._peer(st[0], "dst"), self._peer(st[1], "src")) + tuple(st[2:]))
        return self._engine.exchange_chain(out, tmp, count, self._ctx, tag, self._rank_of,
                                           nbytes, itemsize, in_nbytes)

    def send_obj(self, obj, dst, tag=0, *, timeout=None):
        """Send a picklable object (peers are authenticated, so unpickling is safe)."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        head = data[:OBJ_INLINE]
        self.send(head, dst, tag, timeout=timeout, meta=len(data))
        if len(data) > OBJ_INLINE:
            self.send(memoryview(data)[OBJ_INLINE:], dst, tag, timeout=timeout)

    def recv_obj(self, src=ANY_SOURCE, tag=ANY_TAG, *, timeout=None):
        """Receive an object sent with send_obj."""
        head = bytearray(OBJ_INLINE)
        st = self.recv(head, src, tag, timeout=timeout)
        total = st.meta
        if total <= OBJ_INLINE:
            return pickle.loads(memoryview(head)[:total])
        data = bytearray(total)
        data[:OBJ_INLINE] = head
        self.recv(memoryview(data)[OBJ_INLINE:], st.source, st.tag, timeout=timeout)
        return pickle.loads(data)

    # ------------------------------------------------------------ introspection
    def stats(self):
        """Per peer rank: payload bytes and messages sent and received, header bytes."""
        self._check_open()
        raw = self._engine.stats()
        return {i: raw[w] for i, w in enumerate(self._world)}

    def memory_info(self):
        """Bytes the transport holds per peer rank, and in unexpected messages."""
        self._check_open()
        info = self._engine.memory_info()
        info["per_peer"] = {i: info["per_peer"][w] for i, w in enumerate(self._world)}
        return info

    def host_of(self, rank):
        """Host identity of a rank (ranks with the same one share memory)."""
        return self._hosts[self._peer(rank, "rank")]

    def transport_of(self, rank):
        """'self', 'shm' or 'tcp': the channel to that rank."""
        return self._engine.peer_kind(self._peer(rank, "rank"))

    @property
    def world_ranks(self):
        return tuple(self._world)

    def world_rank(self, rank):
        return self._peer(rank, "rank")

    # ------------------------------------------------------------ derived communicators
    @property
    def channel(self):
        """The Channel the collectives layer speaks through (see Channel)."""
        ch = self._channel
        if ch is None:
            ch = self._channel = Channel(self)
        return ch

    @property
    def _coll(self):
        """The same group in its own context, for collective traffic."""
        if self._coll_comm is None:
            c = Communicator(self._engine, self._world, self._ctx | 1, hosts=self._hosts, parent=self)
            c._coll_comm = c
            c.state = self.state
            self._coll_comm = c
        return self._coll_comm

    def _derive(self, ranks, salt):
        """A communicator over `ranks` (ranks of this one, in their new order).

        Every member calls it with the same arguments; the context id is a
        hash of (this context, salt, members), so it agrees everywhere
        without messages.  Non-members get None."""
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks must be distinct, got {ranks}")
        world = [self._peer(r, "rank") for r in ranks]
        if self._engine.rank not in world:
            return None
        digest = hashlib.blake2b(repr((self._ctx, salt, world)).encode(), digest_size=4).digest()
        ctx = int.from_bytes(digest, "little") & 0xFFFFFFFE
        if ctx in (0, self._ctx & 0xFFFFFFFE):
            ctx ^= 0x80000000
        return Communicator(self._engine, world, ctx, hosts=self._hosts, parent=self)

    def _abort(self, reason, ranks=None, code=FailureCode.MISMATCH, culprit=None, pair=False):
        """Abort this context here and at `ranks` (default: all): every pending and
        later operation on it fails with errors.error_for(code, reason, culprit).
        If it was aborted already, the first abort is what every rank hears.
        pair: the collective context too, in the same message."""
        targets = range(self.size) if ranks is None else ranks
        self._engine.abort(self._ctx, [self._world[r] for r in targets], reason, int(code),
                           -1 if culprit is None else self._world[culprit], pair)

    def _aborted(self):
        """The error an operation on this context raises once it is aborted, or None."""
        z = self._engine.poison_of(self._ctx)
        if z is None:
            return None
        from commrt.errors import error_for

        code, culprit, origin, reason = z
        return error_for(code, reason, self._index.get(culprit), self._index.get(origin))

    def abort(self, reason="aborted by the program"):
        """Abort this communicator on every rank: every pending and later operation
        on it (point-to-point and collectives, here and on every other member)
        fails with AbortedError(reason), code FailureCode.ABORTED, naming this
        rank.  Sub-communicators are not affected; the world stays open (close
        it as usual).  Elastic recovery builds a new communicator after it.
        If the communicator was already aborted, the first abort stands."""
        self._check_open()
        # both contexts in one message: a peer whose receive fails and goes on to
        # a collective (or the reverse) finds that aborted too
        self._abort(str(reason), code=FailureCode.ABORTED, culprit=self.rank, pair=True)

    # ------------------------------------------------------------ collectives
    # Thin delegations to commrt.collectives (same arguments), imported on first
    # use: this layer is below the collectives and never imports them at load
    # time; they reach back only through self.channel.
    def barrier(self, **kw):
        return _coll().barrier(self, **kw)

    def broadcast(self, buf, root=0, **kw):
        return _coll().broadcast(self, buf, root, **kw)

    def reduce(self, buf, root=0, op=None, **kw):
        return _coll().reduce(self, buf, root, _op(op), **kw)

    def all_reduce(self, buf, op=None, algorithm=None, *, timeout=None, async_op=False):
        c = _collectives or _coll()          # a tiny all-reduce is ~1 µs: keep this thin
        return c.all_reduce(self, buf, c.SUM if op is None else op, algorithm, timeout, async_op)

    def all_gather(self, out, buf, **kw):
        return _coll().all_gather(self, out, buf, **kw)

    def gather(self, buf, out=None, root=0, **kw):
        return _coll().gather(self, buf, out, root, **kw)

    def scatter(self, out, buf=None, root=0, **kw):
        return _coll().scatter(self, out, buf, root, **kw)

    def reduce_scatter(self, out, buf, op=None, **kw):
        return _coll().reduce_scatter(self, out, buf, _op(op), **kw)

    def all_to_all(self, out, buf, **kw):
        return _coll().all_to_all(self, out, buf, **kw)

    def all_gatherv(self, out, buf, counts, **kw):
        return _coll().all_gatherv(self, out, buf, counts, **kw)

    def gatherv(self, buf, out=None, counts=None, root=0, **kw):
        return _coll().gatherv(self, buf, out, counts, root, **kw)

    def scatterv(self, out, buf=None, counts=None, root=0, **kw):
        return _coll().scatterv(self, out, buf, counts, root, **kw)

    def all_to_allv(self, out, buf, send_counts, recv_counts, **kw):
        return _coll().all_to_allv(self, out, buf, send_counts, recv_counts, **kw)

    def broadcast_obj(self, obj, root=0, **kw):
        return _coll().broadcast_obj(self, obj, root, **kw)

    def all_gather_obj(self, obj, **kw):
        return _coll().all_gather_obj(self, obj, **kw)

    def gather_obj(self, obj, root=0, **kw):
        return _coll().gather_obj(self, obj, root, **kw)

    def split(self, color, key=None):
        """Ranks with the same color form a new communicator, ordered by (key, rank)."""
        self._check_open()
        return _coll().split(self, color, key)

    def new_group(self, ranks):
        """A communicator over the given ranks (every rank of this one calls it)."""
        self._check_open()
        return _coll().new_group(self, ranks)

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Close the world (on the world communicator) or forget this sub-communicator.

        Afterwards every operation on it (and, for the world, on every
        communicator derived from it) raises CommError("... closed"); requests
        still pending fail with it.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owner is not None:
            self._owner.close()
        else:                                # a sub-communicator: the engine stays open
            for c in (self, self._coll_comm):
                if c is not None:
                    c._engine = _ClosedEngine(c._engine)
                    c.state = {}             # drop prepared plans bound to the engine
                    c._coll_state = None
                    c._channel = None

    def _check_open(self):
        if self._closed or self._engine.closed:
            raise CommError("the communicator is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ClosedEngine:
    """What a closed sub-communicator talks to: every operation raises."""

    closed = True

    def __init__(self, engine):
        self.rank, self.size = engine.rank, engine.size

    def poison_of(self, ctx):
        return None

    def __getattr__(self, name):
        def closed(*args, **kwargs):
            raise CommError(f"{name}: the communicator is closed")
        return closed


_collectives = None


def _coll():
    """commrt.collectives, imported on first use (keeps `import commrt` cheap)."""
    global _collectives
    if _collectives is None:
        import commrt.collectives as c
        _collectives = c
    return _collectives


def _op(op):
    if op is None:
        from commrt.collectives.ops import SUM
        return SUM
    return op


class _World:
    """What the world communicator owns: the engine, the store and maybe its server."""

    def __init__(self, engine, store, server):
        self.engine, self.store, self.server = engine, store, server
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.engine.close()
        finally:
            if self.store is not None:
                self.store.close()
            if self.server is not None:
                self.server.close()


_generation = 0


def init(*, timeout=None, generation=None):
    """Join the job described by the environment and return the world communicator.

    Reads COMMRT_* variables set by commrt-launch, or those of torchrun,
    OpenMPI's mpirun or Slurm's srun (see docs/launcher.md).  `timeout`
    bounds the whole bootstrap (default COMMRT_TIMEOUT, at most 300 s).
    `generation` names the store prefix the ranks build their mesh under;
    every rank of one mesh must pass the same value.  By default a process
    counts its own init() calls (0, 1, ...), which agree when every rank
    re-initialises together; a job whose members join at different times
    (an elastic job's new workers) passes the generation it agreed on."""
    global _generation
    if generation is None:
        generation = _generation
    elif not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise ValueError(f"generation must be a non-negative int, got {generation!r}")
    from commrt.rendezvous.bootstrap import from_environment, open_store
    from commrt.transport.connect import build_engine

    _configure_logging()
    if timeout is None:
        timeout = min(config.get("COMMRT_TIMEOUT"), 300.0)
    info = from_environment()
    store, server = open_store(info, timeout)
    try:
        engine, plan = build_engine(info.rank, info.size, store, info.secret, host_id=info.host_id,
                                    local_size=info.local_size,
                                    bind_addr=info.data_addr or config.get("COMMRT_BIND_ADDR"),
                                    timeout=timeout, generation=generation)
    except BaseException:
        store.close()
        if server is not None:
            server.close()
        raise
    _generation = generation + 1
    hosts = [plan.host_of(r) for r in range(info.size)]
    world = _World(engine, store, server)
    comm = Communicator(engine, range(info.size), 0, hosts=hosts, owner=world)
    comm.local_rank, comm.local_size = info.local_rank, info.local_size
    return comm


def _configure_logging():
    import logging

    log = logging.getLogger("commrt")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("commrt %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(config.get("COMMRT_LOG_LEVEL").upper())
        log.propagate = False
