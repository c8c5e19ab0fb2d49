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
    ├── CollectiveMismatchError (RuntimeError)
    ├── StoreError (RuntimeError)
    └── BootstrapError (RuntimeError)
"""


def _rebuild(cls, args, state):
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class CommError(Exception):
    """Base class of every commrt error."""

    def __reduce__(self):
        # errors cross process boundaries (test worlds, launchers): pickle
        # them by state, whatever their __init__ takes
        return _rebuild, (type(self), self.args, self.__dict__)


class TransportError(CommError, ConnectionError):
    """A connection failed or misbehaved."""


class PeerLostError(TransportError):
    """A peer process died, or its connection was closed or reset."""

    def __init__(self, rank, detail="", op=None, tag=None):
        self.rank = rank
        self.op = op
        self.tag = tag
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

    def __init__(self, op, peer=None, tag=None, timeout=None, detail=""):
        self.op, self.peer, self.tag, self.timeout = op, peer, tag, timeout
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


class CollectiveMismatchError(CommError, RuntimeError):
    """Ranks called different collectives, or the same one with different arguments."""


class StoreError(CommError, RuntimeError):
    """The rendezvous store failed or refused a request."""


class BootstrapError(CommError, RuntimeError):
    """commrt.init() could not build the world from the environment."""
