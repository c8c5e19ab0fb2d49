"""Rank-side functions of the reduce-receive tests (Engine.irecv_reduce)."""
import numpy as np

from commrt.kernels import combine_address

TAG = 11
META = 0xC0FFEE


def values(rank, n, dtype):
    return ((np.arange(n) % 97) * (rank + 1) + rank).astype(dtype)


def pairwise(comm, n, dtype, op, skew):
    """Ranks 0 and 1 each send their values and reduce-receive the other's.
    skew: a 13-byte message first (so the payload sits at an odd offset of the
    TCP stream), and rank 1 posts its receive only after a barrier (the
    message waits as unexpected)."""
    dtype = np.dtype(dtype)
    peer = 1 - comm.rank
    buf = values(comm.rank, n, dtype)
    if skew:
        if comm.rank == 0:
            comm.send(b"thirteen byte", peer, TAG + 1)
        else:
            comm.recv(bytearray(13), peer, TAG + 1)
    hook = combine_address(op, dtype)
    if skew and comm.rank == 1:
        sq = comm.isend(values(comm.rank, n, dtype), peer, TAG, meta=META)
        comm.recv(bytearray(1), peer, TAG + 2)          # rank 0's message has arrived by now
        rq = comm._irecv_reduce(buf, peer, TAG, META, hook)
    else:
        rq = comm._irecv_reduce(buf, peer, TAG, META, hook)
        sq = comm.isend(values(comm.rank, n, dtype), peer, TAG, meta=META)
    if skew and comm.rank == 0:
        sq.wait(60) if n * dtype.itemsize <= comm._engine.eager_limit else None
        comm.send(b"x", peer, TAG + 2)
    st = rq.wait(60)
    sq.wait(60)
    ufunc = {"sum": np.add, "min": np.minimum, "bxor": np.bitwise_xor}[op]
    want = ufunc(values(comm.rank, n, dtype), values(peer, n, dtype))
    return bool(np.array_equal(buf, want)), st.meta, st.nbytes


def to_self(comm, n):
    buf = values(comm.rank, n, np.float64)
    rq = comm._irecv_reduce(buf, comm.rank, TAG, META, combine_address("sum", np.float64))
    comm.send(values(comm.rank, n, np.float64), comm.rank, TAG, meta=META)
    rq.wait(10)
    return bool(np.array_equal(buf, 2 * values(comm.rank, n, np.float64)))


def mismatch(comm, n, what):
    """Rank 0 sends something other than rank 1 expects, then the right message:
    rank 1's buffer must stay untouched by the first and take the second."""
    f8 = np.float64
    if comm.rank == 0:
        wrong = {"meta": (values(0, n, f8), META + 1), "short": (values(0, n - 1, f8), META),
                 "long": (values(0, n + 3, f8), META)}[what]
        comm.send(wrong[0], 1, TAG, meta=wrong[1])
        comm.send(values(0, n, f8), 1, TAG, meta=META)
        return None
    hook = combine_address("sum", f8)
    buf = values(1, n, f8)
    st = comm._irecv_reduce(buf, 0, TAG, META, hook).wait(60)
    untouched = bool(np.array_equal(buf, values(1, n, f8)))
    st2 = comm._irecv_reduce(buf, 0, TAG, META, hook).wait(60)
    summed = bool(np.array_equal(buf, values(0, n, f8) + values(1, n, f8)))
    return untouched, st.meta, st.nbytes, summed, st2.meta, st2.nbytes


def bad_arguments(comm):
    """The argument checks: each entry is the error's text, or None if none was raised."""
    hook = combine_address("sum", np.float64)
    out = {}
    for name, args in {"no hook": (np.zeros(4), 0, 0, 8), "itemsize 3": (np.zeros(4), 0, hook, 3),
                       "split element": (bytearray(12), 0, hook, 8),
                       "read-only": (np.zeros(4).view(), 0, hook, 8)}.items():
        buf, src, h, isz = args
        if name == "read-only":
            buf.setflags(write=False)
        try:
            comm._engine.irecv_reduce(buf, src, 0, TAG, META, h, isz)
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    return out


def copier_headers(comm, n):
    """Rank 0 sends its float64 values twice; rank 1 reduce-receives them with
    copier 0, then copier SENDER.  Rank 1 returns, per copier, whether the sum
    is right and the header bytes that came from rank 0 for it (one RTS where
    it read the message itself, a DATA record per chunk where it streamed)."""
    go = np.zeros(0, np.uint8)
    hook = combine_address("sum", np.dtype("float64"))
    out = []
    for copier in (0, comm.channel.SENDER):
        if comm.rank == 0:
            comm.recv(go, 1, TAG + 3)
            comm.isend(values(0, n, "float64"), 1, TAG, meta=META).wait(60)
            continue
        buf = values(1, n, "float64")
        before = comm.stats()[0]["header_bytes_recv"]
        comm.send(go, 0, TAG + 3)
        comm._irecv_reduce(buf, 0, TAG, META, hook, 0, copier).wait(60)
        headers = comm.stats()[0]["header_bytes_recv"] - before
        out.append((copier, bool(np.array_equal(buf, values(0, n, "float64") + values(1, n, "float64"))),
                    headers))
    return out if comm.rank == 1 else None


def cores(comm):
    import os
    return len(os.sched_getaffinity(0))


def in_pieces(comm, piece, n, dtype, op):
    """pairwise() with reduce-receives read in pieces of `piece` bytes (this
    process's transport), the default size given back after."""
    from commrt.transport import _core

    old = _core._set_cma_piece(piece)
    try:
        return pairwise(comm, n, dtype, op, False)
    finally:
        _core._set_cma_piece(old)


def at_offsets(comm, n, dtype, offsets):
    """pairwise()'s exchange of reduce-receives with each rank's buffers placed at
    each byte offset (from a 64-byte boundary) in turn, the two ranks' offsets
    differing: the bounce buffer of a CMA read takes the sender's offset
    (shm.pxi aligned_like), so every placement must combine every element."""
    dtype = np.dtype(dtype)
    peer = 1 - comm.rank
    hook = combine_address("sum", dtype)
    out = []
    for i, off in enumerate(offsets):
        mine = offsets[(i + comm.rank) % len(offsets)]      # the peer's differs
        raw_b = np.zeros(n * dtype.itemsize + 128, np.uint8)
        raw_s = np.zeros(n * dtype.itemsize + 128, np.uint8)
        start = (-raw_b.ctypes.data) % 64 + mine
        buf = raw_b[start:start + n * dtype.itemsize].view(dtype)
        start = (-raw_s.ctypes.data) % 64 + mine
        src = raw_s[start:start + n * dtype.itemsize].view(dtype)
        buf[:] = values(comm.rank, n, dtype)
        src[:] = values(comm.rank, n, dtype)
        rq = comm._irecv_reduce(buf, peer, TAG, META, hook)
        sq = comm.isend(src, peer, TAG, meta=META)
        rq.wait(60)
        sq.wait(60)
        want = values(comm.rank, n, dtype) + values(peer, n, dtype)
        out.append((off, mine, src.ctypes.data % 64, bool(np.array_equal(buf, want))))
    return out
