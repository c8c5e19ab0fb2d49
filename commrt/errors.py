"""The whole error hierarchy of commrt.

Each error says who, what and where: the rank, the operation, the tag, the
sizes.  Where a built-in exception fits, the error also inherits it, so that
``except ConnectionError`` or ``except TimeoutError`` in user code works.

    CommError
    ├── TransportError (ConnectionError)
    │   ├── PeerLostError        a peer died or its connection broke
    │   │   └── PeerUnresponsiveError   no heartbeat: stopped, frozen, or its link cut
    │   ├── AuthError            a connection without the job's secret
    │   └── ProtocolError        bytes on a connection that are not commrt's
    ├── CommTimeoutError (TimeoutError)
    ├── MessageTruncatedError (ValueError)
    ├── AbortedError (RuntimeError)      the communicator was aborted (Communicator.abort)
    │   └── CollectiveMismatchError      ... because ranks called different collectives
    ├── ConcurrentCollectiveError (RuntimeError)  two threads in collectives of one communicator
    ├── CancelledError                   a request cancelled before it matched
    ├── StoreError (RuntimeError)
    └── BootstrapError (RuntimeError)

Failure codes.  An abort carries a FailureCode (what went wrong first) and the
rank it blames (the culprit) to every rank of the communicator, so every rank
raises the same error naming the same rank.  ``error_for`` turns a code back
into an exception; every error class has the ``code`` it travels as.
"""
import enum


class FailureCode(enum.IntEnum):
    """Why a communicator was aborted (carried on the wire: keep the numbers)."""
    ABORTED = 1         # Communicator.abort(reason) called by a rank
    MISMATCH = 2        # ranks called different collectives (CollectiveMismatchError)
    PEER_LOST = 3       # a rank died or its connection broke (PeerLostError)
    TIMEOUT = 4         # a rank's collective passed its deadline (CommTimeoutError)
    ERROR = 5           # another error inside a collective on one rank


def _rebuild(cls, args, state):
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class CommError(Exception):
    """Base class of every commrt error."""

    code = FailureCode.ERROR

    def __reduce__(self):
        # errors cross process boundaries (test worlds, launchers): pickle
        # them by state, whatever their __init__ takes
        return _rebuild, (type(self), self.args, self.__dict__)


class TransportError(CommError, ConnectionError):
    """A connection failed or misbehaved."""


class PeerLostError(TransportError):
    """A peer process died, or its connection was closed or reset."""

    code = FailureCode.PEER_LOST

    def __init__(self, rank, detail="", op=None, tag=None):
        self.rank = rank
        self.op = op
        self.tag = tag
        self.detail = detail
        where = f" during {op}" if op else ""
        where += f" (tag {tag})" if tag is not None else ""
        msg = f"lost peer rank {rank}{where}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class PeerUnresponsiveError(PeerLostError):
    """A peer sent no heartbeat within COMMRT_LIVENESS_TIMEOUT_S: its process is
    stopped or frozen, or the link to it is cut (it did not exit)."""


class AuthError(TransportError):
    """A connection did not prove it knows the job's secret."""


class ProtocolError(TransportError):
    """Bytes that do not follow commrt's wire format."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait passed its deadline (COMMRT_TIMEOUT or timeout=)."""

    code = FailureCode.TIMEOUT

    def __init__(self, op, peer=None, tag=None, timeout=None, detail=""):
        self.op, self.peer, self.tag, self.timeout = op, peer, tag, timeout
        self.detail = detail
        msg = f"{op} timed out"
        if timeout is not None:
            msg += f" after {timeout:g} s"
        if peer is not None:
            msg += f" waiting on rank {peer}"
        if tag is not None:
            msg += f", tag {tag}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class MessageTruncatedError(CommError, ValueError):
    """The receive buffer is smaller than the message that matched it."""

    def __init__(self, message_bytes, buffer_bytes, source=None, tag=None, meta=None,
                 meta2=None):
        self.message_bytes, self.buffer_bytes = message_bytes, buffer_bytes
        self.source, self.tag = source, tag
        self.meta, self.meta2 = meta, meta2   # the message's header words (a collective's
                                              # fingerprint)
        super().__init__(
            f"message of {message_bytes} bytes from rank {source} (tag {tag}) does not fit "
            f"the receive buffer of {buffer_bytes} bytes"
        )


class AbortedError(CommError, RuntimeError):
    """The communicator was aborted: every pending and later operation on it fails.

    code: the FailureCode; rank: the rank blamed (the one that failed first,
    or that called abort); origin: the rank that started the abort."""

    def __init__(self, reason, code=FailureCode.ABORTED, rank=None, origin=None):
        self.reason, self.code, self.rank, self.origin = reason, FailureCode(code), rank, origin
        # the culprit in the text too: the launcher names the job's cause from ranks' stderr
        super().__init__(reason if rank is None else f"{reason} (culprit rank {rank})")


class CollectiveMismatchError(AbortedError):
    """Ranks called different collectives, or the same one with different arguments
    (the communicator is aborted on every rank involved)."""

    def __init__(self, reason, code=FailureCode.MISMATCH, rank=None, origin=None):
        super().__init__(reason, FailureCode.MISMATCH, rank, origin)


class ConcurrentCollectiveError(CommError, RuntimeError):
    """A thread entered a collective of a communicator while another thread was
    inside one (collectives of one communicator take one thread at a time)."""


class CancelledError(CommError):
    """The request was cancelled (Request.cancel) before it matched a message."""


class StoreError(CommError, RuntimeError):
    """The rendezvous store failed or refused a request."""


class BootstrapError(CommError, RuntimeError):
    """commrt.init() could not build the world from the environment."""


def error_for(code, reason, rank=None, origin=None, op=None):
    """The exception a rank raises when told of an abort (code, culprit rank, origin):
    the same class the failing rank raised, naming the same culprit."""
    code = FailureCode(code)
    told = f" (rank {origin} failed first)" if origin is not None and origin != rank else ""
    if code == FailureCode.PEER_LOST and rank is not None:
        exc = PeerLostError(rank, f"seen by rank {origin}: {reason}" if origin is not None
                            else reason, op=op)
    elif code == FailureCode.TIMEOUT:
        exc = CommTimeoutError(op or "collective", rank, detail=f"{reason}{told}")
    elif code == FailureCode.MISMATCH:
        exc = CollectiveMismatchError(reason, rank=rank, origin=origin)
    else:
        exc = AbortedError(reason, code, rank, origin)
    exc.origin = origin
    return exc
