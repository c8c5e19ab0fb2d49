"""Rank-side functions of the persistent exchange chain tests (transport/chain.pxi)."""
import json
import os
import time

import numpy as np

from commrt.errors import MessageTruncatedError, PeerLostError
from commrt.kernels import combine_address

TAG = 5


def doubling_chain(comm, dtype, op, tmp):
    """Recursive doubling over a power-of-two world, combining with the C loop,
    the lower rank's operand first."""
    steps = []
    mask = 1
    while mask < comm.size:
        peer = comm.rank ^ mask
        steps.append((peer, peer, combine_address(op, dtype, comm.rank > peer)))
        mask <<= 1
    return comm._exchange_chain(steps, tmp, tmp.size, TAG)


def values(comm, rnd, n):
    return np.arange(n, dtype=np.float64) * (comm.rank + 1) + rnd


def sums(comm, rounds, n, rebind):
    """`rounds` chain runs (on one buffer, or a new one each time): their return
    values, results, and the live requests and bytes sent before and after."""
    tmp = np.empty(n, np.float64)
    ch = doubling_chain(comm, np.float64, "sum", tmp)
    buf = np.empty(n, np.float64)
    out = {"ret": [], "ok": [], "nsteps": ch.nsteps}
    live0 = comm._engine.memory_info()["live_requests"]
    for rnd in range(rounds):
        if rebind:
            buf = np.empty(n, np.float64)
        buf[:] = values(comm, rnd, n)
        want = sum(values(type("C", (), {"rank": r})(), rnd, n) for r in range(comm.size))
        out["ret"].append(ch.run(buf, 1000 + rnd, 10.0))
        out["ok"].append(bool(np.array_equal(buf, want)))
    out["live_growth"] = comm._engine.memory_info()["live_requests"] - live0
    return out


def refused_buffers(comm):
    """Buffers that do not fit: -1, nothing sent; the chain still works after."""
    tmp = np.empty(4, np.float32)
    ch = doubling_chain(comm, np.float32, "sum", tmp)
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    sent0 = sum(v["msgs_sent"] for v in comm.stats().values())
    rets = [ch.run(np.ones(8, np.float32)[::2], 1, 5.0),     # not contiguous
            ch.run(ro, 1, 5.0),                               # read-only
            ch.run(np.ones(5, np.float32), 1, 5.0),           # another size
            ch.run(np.ones((2, 2), np.float32).T, 1, 5.0),    # Fortran order only
            ch.run(b"1234567890123456", 1, 5.0)]              # read-only bytes
    sent1 = sum(v["msgs_sent"] for v in comm.stats().values())
    x = np.full(4, comm.rank + 1, np.float32)
    ret = ch.run(x, 2, 5.0)
    return rets, sent1 - sent0, ret, x.tolist()


def no_hook(comm):
    """A dissemination barrier's chain: empty messages, no hook; and a chain of no step."""
    n, r = comm.size, comm.rank
    steps = []
    d = 1
    while d < n:
        steps.append(((r + d) % n, (r - d) % n, 0))
        d <<= 1
    empty = np.zeros(0, np.uint8)
    ch = comm._exchange_chain(steps, empty, 0, TAG)
    rets = [ch.run(empty, 7, 5.0) for _ in range(5)]
    none = comm._exchange_chain([], np.zeros(3), 3, TAG)
    return rets, len(steps), none.run(np.zeros(3), 7, 5.0)


def meta_mismatch(comm):
    """Rank r runs with meta 100 + r: the chain stops at step 0 and hands over the
    requests, the receive holding the other's meta and data; then it runs clean."""
    tmp = np.zeros(2, np.float64)
    ch = doubling_chain(comm, np.float64, "sum", tmp)
    buf = np.full(2, comm.rank + 1.0)
    k = ch.run(buf, 100 + comm.rank, 10.0)
    rq, sq = ch.handover()
    st = rq.wait(10)
    sq.wait(10)
    again = ch.handover()
    out = {"k": k, "meta": st.meta, "source": st.source, "nbytes": st.nbytes,
           "tmp": tmp.tolist(), "buf": buf.tolist(), "again": again}
    buf[:] = comm.rank + 1.0
    out["clean"] = ch.run(buf, 200, 10.0)
    out["sum"] = buf.tolist()
    return out


def late_peer(comm, wait):
    """Rank 1 comes 0.3 s late; rank 0's run gives up after `wait` and hands over a
    receive that completes later, uncombined; then both run clean twice."""
    tmp = np.zeros(3, np.float64)
    ch = doubling_chain(comm, np.float64, "sum", tmp)
    buf = np.full(3, comm.rank + 1.0)
    if comm.rank == 1:
        time.sleep(0.3)
        k = ch.run(buf, 9, wait)
        out = {"k": k, "handover": ch.handover()}
    else:
        k = ch.run(buf, 9, wait)
        rq, sq = ch.handover()
        st = rq.wait(10)
        sq.wait(10)
        out = {"k": k, "meta": st.meta, "tmp": tmp.tolist(), "buf_before": buf.tolist()}
    rets = []
    for i in range(2):
        buf[:] = comm.rank + 1.0
        rets.append(ch.run(buf, 10 + i, 10.0))
    out["rets"] = rets
    out["sum"] = buf.tolist()
    out["live"] = comm._engine.memory_info()["live_requests"]
    return out


def dead_peer(comm, outdir):
    """The last rank exits once both are ready; rank 0's run (wait 30 s) stops at
    step 0 and the handed-over receive raises PeerLostError naming it."""
    tmp = np.zeros(2, np.float64)
    ch = doubling_chain(comm, np.float64, "sum", tmp)
    buf = np.ones(2, np.float64)
    assert ch.run(buf, 1, 10.0) == ch.nsteps        # a clean run first
    if comm.rank == comm.size - 1:
        comm.recv(np.zeros(1), 0, 3, timeout=10)
        os._exit(3)
    comm.send(np.zeros(1), comm.size - 1, 3)
    t0 = time.monotonic()
    k = ch.run(buf, 2, 30.0)
    rq, sq = ch.handover()
    try:
        rq.wait(30)
        err = None
    except PeerLostError as exc:
        err = [exc.rank, str(exc)]
    with open(os.path.join(outdir, f"{comm.rank}.json"), "w") as f:
        json.dump([k, err, time.monotonic() - t0], f)


def sizes_differ(comm):
    """Rank 1 exchanges 16 bytes, rank 0 8: rank 0's receive is truncated (an error),
    rank 1's gets 8 bytes where 16 were bound; both chains stop at step 0."""
    n = 2 if comm.rank == 0 else 4
    tmp = np.zeros(n, np.float32)
    ch = doubling_chain(comm, np.float32, "sum", tmp)
    k = ch.run(np.ones(n, np.float32), 1, 10.0)
    rq, sq = ch.handover()
    sq.wait(10)
    try:
        st = rq.wait(10)
        return k, "ok", st.nbytes
    except MessageTruncatedError as exc:
        return k, "truncated", str(exc)


def stamped(comm):
    """go(buf, seq) sends stamp()'s base | (seq & mask): the same on every rank runs
    clean; rank r's own base stops the chain at step 0, and the receive handed over
    holds the other rank's base | (seq & mask).  go() before stamp() is refused."""
    tmp = np.zeros(2, np.float64)
    ch = doubling_chain(comm, np.float64, "sum", tmp)
    buf = np.full(2, comm.rank + 1.0)
    out = {}
    try:
        ch.go(buf, 1)
    except ValueError as exc:
        out["unstamped"] = str(exc)
    ch.stamp(7 << 40, 3, 10.0, 0xFF)
    out["clean"] = ch.go(buf, 0x1FF)
    out["sum"] = buf.tolist()
    ch.stamp((comm.rank + 1) << 40, 3, 10.0, 0xFF)
    out["k"] = ch.go(buf, 0x2AB)
    rq, sq = ch.handover()
    out["meta"] = rq.wait(10).meta
    sq.wait(10)
    return out


def learned_spin(comm, pause_s, calls=60):
    """Rank 0 pauses pause_s before each of `calls` runs of a one-step chain (a
    send to rank 1; rank 1's step receives it): rank 1's step learns how long
    to spin from how long the message took.  Returns rank 1's learned budgets
    (µs per step) and the engine's minimum, or None on rank 0."""
    buf = np.zeros(4, np.float64)
    kind, peer = (1, 1) if comm.rank == 0 else (0, 0)
    ch = comm._exchange_chain([([(kind, peer, 0, 0, buf.nbytes, 0)], 0)], None, 0, TAG,
                              nbytes=buf.nbytes)
    ch.stamp(9 << 40, 0, 10.0, 0xFF)
    for k in range(calls):
        if comm.rank == 0 and pause_s:
            time.sleep(pause_s)
        assert ch.go(buf, k) == 1
    return None if comm.rank == 0 else ch.spin_budgets_us


def lanes(comm, nbytes):
    """Rank 0's one step sends block A on tag 9, then block B on tag 10, then block
    C on the chain's own tag; rank 1's step posts its receives in the other
    order (C's range on the chain's tag, then tag 10, then tag 9): each message
    names its tag, so each lands where its own tag's receive is, whatever the
    order.  Also: a tag below -1 is refused.  Returns (rank 1's three ranges,
    the refusal) as lists of the first element of each block."""
    k = nbytes // 8
    buf = np.zeros(3 * k, np.float64)
    if comm.rank == 0:
        buf[:k], buf[k:2 * k], buf[2 * k:] = 1.0, 2.0, 3.0
        msgs = [(1, 1, 0, 0, nbytes, 0, 0, 0, 0, 9), (1, 1, 0, nbytes, nbytes, 0, 0, 0, 0, 10),
                (1, 1, 0, 2 * nbytes, nbytes, 0)]
    else:
        msgs = [(0, 0, 0, 0, nbytes, 0, 0, 0, 0, -1), (0, 0, 0, nbytes, nbytes, 0, 0, 0, 0, 10),
                (0, 0, 0, 2 * nbytes, nbytes, 0, 0, 0, 0, 9)]
    ch = comm._exchange_chain([(msgs, 0)], None, 0, TAG, nbytes=buf.nbytes)
    ch.stamp(9 << 40, 0, 10.0, 0xFF)
    assert ch.go(buf, 1) == 1
    refused = None
    try:
        comm._exchange_chain([([(1, 1 - comm.rank, 0, 0, 8, 0, 0, 0, 0, -2)], 0)], None, 0, TAG,
                             nbytes=8)
    except ValueError as exc:
        refused = str(exc)
    return [float(buf[0]), float(buf[k]), float(buf[2 * k])], refused
