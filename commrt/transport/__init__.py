"""The compiled transport (``_core``: event loop, TCP, shared memory, wire format)
and its Python helpers (``connect``, ``buffers``)."""


def last_cache_bytes():
    """The size of this machine's last-level data cache (cpu 0's, from sysfs; 32
    MiB where sysfs says nothing): the size from which the transport copies a
    large block in pieces, and the footprint past which the simulator
    (commrt/sim/validate.py) streams a call's segments from memory."""
    from commrt.transport import _core

    return _core._last_cache_bytes()
