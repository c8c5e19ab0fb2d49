"""Buffers that do not expose the buffer protocol: DLPack and
``__cuda_array_interface__`` (GPU) arrays.

The compiled core takes host memory through the buffer protocol directly
(the fast path).  Anything else comes here and is staged through a host
NumPy array: ``stage(obj, writable)`` returns ``(host, copy_back)``; for a
receive, ``copy_back()`` moves the received bytes into ``obj`` once the
request completes.  There is no device-direct path yet.
"""
import numpy as np


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def stage(obj, writable):
    """A contiguous host array holding obj's bytes, and a copy-back callable (or None)."""
    if hasattr(obj, "__cuda_array_interface__"):
        return _stage_cuda(obj, writable)
    if hasattr(obj, "__dlpack__"):
        try:
            host = np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise ValueError(f"buf: cannot read this DLPack array from the host: {exc}") from None
        if not host.flags.c_contiguous and not host.flags.f_contiguous:
            raise ValueError("buf: a non-contiguous DLPack array cannot be sent or received in "
                             "place; pass a contiguous copy")
        if writable and not host.flags.writeable:
            raise ValueError("buf: a read-only DLPack array cannot receive data")
        return host.reshape(-1).view(np.uint8), None
    raise TypeError(f"buf: a {type(obj).__name__} is not a buffer: expected an object with the "
                    f"buffer protocol, DLPack or __cuda_array_interface__ (e.g. a NumPy array)")


def _stage_cuda(obj, writable):
    iface = obj.__cuda_array_interface__
    strides = iface.get("strides")
    shape = tuple(iface["shape"])
    itemsize = np.dtype(iface["typestr"]).itemsize
    if strides is not None and strides != _c_strides(shape, itemsize):
        raise ValueError("buf: a non-contiguous GPU array cannot be sent or received in place; "
                         "pass a contiguous copy")
    if writable and iface["data"][1]:
        raise ValueError("buf: a read-only GPU array cannot receive data")
    cupy = _cupy()
    if cupy is None:
        raise TypeError("buf: GPU arrays need CuPy for staging through host memory")
    dev = cupy.asarray(obj)
    nbytes = dev.nbytes
    host = np.empty(nbytes, dtype=np.uint8)
    if not writable:
        host[:] = cupy.asnumpy(dev.reshape(-1).view(cupy.uint8))
        return host, None

    def copy_back():
        dev.reshape(-1).view(cupy.uint8).set(host)

    return host, copy_back


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
