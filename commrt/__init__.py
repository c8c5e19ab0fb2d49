"""commrt: a communication runtime for distributed deep-learning training.

``import commrt`` stays light: the compiled transport loads at init(), NumPy
at the first collective call with data (init() and a barrier need none);
Numba, CuPy, the training engine and the collectives load when first used.
"""
from commrt.errors import (  # noqa: F401
    AbortedError, AuthError, BootstrapError, CancelledError, CollectiveMismatchError, CommError,
    CommTimeoutError, ConcurrentCollectiveError, FailureCode, MessageTruncatedError,
    PeerLostError, ProtocolError, StoreError, TransportError,
)

__version__ = "0.1.0"

# Names resolved on first use (PEP 562), so that importing commrt is cheap.
from commrt import _lazy  # noqa: E402  (imports only the standard library)

_LAZY = {
    "init": "commrt.comm",
    "Communicator": "commrt.comm",
    "Request": "commrt.comm",
    "Status": "commrt.comm",
    "wait_all": "commrt.comm",
    "ANY_SOURCE": "commrt.comm",
    "ANY_TAG": "commrt.comm",
    "ReduceOp": "commrt.collectives.ops",
    "SUM": "commrt.collectives.ops",
    "PROD": "commrt.collectives.ops",
    "MIN": "commrt.collectives.ops",
    "MAX": "commrt.collectives.ops",
    "AVG": "commrt.collectives.ops",
    "LAND": "commrt.collectives.ops",
    "LOR": "commrt.collectives.ops",
    "BAND": "commrt.collectives.ops",
    "BOR": "commrt.collectives.ops",
    "BXOR": "commrt.collectives.ops",
}


__getattr__, __dir__ = _lazy.attributes('commrt', _LAZY, globals())
