"""The one buffer function of commrt (DESIGN.md "Buffers").

``describe(obj, writable, name)`` turns anything commrt can move into a
``Buffer``: a flat, typed, C-contiguous host NumPy array holding obj's bytes
(``array``; ``pointer``, ``nbytes`` and ``dtype`` read from it), the device
the data lives on, the owner (obj itself, kept alive with the Buffer), and
``finish``: None, or a callable that copies the staged bytes back into obj
once a receive or a collective that writes obj has completed.

Accepted, in this order:
  NumPy arrays                 zero copy
  registered types             an adapter (``register``): commrt.torch registers
                               torch.Tensor (zero copy for contiguous CPU tensors,
                               bfloat16 included); nothing here imports torch
  __cuda_array_interface__     CuPy / Numba device arrays, staged through host memory
                               (strided CuPy views too: the copy back goes through
                               their strides)
  DLPack (__dlpack__)          CPU arrays zero copy through np.from_dlpack
  the buffer protocol          bytes, bytearray, memoryview, array.array: zero copy

A non-contiguous host array is refused with a clear error (an adapter may instead
make an explicit copy and copy it back in ``finish``); a read-only one cannot
be written.  Point-to-point takes buffer-protocol objects straight in C
(``_core.pyx``) and comes here for everything else (``stage``); the
collectives take NumPy arrays straight and come here for everything else.
"""
from commrt import _lazy
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)

__all__ = ["Buffer", "aligned_empty", "describe", "mapped_zeros", "register", "stage"]

# Where commrt allocates memory that messages land in or leave from (scratch,
# plans' receive buffers) it starts at a multiple of this.  The kernel's copy
# (process_vm_readv / writev) runs 1.5-5x slower between addresses that differ
# mod 64 (docs/transport.md, "The kernel's copy and alignment"), and PyTorch's
# tensors and the benchmarks' buffers start at multiples of 64: NumPy's own
# placement is 16 bytes past one for a fresh mmap, anywhere on a 16-byte grid
# from the heap.
ALIGN = 64
# From here on (a huge page's size) commrt's own buffers get huge pages of their
# own: the kernel's copy runs ~3x slower over 4 KiB pages (docs/transport.md),
# and memory glibc reuses from its heap keeps whatever pages it had.
HUGE_MIN = 2 << 20


class Buffer:
    """A host view of a caller's buffer; see the module text."""
    __slots__ = ("array", "device", "owner", "finish")

    def __init__(self, array, device, owner, finish=None):
        self.array, self.device, self.owner, self.finish = array, device, owner, finish

    @property
    def pointer(self):
        return self.array.ctypes.data

    @property
    def nbytes(self):
        return self.array.nbytes

    @property
    def dtype(self):
        return self.array.dtype

    def __repr__(self):
        return (f"<Buffer {self.array.size} x {self.dtype} ({self.nbytes} bytes) on "
                f"{self.device}, {'staged' if self.finish else 'in place'}>")


def aligned_empty(count, dtype, align=ALIGN, pages="huge"):
    """An uninitialised 1-D array of count elements of dtype whose first byte is
    at a multiple of align.  From HUGE_MIN bytes on, pages "huge" (commrt's
    own buffers) or "small" come from a mapping of its own (mapped_zeros,
    zero-filled); "allocator" leaves them to NumPy's allocator."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if pages != "allocator" and nbytes >= HUGE_MIN and HUGE_MIN % align == 0:
        return mapped_zeros(nbytes, pages == "huge").view(dtype)
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes].view(dtype)


def mapped_zeros(nbytes, huge):
    """nbytes zero bytes (a uint8 array) in a private anonymous mapping of their
    own, starting on a huge page's boundary, advised to huge pages (huge) or
    away from them.  Pages come from the kernel, not from the heap, so what
    the process freed before does not decide them; the array keeps the
    mapping alive and unmapping follows its last reference."""
    import mmap

    mm = mmap.mmap(-1, nbytes + HUGE_MIN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:    # before the first touch: the pages are chosen when they fault in
        mm.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    except (OSError, AttributeError):   # no transparent huge pages here: small ones
        pass
    raw = np.frombuffer(mm, np.uint8)
    start = (-raw.ctypes.data) % HUGE_MIN
    return raw[start:start + nbytes]


_ADAPTERS = {}          # type -> adapter(obj, writable, name) -> Buffer


def register(type_, adapter):
    """Let ``describe`` hand objects of type_ (and its subclasses) to adapter."""
    _ADAPTERS[type_] = adapter
    _LOOKUP.clear()


_LOOKUP = {}            # concrete type -> adapter or None (memoised MRO walk)


def _adapter(tp):
    try:
        return _LOOKUP[tp]
    except KeyError:
        pass
    found = None
    for base in tp.__mro__:
        found = _ADAPTERS.get(base)
        if found is not None:
            break
    _LOOKUP[tp] = found
    return found


def describe(obj, writable, name="buf"):
    """obj as a Buffer (see the module text); TypeError or ValueError naming `name`."""
    if isinstance(obj, np.ndarray):
        return Buffer(host_array(obj, writable, name), "cpu", obj)
    adapter = _adapter(type(obj))
    if adapter is not None:
        return adapter(obj, writable, name)
    if hasattr(obj, "__cuda_array_interface__") or (
            type(obj).__module__.startswith("numba.cuda") and hasattr(obj, "copy_to_host")):
        return _stage_cuda(obj, writable, name)
    if hasattr(obj, "__dlpack__"):
        return _dlpack(obj, writable, name)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name}: a {type(obj).__name__} is not a buffer: expected a NumPy "
                        f"array, a torch tensor, or an object with the buffer protocol, DLPack "
                        f"or __cuda_array_interface__") from None
    if not view.contiguous:
        raise ValueError(f"{name}: a non-contiguous buffer cannot be sent or received in place; "
                         f"pass a contiguous copy")
    if writable and view.readonly:
        raise ValueError(f"{name} is read-only")
    try:
        arr = np.frombuffer(view, dtype=np.dtype(view.format) if view.format else np.uint8)
    except (TypeError, ValueError):
        arr = np.frombuffer(view.cast("B"), np.uint8)
    return Buffer(arr, "cpu", obj)


def host_array(a, writable, name="buf"):
    """A NumPy array's flat view, after the contiguity and writability checks."""
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError(f"{name} must be contiguous: a non-contiguous array cannot be sent, "
                         f"received or reduced in place (pass np.ascontiguousarray({name}) and "
                         f"copy the result back)")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if a.dtype.hasobject:       # refused here, before a collective takes its number
        from commrt.transport._core import _pointer_problem

        raise TypeError(_pointer_problem(a, a.dtype.str, writable, name))
    return a.reshape(-1, order="A")


def stage(obj, writable):
    """For point-to-point: (contiguous host array with obj's bytes, copy-back or None)."""
    buf = describe(obj, writable)
    return buf.array, buf.finish


def _dlpack(obj, writable, name):
    try:
        host = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError) as exc:
        raise ValueError(f"{name}: cannot read this DLPack array from the host: {exc} (a "
                         f"bfloat16 torch tensor needs `import commrt.torch`)") from None
    return Buffer(host_array(host, writable, name), "cpu", obj)


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _stage_cuda(obj, writable, name):
    iface = getattr(obj, "__cuda_array_interface__", None) or {
        "shape": obj.shape, "typestr": obj.dtype.str, "data": (0, False)}  # CUDA simulator
    strides = iface.get("strides")
    shape = tuple(iface["shape"])
    dtype = np.dtype(iface["typestr"])
    contiguous = strides is None or tuple(strides) == _c_strides(shape, dtype.itemsize)
    if writable and iface["data"][1]:
        raise ValueError(f"{name}: a read-only GPU array cannot receive data")
    if hasattr(obj, "copy_to_host") and not type(obj).__module__.startswith("cupy"):
        # Numba device arrays (and the simulator's); CuPy stages strided views below
        if not contiguous:
            raise ValueError(f"{name}: a non-contiguous Numba device array cannot be staged "
                             f"through host memory; pass a contiguous copy")
        host = obj.copy_to_host().reshape(-1)

        def back_numba():
            if host.size:
                obj.copy_to_device(host.reshape(shape))
        return Buffer(host, "cuda", obj, back_numba if writable else None)
    cupy = _cupy()
    if cupy is None:
        raise TypeError(f"{name}: GPU arrays need CuPy for staging through host memory")
    dev = cupy.asarray(obj)                # obj's memory, strides and all (no copy)
    host = cupy.asnumpy(dev).reshape(-1)   # a contiguous host copy, written back through them

    def back_cupy():
        if host.size:
            dev[...] = cupy.asarray(host.reshape(shape))
    return Buffer(host, "cuda", obj, back_cupy if writable else None)


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
