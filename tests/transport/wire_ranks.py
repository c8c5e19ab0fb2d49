"""Rank-side functions of the wire tests (header words, flow control, liveness)."""
import numpy as np

from commrt.kernels import combine_address

TAG = 21
HI = (1 << 64) - 1


def meta_words(comm, nbytes):
    """Both 64-bit words of meta reach the receiver's Status, eagerly and by
    rendezvous, through send, isend, sendrecv and a reduce-receive (which
    combines only when both words match)."""
    peer = 1 - comm.rank
    out = {}
    payload = np.full(nbytes, comm.rank + 1, np.uint8)
    got = np.empty(nbytes, np.uint8)
    if comm.rank == 0:
        comm.send(payload, peer, TAG, meta=HI, meta2=HI - 1)
        comm.isend(payload, peer, TAG, meta=1, meta2=1 << 63).wait(30)
    else:
        st = comm.recv(got, peer, TAG, timeout=30)
        out["send"] = (st.meta, st.meta2)
        st = comm.recv(got, peer, TAG, timeout=30)
        out["isend"] = (st.meta, st.meta2)
    st = comm.sendrecv(payload, peer, got, peer, TAG + 1, meta=5, meta2=comm.rank + 7, timeout=30)
    out["sendrecv"] = (st.meta, st.meta2)
    hook = combine_address("sum", np.dtype(np.uint8))
    for mine, theirs in ((3, 3), (3, 4)):           # the second: meta2 differs on rank 0
        acc = np.full(nbytes, 10, np.uint8)
        word2 = theirs if comm.rank == 0 else mine
        rq = comm._irecv_reduce(acc, peer, TAG + 2, 9, hook, meta2=mine)
        sq = comm.isend(payload, peer, TAG + 2, meta=9, meta2=word2)
        st = rq.wait(30)
        sq.wait(30)
        out[f"reduce{theirs}"] = (st.meta2, bool(np.all(acc == 10 + (2 - comm.rank))),
                                  bool(np.all(acc == 10)))
    return out


# -- flow control ---------------------------------------------------------------
FLOOD_TAG = 31


def both_send_first(comm, count, nbytes, timeout):
    """Both ranks send to each other before either receives (unsafe under MPI)."""
    import numpy as np

    from commrt.errors import CommTimeoutError

    peer = 1 - comm.rank
    msg = np.zeros(nbytes, np.uint8)
    try:
        for _ in range(count):
            comm.send(msg, peer, FLOOD_TAG, timeout=timeout)
    except CommTimeoutError as exc:
        return str(exc)
    return None


# -- liveness ----------------------------------------------------------------------
LIVE_TAG = 41


def wait_for_silent(comm, culprit, timeout, stamp_path, delay):
    """The culprit stops itself (SIGSTOP) `delay` s after answering, writing the
    monotonic time first to stamp_path; every other rank waits for a message from
    it that never comes: (error class, message, monotonic time of the error, rank)."""
    import os
    import signal
    import threading
    import time

    if comm.rank == culprit:
        def stop():
            time.sleep(delay)
            with open(stamp_path, "w") as f:
                f.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGSTOP)

        threading.Thread(target=stop, daemon=True).start()
        return None
    try:
        comm.recv(bytearray(8), culprit, LIVE_TAG, timeout=timeout)
    except Exception as exc:                # noqa: BLE001 - reported to the test
        return type(exc).__name__, str(exc), time.monotonic(), getattr(exc, "rank", None)
    return None


def drive_holding_lock_then_answer(comm, hold_s):
    """Rank 1 drives its engine for hold_s without letting go of the engine lock
    (as a waiter driving a long TCP receive nearly does), then answers rank 0,
    which waits for it all along; returns rank 1's liveness_info."""
    if comm.rank == 1:
        comm._engine._drive_holding_lock(hold_s)
        comm.send(bytearray(8), 0, LIVE_TAG, timeout=30)
        return comm._engine.liveness_info()
    if comm.rank == 0:
        st = comm.recv(bytearray(8), 1, LIVE_TAG, timeout=hold_s + 60)
        return st.source
    return None


def compute_then_answer(comm, busy_s, sleep_s):
    """Rank 1 holds the GIL in a tight loop for busy_s, then sleeps in Python for
    sleep_s, then answers rank 0, which waits for it all along."""
    import time

    if comm.rank == 1:
        end = time.monotonic() + busy_s
        n = 0
        while time.monotonic() < end:
            n += 1
        time.sleep(sleep_s)
        comm.send(bytearray(8), 0, LIVE_TAG, timeout=30)
        return n
    if comm.rank == 0:
        st = comm.recv(bytearray(8), 1, LIVE_TAG, timeout=busy_s + sleep_s + 60)
        return st.source
    return None
