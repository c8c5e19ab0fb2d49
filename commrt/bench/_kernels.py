"""The measurement loops of the p2p benchmark, written once for every backend.

Each backend (commrt, mpi4py, torch.distributed) hands these loops an
``Ops`` object whose members are the backend's own bound methods, so the
timed loops call ``send(buf, dst, tag)`` straight into the library with no
wrapper of ours in between (only Gloo's needs a keyword adapter, negligible
beside its ~70 µs latency):

    rank, size
    send(buf, dst, tag)  recv(buf, src, tag)        blocking
    isend(buf, dst, tag) irecv(buf, src, tag) -> request
    waitall(requests)
    alloc(nbytes) -> buffer the backend accepts (page-aligned, touched)
    array(buf)    -> the same memory as a NumPy uint8 array

The methodology is that of the OSU micro-benchmarks (osu_latency, osu_bw):

* latency: rank 0 sends, rank 1 receives and sends back; latency is half
  the round trip, averaged over the timed iterations after a warm-up;
* bandwidth: rank 0 posts a window of 64 isends of one buffer, rank 1 the
  64 matching irecvs; both wait for all, then rank 1 answers with a small
  acknowledgement; bandwidth = size * window * iterations / time.

Iteration counts scale with the size: the warm-up is timed, and rank 0
picks the number of timed iterations that fills ``target_s`` seconds
(bounded), then tells rank 1.  ``iters`` fixes the count instead.  The
timed iterations run in a few batches, each timed; a run reports the median
batch (and the best), so a moment of contention moves it little.

Before timing a size, one ping-pong of a pattern checks that the bytes
arrive intact both ways (outside the timed region): a benchmark of a wrong
transport is worth nothing.
"""
import os
import statistics
import time

import numpy as np

TAG_DATA = 11
TAG_ACK = 12
TAG_SYNC = 13
TAG_CTRL = 14
TAG_CHECK = 15
TAG_SOAK = 20     # soak uses TAG_SOAK .. TAG_SOAK + 7

_PAGE = 4096


class Ops:
    """A backend's point-to-point calls, gathered under common names."""

    def __init__(self, rank, size, send, recv, isend, irecv, waitall,
                 alloc=None, array=None, name="", info=None):
        self.rank, self.size = rank, size
        self.send, self.recv, self.isend, self.irecv = send, recv, isend, irecv
        self.waitall = waitall
        self.alloc = alloc or aligned
        self.array = array or (lambda buf: buf)
        self.name = name
        self.info = info or (lambda: None)


def aligned(nbytes):
    """A page-aligned, touched NumPy uint8 buffer of nbytes."""
    raw = np.empty(nbytes + _PAGE, np.uint8)
    off = (-raw.ctypes.data) % _PAGE
    buf = raw[off:off + nbytes]
    buf.fill(0)
    return buf


# -- synchronisation built from point-to-point (same for every backend) -------

def barrier(ops):
    """Dissemination barrier of 1-byte messages."""
    n, r = ops.size, ops.rank
    if n == 1:
        return
    if getattr(ops, "_sync", None) is None:
        ops._sync = (ops.alloc(1), ops.alloc(1))
    s, b = ops._sync
    k = 1
    while k < n:
        req = ops.isend(s, (r + k) % n, TAG_SYNC)
        ops.recv(b, (r - k) % n, TAG_SYNC)
        ops.waitall([req])
        k *= 2


def bcast_int(ops, value):
    """Rank 0's value on every rank (8-byte messages, rank 0 to each)."""
    buf = ops.alloc(8)
    view = ops.array(buf).view(np.int64)
    if ops.rank == 0:
        view[0] = value
        for dst in range(1, ops.size):
            ops.send(buf, dst, TAG_CTRL)
    else:
        ops.recv(buf, 0, TAG_CTRL)
    return int(view[0])


def _fill(arr, seed):
    if arr.size:
        arr[:] = (np.arange(arr.size, dtype=np.uint32) * 7 + seed).astype(np.uint8)


def check_pingpong(ops, sbuf, rbuf, nbytes, seed):
    """One ping-pong of a pattern, compared on both ends. Raises on mismatch."""
    s, r = ops.array(sbuf), ops.array(rbuf)
    if ops.rank == 0:
        _fill(s, seed)
        r[:] = 0
        ops.send(sbuf, 1, TAG_CHECK)
        ops.recv(rbuf, 1, TAG_CHECK)
        expect = np.empty_like(s)
        _fill(expect, seed + 1)
    elif ops.rank == 1:
        r[:] = 0
        ops.recv(rbuf, 0, TAG_CHECK)
        expect = np.empty_like(r)
        _fill(expect, seed)
        bad = _first_mismatch(r, expect)
        _fill(s, seed + 1)
        ops.send(sbuf, 0, TAG_CHECK)
        if bad is not None:
            raise AssertionError(f"{ops.name}: rank 1 received wrong bytes in a {nbytes}-byte "
                                 f"message from rank 0: first difference at byte {bad}")
        return
    else:
        return
    bad = _first_mismatch(r, expect)
    if bad is not None:
        raise AssertionError(f"{ops.name}: rank 0 received wrong bytes in a {nbytes}-byte "
                             f"message from rank 1: first difference at byte {bad}")


def _first_mismatch(got, expect):
    if got.size == 0:
        return None
    diff = np.flatnonzero(got != expect)
    return int(diff[0]) if diff.size else None


def _warmup(size, small, large, huge):
    return small if size <= 65536 else (large if size < (16 << 20) else huge)


def _pick_iters(ops, warm, warm_s, target_s, lo, hi, fixed):
    if fixed:
        n = fixed
    else:
        per = warm_s / max(warm, 1)
        n = int(target_s / per) if per > 0 else hi
        n = max(lo, min(hi, n))
    return bcast_int(ops, n)


# -- latency -------------------------------------------------------------------

def _batches(n, k):
    """n iterations split into k batches (as equal as possible, none empty)."""
    k = max(1, min(k, n))
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def latency(ops, sizes, target_s=0.1, iters=None, check=True, batches=5):
    """{size: µs}: half the ping-pong round trip (rank 0's clock).

    The timed iterations run in batches, each timed: the result is the
    median batch ("latency_us") and the best ("latency_us_best"), so a
    moment of contention from other processes moves neither far.
    """
    out, best, counts = {}, {}, {}
    top = max(sizes)
    sbuf, rbuf = ops.alloc(top), ops.alloc(top)
    send, recv = ops.send, ops.recv
    me = ops.rank
    for size in sizes:
        s, r = sbuf[:size], rbuf[:size]
        if check:
            check_pingpong(ops, s, r, size, seed=size & 0xFF)
        warm = _warmup(size, 100, 10, 3)
        barrier(ops)
        t0 = time.perf_counter()
        if me == 0:
            for _ in range(warm):
                send(s, 1, TAG_DATA)
                recv(r, 1, TAG_DATA)
        elif me == 1:
            for _ in range(warm):
                recv(r, 0, TAG_DATA)
                send(s, 0, TAG_DATA)
        n = _pick_iters(ops, warm, time.perf_counter() - t0, target_s, 5, 200000, iters)
        barrier(ops)
        per = []
        for k in _batches(n, batches):
            t0 = time.perf_counter()
            if me == 0:
                for _ in range(k):
                    send(s, 1, TAG_DATA)
                    recv(r, 1, TAG_DATA)
            elif me == 1:
                for _ in range(k):
                    recv(r, 0, TAG_DATA)
                    send(s, 0, TAG_DATA)
            per.append((time.perf_counter() - t0) / (2 * k) * 1e6)
        out[size] = statistics.median(per)
        best[size] = min(per)
        counts[size] = n
    return {"latency_us": out, "latency_us_best": best, "latency_iters": counts}


# -- bandwidth -----------------------------------------------------------------

def bandwidth(ops, sizes, window=64, target_s=0.1, iters=None, check=True, batches=3):
    """{size: MB/s} (10^6 bytes per second), rank 0's clock; median and best batch."""
    out, best, counts = {}, {}, {}
    top = max(sizes)
    sbuf, rbuf, ack = ops.alloc(top), ops.alloc(top), ops.alloc(8)
    isend, irecv, waitall = ops.isend, ops.irecv, ops.waitall
    send, recv = ops.send, ops.recv
    me = ops.rank
    win = range(window)

    def rounds(k):
        if me == 0:
            for _ in range(k):
                waitall([isend(s, 1, TAG_DATA) for _ in win])
                recv(ack, 1, TAG_ACK)
        elif me == 1:
            for _ in range(k):
                waitall([irecv(r, 0, TAG_DATA) for _ in win])
                send(ack, 0, TAG_ACK)

    for size in sizes:
        s, r = sbuf[:size], rbuf[:size]
        if check:
            check_pingpong(ops, s, r, size, seed=(size + 3) & 0xFF)
        warm = _warmup(size, 10, 2, 1)
        barrier(ops)
        t0 = time.perf_counter()
        rounds(warm)
        n = _pick_iters(ops, warm, time.perf_counter() - t0, target_s, 2, 20000, iters)
        barrier(ops)
        per = []
        for k in _batches(n, batches):
            t0 = time.perf_counter()
            rounds(k)
            per.append(size * window * k / (time.perf_counter() - t0) / 1e6)
        out[size] = statistics.median(per)
        best[size] = max(per)
        counts[size] = n
    return {"bw_MBps": out, "bw_MBps_best": best, "bw_iters": counts}


# -- ring (oversubscription) ---------------------------------------------------

def ring(ops, target_s=2.0, warm_laps=10, max_laps=1000000):
    """Pass an 8-byte token round all ranks; µs per hop and lap-time spread.

    Rank 0 decides when to stop (after target_s) by sending -1 round the ring.
    """
    n, me = ops.size, ops.rank
    tok = ops.alloc(8)
    val = ops.array(tok).view(np.int64)
    nxt, prev = (me + 1) % n, (me - 1) % n
    send, recv = ops.send, ops.recv
    barrier(ops)
    if me != 0:
        while True:
            recv(tok, prev, TAG_DATA)
            send(tok, nxt, TAG_DATA)
            if val[0] < 0:
                return {}
    laps = []
    lap = 0
    t_start = None
    while True:
        t0 = time.perf_counter()
        if lap == warm_laps:
            t_start = t0
        stop = t_start is not None and (t0 - t_start >= target_s or lap >= max_laps)
        val[0] = -1 if stop else lap
        send(tok, nxt, TAG_DATA)
        recv(tok, prev, TAG_DATA)
        if stop:
            break
        if lap >= warm_laps:
            laps.append(time.perf_counter() - t0)
        lap += 1
    total = sum(laps)
    laps_us = sorted(x * 1e6 for x in laps)
    return {
        "ring_ranks": n,
        "ring_laps": len(laps),
        "ring_us_per_hop": total / (len(laps) * n) * 1e6 if laps else None,
        "ring_lap_us_median": laps_us[len(laps_us) // 2] if laps else None,
        "ring_lap_us_p99": laps_us[int(len(laps_us) * 0.99)] if laps else None,
        "ring_lap_us_max": laps_us[-1] if laps else None,
    }


# -- overlap -------------------------------------------------------------------

def _matmuls(reps, a, b, c):
    for _ in range(reps):
        np.matmul(a, b, out=c)


def overlap(ops, nbytes=64 << 20, compute_s=0.1, reps=5):
    """A non-blocking transfer of nbytes (rank 0 -> 1) beside compute_s of NumPy.

    Per repetition and rank: t_comp (compute alone), t_comm (isend/irecv and
    wait alone), t_both (post, compute, wait).  Run with one BLAS thread.
    """
    me = ops.rank
    buf = ops.alloc(nbytes)
    a = np.random.default_rng(me).random((128, 128))
    b, c = a.copy(), np.empty_like(a)
    # calibrate, both ranks computing: rank 0 picks the repetitions that take compute_s
    barrier(ops)
    _matmuls(20, a, b, c)
    t0 = time.perf_counter()
    _matmuls(100, a, b, c)
    per = (time.perf_counter() - t0) / 100
    k = bcast_int(ops, max(1, int(compute_s / per)))

    def post():
        if me == 0:
            return [ops.isend(buf, 1, TAG_DATA)]
        if me == 1:
            return [ops.irecv(buf, 0, TAG_DATA)]
        return []

    rows = []
    for rep in range(reps + 1):      # the first is a warm-up
        barrier(ops)
        t0 = time.perf_counter()
        _matmuls(k, a, b, c)
        t_comp = time.perf_counter() - t0
        barrier(ops)
        t0 = time.perf_counter()
        ops.waitall(post())
        t_comm = time.perf_counter() - t0
        barrier(ops)
        t0 = time.perf_counter()
        reqs = post()
        _matmuls(k, a, b, c)
        t_mid = time.perf_counter() - t0
        ops.waitall(reqs)
        t_both = time.perf_counter() - t0
        if rep:
            rows.append({"comp": t_comp, "comm": t_comm, "both": t_both, "comp_in_both": t_mid})
    return {"overlap": rows, "overlap_bytes": nbytes, "overlap_matmuls": k}


# -- soak and memory ------------------------------------------------------------

def proc_snapshot():
    """Resident memory (bytes), open fds, and memfd/shm mappings of this process."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    fds = len(os.listdir("/proc/self/fd"))
    shm_maps = shm_rss = 0
    try:
        with open("/proc/self/smaps") as f:
            current = None
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    current = ("memfd:" in line or "/dev/shm/" in line)
                    if current:
                        lo, hi = line.split(" ", 1)[0].split("-")
                        shm_maps += int(hi, 16) - int(lo, 16)
                elif current and line.startswith("Rss:"):
                    shm_rss += int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"rss": rss, "fds": fds, "shm_mapped": shm_maps, "shm_rss": shm_rss}


def soak(ops, messages=100000, max_bytes=1 << 20, seed=1234):
    """Mixed traffic between ranks 0 and 1; RSS and fds at checkpoints.

    The schedule is drawn from one seed on both ranks: blocking one way or
    the other, a bidirectional isend/irecv pair, or a burst of isends over
    eight tags received in reverse tag order.  Sizes: mostly small (0-1 KiB),
    some medium (to 64 KiB), a few large (to max_bytes).  The first and last
    byte of every message are checked.
    """
    me = ops.rank
    if me > 1:
        return {}
    peer = 1 - me
    rng = np.random.default_rng(seed)
    sbufs = [ops.alloc(max_bytes) for _ in range(8)]
    rbufs = [ops.alloc(max_bytes) for _ in range(8)]
    sarr = [ops.array(b) for b in sbufs]
    rarr = [ops.array(b) for b in rbufs]
    checkpoints = {}
    marks = {0, messages // 10, messages // 2}
    sent = 0
    step = 0
    errors = []

    def draw():
        u = rng.random()
        if u < 0.70:
            return int(rng.integers(0, 1025))
        if u < 0.95:
            return int(rng.integers(1025, 65537))
        return int(rng.integers(65537, max_bytes + 1))

    def stamp(i, n, v):
        if n:
            sarr[i][n - 1] = v ^ 0x5A
            sarr[i][0] = v

    def verify(i, n, v):
        if n and len(errors) < 5:
            first, last = int(rarr[i][0]), int(rarr[i][n - 1])
            if first != v or (n > 1 and last != v ^ 0x5A):
                errors.append(f"step {step} (kind {kind}, buffer {i}): {n}-byte message arrived "
                              f"wrong (first/last byte {first}/{last}, expected {v}/{v ^ 0x5A})")

    next_mark = sorted(marks)
    t_start = time.perf_counter()
    while sent < messages:
        if next_mark and sent >= next_mark[0]:
            checkpoints[next_mark.pop(0)] = proc_snapshot()
        kind = int(rng.integers(0, 4))
        v = step & 0xFF
        if kind in (0, 1):                              # blocking, one way
            n = draw()
            src = kind
            if me == src:
                stamp(0, n, v)
                ops.send(sbufs[0][:n], peer, TAG_SOAK)
            else:
                ops.recv(rbufs[0][:n], peer, TAG_SOAK)
                verify(0, n, v)
            sent += 1
        elif kind == 2:                                 # both ways at once
            n = draw()
            stamp(0, n, v)
            reqs = [ops.irecv(rbufs[0][:n], peer, TAG_SOAK + 1),
                    ops.isend(sbufs[0][:n], peer, TAG_SOAK + 1)]
            ops.waitall(reqs)
            verify(0, n, v)
            sent += 2
        else:                                           # burst over 8 tags
            k = int(rng.integers(2, 9))
            ns = [min(draw(), 65536) for _ in range(k)]
            src = int(rng.integers(0, 2))
            if me == src:
                for i in range(k):
                    stamp(i, ns[i], (v + i) & 0xFF)
                ops.waitall([ops.isend(sbufs[i][:ns[i]], peer, TAG_SOAK + i) for i in range(k)])
            else:
                ops.waitall([ops.irecv(rbufs[i][:ns[i]], peer, TAG_SOAK + i)
                             for i in reversed(range(k))])
                for i in range(k):
                    verify(i, ns[i], (v + i) & 0xFF)
            sent += k
        step += 1
    elapsed = time.perf_counter() - t_start
    barrier(ops)
    checkpoints[sent] = proc_snapshot()
    return {"soak_messages": sent, "soak_steps": step, "soak_s": elapsed,
            "soak_checkpoints": checkpoints,
            "soak_errors": errors}


# -- driver ----------------------------------------------------------------------

def run_tasks(ops, spec):
    """Run the tasks named in spec['tasks'] in order; one dict of results."""
    out = {"rank": ops.rank, "size": ops.size}
    for task in spec["tasks"]:
        if task == "latency":
            out.update(latency(ops, spec["sizes"], spec.get("target_s", 0.1),
                               spec.get("iters"), spec.get("check", True)))
        elif task == "bandwidth":
            out.update(bandwidth(ops, spec["sizes"], spec.get("window", 64),
                                 spec.get("target_s", 0.1), spec.get("iters"),
                                 spec.get("check", True)))
        elif task == "ring":
            out.update(ring(ops, spec.get("ring_s", 2.0)))
        elif task == "overlap":
            out.update(overlap(ops, spec.get("overlap_bytes", 64 << 20),
                               spec.get("compute_s", 0.1), spec.get("reps", 5)))
        elif task == "soak":
            out.update(soak(ops, spec.get("messages", 100000)))
        else:
            raise ValueError(f"unknown task {task!r}")
        barrier(ops)
    info = ops.info()
    if info is not None:
        out["transport_info"] = info
    return out
