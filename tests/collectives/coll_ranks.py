"""Rank-side functions of the collectives tests (module level, so spawned ranks import them).

Every rank regenerates every other rank's input from (seed, rank), so each
can compute the NumPy reference itself and check its own result.
"""
import functools
import json
import os
import time

import numpy as np

import commrt.collectives as C
from commrt.errors import CollectiveMismatchError, CommError, PeerLostError

UFUNC = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
         "AVG": np.add, "LAND": np.logical_and, "LOR": np.logical_or,
         "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def data(seed, rank, n, dtype, op="SUM"):
    rng = np.random.default_rng([seed, rank])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if op in ("LAND", "LOR"):
            return rng.integers(0, 3, n).astype(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    if op == "PROD":
        x = rng.uniform(0.5, 1.5, n)
    else:
        x = rng.standard_normal(n) * 10
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(n)
    return x.astype(dt)


def reference(seed, size, n, dtype, op):
    """(expected, tolerance array or None for exact)."""
    xs = [data(seed, q, n, dtype, op) for q in range(size)]
    dt = np.dtype(dtype)
    uf = UFUNC[op]
    if dt.kind == "b" and op in ("SUM", "MAX"):
        uf = np.logical_or
    elif dt.kind == "b" and op in ("PROD", "MIN"):
        uf = np.logical_and
    with np.errstate(all="ignore"):
        if dt.kind in "fc" and op in ("SUM", "PROD", "AVG"):
            wide = np.complex128 if dt.kind == "c" else np.float64
            acc = functools.reduce(uf, [x.astype(wide) for x in xs])
            if op == "AVG":
                acc = acc / size
            scale = (np.sum([np.abs(x.astype(wide)) for x in xs], axis=0) if op != "PROD"
                     else np.abs(acc))
            if op == "AVG":
                scale = scale / size
            eps = np.finfo(dt).eps
            tol = 2 * size * eps * scale + np.finfo(dt).tiny
            return acc, tol
        acc = functools.reduce(lambda a, b: uf(a, b).astype(dt), xs)
        if op == "AVG":
            acc = np.floor_divide(acc, size)
        return acc.astype(dt), None


def check(got, want, tol, what):
    if tol is None:
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)[:5]
            raise AssertionError(f"{what}: wrong at {bad.tolist()}: got {got[bad]}, want {want[bad]}")
        return
    err = np.abs(got.astype(want.dtype) - want)
    if not np.all(err <= tol):
        i = int(np.argmax(err - tol))
        raise AssertionError(f"{what}: element {i} got {got[i]} want {want[i]} (tol {tol[i]})")


def digest(a):
    import hashlib

    return hashlib.sha1(a.tobytes()).hexdigest()


# -- collectives ------------------------------------------------------------------
def all_reduce(comm, seed, n, dtype, op, algo, async_op=False):
    x = data(seed, comm.rank, n, dtype, op)
    want, tol = reference(seed, comm.size, n, dtype, op)
    if async_op:
        req = C.all_reduce(comm, x, op, algo, async_op=True)
        assert req.wait(60) is x
        assert req.test()
    else:
        assert C.all_reduce(comm, x, op, algo) is x
    check(x, want, tol, f"all_reduce {algo} {op} {dtype} n={n} rank {comm.rank}")
    return digest(x)


def broadcast(comm, seed, n, dtype, root, algo):
    x = data(seed, comm.rank, n, dtype)
    C.broadcast(comm, x, root, algorithm=algo)
    check(x, data(seed, root, n, dtype), None, f"broadcast {algo} root {root}")
    return True


def reduce(comm, seed, n, dtype, op, root, algo):
    x = data(seed, comm.rank, n, dtype, op)
    mine = x.copy()
    C.reduce(comm, x, root, op, algorithm=algo)
    if comm.rank == root:
        want, tol = reference(seed, comm.size, n, dtype, op)
        check(x, want, tol, f"reduce {algo} {op} {dtype} root {root}")
    else:
        check(x, mine, None, "reduce must leave non-root buffers alone")
    return True


def all_gather(comm, seed, n, dtype, algo):
    x = data(seed, comm.rank, n, dtype)
    out = np.empty(comm.size * n, dtype)
    C.all_gather(comm, out, x, algorithm=algo)
    want = np.concatenate([data(seed, q, n, dtype) for q in range(comm.size)]) if comm.size else out
    check(out, want.astype(dtype), None, f"all_gather {algo}")
    return True


def reduce_scatter(comm, seed, n, dtype, op, algo):
    x = data(seed, comm.rank, comm.size * n, dtype, op)
    x0 = x.copy()
    out = np.empty(n, dtype)
    C.reduce_scatter(comm, out, x, op, algorithm=algo)
    want, tol = reference(seed, comm.size, comm.size * n, dtype, op)
    sl = slice(comm.rank * n, (comm.rank + 1) * n)
    check(out, want[sl], None if tol is None else tol[sl], f"reduce_scatter {algo} {op} {dtype}")
    check(x, x0, None, "reduce_scatter must not write buf")
    return True


def gather(comm, seed, n, dtype, root):
    x = data(seed, comm.rank, n, dtype)
    out = np.empty(comm.size * n, dtype) if comm.rank == root else None
    res = C.gather(comm, x, out, root)
    if comm.rank == root:
        assert res is out
        want = np.concatenate([data(seed, q, n, dtype) for q in range(comm.size)])
        check(out, want.astype(dtype), None, "gather")
    else:
        assert res is None
    return True


def scatter(comm, seed, n, dtype, root):
    buf = data(seed, 1000, comm.size * n, dtype) if comm.rank == root else None
    out = np.empty(n, dtype)
    C.scatter(comm, out, buf, root)
    want = data(seed, 1000, comm.size * n, dtype)[comm.rank * n:(comm.rank + 1) * n]
    check(out, want, None, "scatter")
    return True


def all_to_all(comm, seed, n, dtype):
    size = comm.size
    x = data(seed, comm.rank, size * n, dtype)
    out = np.empty(size * n, dtype)
    C.all_to_all(comm, out, x)
    want = np.concatenate([data(seed, q, size * n, dtype)[comm.rank * n:(comm.rank + 1) * n]
                           for q in range(size)])
    check(out, want.astype(dtype), None, "all_to_all")
    return True


def objects(comm, seed):
    obj = {"rank": comm.rank, "blob": bytes(seed % 5000) * (comm.rank + 1), "seed": seed}
    root = seed % comm.size
    got = C.broadcast_obj(comm, obj if comm.rank == root else None, root)
    assert got["rank"] == root and got["seed"] == seed
    every = C.all_gather_obj(comm, obj)
    assert [o["rank"] for o in every] == list(range(comm.size))
    assert all(len(o["blob"]) == (seed % 5000) * (o["rank"] + 1) for o in every)
    g = C.gather_obj(comm, comm.rank * 10, root)
    assert (g == [q * 10 for q in range(comm.size)]) if comm.rank == root else g is None
    C.barrier(comm)
    return True


# -- traffic ---------------------------------------------------------------------------
def _sent_recv(comm):
    s = comm.stats()
    return (sum(v["bytes_sent"] for v in s.values()), sum(v["bytes_recv"] for v in s.values()),
            sum(v["header_bytes_sent"] for v in s.values()),
            {q: v["bytes_sent"] for q, v in s.items()})


def traffic(comm, kind, algo, n, dtype="float32", root=0):
    """Payload bytes this rank sent and received during one collective (after a warm-up)."""
    x = np.ones(n, dtype)
    out = np.empty(comm.size * n, dtype)
    small = np.empty(n, dtype)

    def once():
        if kind == "all_reduce":
            C.all_reduce(comm, x, "SUM", algo)
        elif kind == "broadcast":
            C.broadcast(comm, x, root, algorithm=algo)
        elif kind == "reduce":
            C.reduce(comm, x, root, "SUM", algorithm=algo)
        elif kind == "all_gather":
            C.all_gather(comm, out, x, algorithm=algo)
        elif kind == "reduce_scatter":
            C.reduce_scatter(comm, small, out, "SUM", algorithm=algo)
        elif kind == "gather":
            C.gather(comm, x, out if comm.rank == root else None, root)
        elif kind == "scatter":
            C.scatter(comm, small, out if comm.rank == root else None, root)
        elif kind == "all_to_all":
            C.all_to_all(comm, out, out.copy())
        elif kind == "barrier":
            C.barrier(comm)

    # Barriers move no payload.  The snapshots sit between barriers so that no rank
    # has started the measured collective before all took the first one, and all
    # have finished it before any takes the second.
    once()  # warm-up (and the cost model's calibration, if any)
    C.barrier(comm)
    s0, r0, h0, _ = _sent_recv(comm)
    C.barrier(comm)
    once()
    C.barrier(comm)
    s1, r1, h1, _ = _sent_recv(comm)
    C.barrier(comm)
    return {"sent": s1 - s0, "recv": r1 - r0, "hdr": h1 - h0}


# -- mismatches and faults ------------------------------------------------------------
def mismatch(comm, case):
    """Each rank makes its own (deliberately different) call on a fresh group; returns
    (where it raised, message) — it must raise, in the call or in the barrier after."""
    sub = C.new_group(comm, list(range(comm.size)))
    r = comm.rank
    x = np.ones(8, np.float32)
    t0 = time.monotonic()
    try:
        if case == "op":
            C.all_reduce(sub, x, "SUM" if r == 0 else "MAX", "ring")
        elif case == "count":
            C.all_reduce(sub, np.ones(8 + (r == 1), np.float32), "SUM", "ring")
        elif case == "dtype":
            C.all_reduce(sub, x if r else np.ones(8, np.int32), "SUM", "ring")
        elif case == "root":
            C.broadcast(sub, x, root=0 if r == 0 else 1, algorithm="binomial")
        elif case == "kind":  # reduce vs broadcast: both wait, nothing in flight (probes)
            if r == 0:
                C.reduce(sub, x, 0, algorithm="binomial")
            else:
                C.broadcast(sub, x, 0, algorithm="binomial")
        elif case == "silent":  # both only send: found by the next collective
            if r == 0:
                C.broadcast(sub, x, 0, algorithm="binomial")
            else:
                C.reduce(sub, x, 0, algorithm="binomial")
        elif case == "own_root":  # each rank the root of its own broadcast: all only send
            C.broadcast(sub, x, root=r, algorithm="binomial")
        elif case == "algo":
            C.all_reduce(sub, x, "SUM", "ring" if r == 0 else "ps")
        elif case == "async":
            req = C.all_reduce(sub, x, "SUM" if r == 0 else "PROD", "ring", async_op=True)
            req.wait(30)
        C.barrier(sub, timeout=30)
    except CollectiveMismatchError as exc:
        return ("raised", str(exc), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)


def dead_rank(comm, outdir, n):
    """The last rank dies on entry; the others must fail with PeerLostError within 2 s."""
    if comm.rank == comm.size - 1:
        os._exit(3)
    x = np.ones(n, np.float32)
    t0 = time.monotonic()
    try:
        C.all_reduce(comm, x, "SUM", "ring", timeout=60)
        res = {"error": None}
    except PeerLostError as exc:
        res = {"error": "PeerLostError", "msg": str(exc)}
    except CommError as exc:
        res = {"error": type(exc).__name__, "msg": str(exc)}
    res["elapsed"] = time.monotonic() - t0
    with open(os.path.join(outdir, f"{comm.rank}.json"), "w") as f:
        json.dump(res, f)
    return res


# -- sub-communicators, async, cost model --------------------------------------------
def subcomm_concurrency(comm, seed, n):
    """Split into even/odd halves and a reversed group; run async collectives on all
    of them and on the world at once, from two threads; check every result."""
    import threading

    r, size = comm.rank, comm.size
    half = C.split(comm, r % 2, key=-r)
    rev = C.new_group(comm, list(reversed(range(size))))
    assert half.size == len([q for q in range(size) if q % 2 == r % 2])
    assert half.rank == sorted([q for q in range(size) if q % 2 == r % 2], reverse=True).index(r)
    assert rev.rank == size - 1 - r
    none = C.split(comm, None if r == 0 else 5)
    assert (none is None) if r == 0 else (none.size == size - 1)
    errors = []
    results = {}

    def worker(name, c, k):
        try:
            for i in range(k):
                x = np.full(n, c.rank + i, np.float64)
                C.all_reduce(c, x, "SUM", ("ring", "tree", "rabenseifner")[i % 3])
                want = sum(q + i for q in range(c.size))
                assert np.all(x == want), (name, i, x[:3], want)
            results[name] = True
        except BaseException as exc:  # noqa: BLE001
            errors.append((name, repr(exc)))

    reqs = []
    for i in range(3):
        y = np.full(n, comm.rank * (i + 1), np.int64)
        reqs.append((y, i, C.all_reduce(comm, y, "SUM", "ring", async_op=True)))
    threads = [threading.Thread(target=worker, args=("half", half, 6)),
               threading.Thread(target=worker, args=("rev", rev, 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for y, i, req in reqs:
        req.wait(60)
        assert np.all(y == sum(q * (i + 1) for q in range(size)))
    assert not errors, errors
    return True


def choose(comm, nbytes, forced=None):
    from commrt.collectives import cost

    if forced is not None:
        os.environ["COMMRT_ALLREDUCE_ALGO"] = forced
    try:
        x = np.ones(max(1, nbytes // 4), np.float32)
        C.all_reduce(comm, x)
        return cost.choose_allreduce(comm, nbytes), cost.describe(comm)
    finally:
        os.environ.pop("COMMRT_ALLREDUCE_ALGO", None)


def hierarchical(comm, seed, n, hosts):
    """All-reduce with fake hosts (rank -> host id from `hosts`): the result, and
    the payload bytes this rank sent to ranks on other hosts."""
    from commrt.collectives.all_reduce import hierarchical as H

    H.pretend_hosts(comm, hosts)
    try:
        sub = C.new_group(comm, list(range(comm.size)))  # fresh state: groups derived anew
        x = data(seed, comm.rank, n, "float64")
        C.all_reduce(sub, x.copy(), "SUM", "hierarchical")  # warm-up
        before = comm.stats()
        C.all_reduce(sub, x, "SUM", "hierarchical")
        after = comm.stats()
        want, tol = reference(seed, comm.size, n, "float64", "SUM")
        check(x, want, tol, "hierarchical")
        cross = sum(after[q]["bytes_sent"] - before[q]["bytes_sent"] for q in after
                    if hosts[q] != hosts[comm.rank])
        return cross
    finally:
        H.pretend_hosts(comm, None)


def device_arrays(comm, n):
    """Numba device arrays (the CUDA simulator's, on host memory) are staged
    through host memory by every buffer collective."""
    import numba
    from numba import cuda

    assert numba.config.ENABLE_CUDASIM
    size, r = comm.size, comm.rank
    x = cuda.to_device(np.full(n, r + 1, np.float32))
    C.all_reduce(comm, x, "SUM")
    assert np.all(x.copy_to_host() == size * (size + 1) / 2)
    b = cuda.to_device(np.full(n, r, np.int32))
    C.broadcast(comm, b, root=size - 1)
    assert np.all(b.copy_to_host() == size - 1)
    out = cuda.to_device(np.zeros(size * n, np.int32))
    C.all_gather(comm, out, cuda.to_device(np.full(n, r, np.int32)))
    assert np.array_equal(out.copy_to_host(), np.repeat(np.arange(size, dtype=np.int32), n))
    small = cuda.to_device(np.zeros(n, np.float64))
    C.reduce_scatter(comm, small, cuda.to_device(np.ones(size * n, np.float64)), "SUM")
    assert np.all(small.copy_to_host() == size)
    req = C.all_reduce(comm, x, "MAX", async_op=True)
    req.wait(30)
    assert np.all(x.copy_to_host() == size * (size + 1) / 2)
    return True


def gpu_arrays(comm, n):
    """Real GPU buffers (CuPy arrays, Numba device arrays, torch CUDA tensors) go
    through the buffer collectives, staged through host memory, and the
    results land back on the device; non-contiguous device views too."""
    import cupy
    import torch
    from numba import cuda

    size, r = comm.size, comm.rank
    want = size * (size + 1) / 2
    x = cupy.full(n, r + 1, cupy.float32)
    C.all_reduce(comm, x, "SUM")
    assert isinstance(x, cupy.ndarray) and bool((x == want).all())
    t = torch.full((n,), float(r + 1), device="cuda")
    C.all_reduce(comm, t, "SUM")
    assert t.is_cuda and bool((t == want).all())
    strided = cupy.zeros((n, 2), cupy.int64)[:, 1]           # a non-contiguous view
    strided[...] = r
    C.broadcast(comm, strided, root=size - 1)
    assert bool((strided == size - 1).all())
    out = torch.zeros(size * n, dtype=torch.int32, device="cuda")
    C.all_gather(comm, out, torch.full((n,), r, dtype=torch.int32, device="cuda"))
    assert torch.equal(out.cpu(), torch.arange(size, dtype=torch.int32).repeat_interleave(n))
    d = cuda.to_device(np.full(n, r, np.float64))
    C.all_reduce(comm, d, "MAX")
    assert np.all(d.copy_to_host() == size - 1)
    small = cupy.zeros(n, cupy.float64)
    C.reduce_scatter(comm, small, cupy.ones(size * n, cupy.float64), "SUM")
    assert bool((small == size).all())
    req = C.all_reduce(comm, x, "MAX", async_op=True)
    req.wait(30)
    assert bool((x == want).all())
    return str(x.device), str(t.device)


def invalid_arguments(comm):
    """Wrong arguments raise on the calling rank, before any message (so all ranks,
    passing the same wrong arguments, raise alike and nothing is left in flight)."""
    import pytest

    x = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="not defined"):
        C.all_reduce(comm, x, "BXOR")
    with pytest.raises(TypeError, match="AVG"):
        C.all_reduce(comm, np.ones(3, bool), "AVG")
    with pytest.raises(ValueError, match="unknown reduction"):
        C.all_reduce(comm, x, "MEAN")
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        C.all_reduce(comm, x, "SUM", "butterfly")
    with pytest.raises(ValueError, match="contiguous"):
        C.all_reduce(comm, np.ones(8, np.float32)[::2])
    with pytest.raises(ValueError, match="root"):
        C.broadcast(comm, x, root=comm.size)
    with pytest.raises(ValueError, match="out must hold"):
        C.all_gather(comm, np.empty(3, np.float32), x)
    with pytest.raises(ValueError, match="buf must hold"):
        C.reduce_scatter(comm, x, np.ones(5, np.float32))
    with pytest.raises(TypeError):
        C.all_reduce(comm, [1.0, 2.0])
    with pytest.raises(ValueError, match="read-only"):
        ro = np.ones(4, np.float32)
        ro.flags.writeable = False
        C.all_reduce(comm, ro)
    with pytest.raises(ValueError, match="distinct"):
        C.new_group(comm, [0, 0])
    # nothing was sent: the next collective still works
    C.all_reduce(comm, x)
    assert np.all(x == comm.size)
    return True


# -- variable-size collectives ---------------------------------------------------------
def vcounts(seed, size, salt=0):
    """Per-rank counts with zeros and odd numbers, the same on every rank for a seed."""
    rng = np.random.default_rng([seed, salt, size])
    return [int(c) for c in rng.choice([0, 1, 3, 7, 0, 1001, 2], size)]


def varsize(comm, seed, dtype, algo=None, async_op=False):
    """all_gatherv, gatherv, scatterv and all_to_allv at every root against NumPy."""
    size, r = comm.size, comm.rank
    counts = vcounts(seed, size)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    blocks = [data(seed, q, counts[q], dtype) for q in range(size)]
    want = np.concatenate(blocks) if size else None
    out = np.empty(offs[-1], dtype)
    res = C.all_gatherv(comm, out, blocks[r], counts, algorithm=algo, async_op=async_op)
    if async_op:
        res = res.wait(60)
    assert res is out
    check(out, want, None, f"all_gatherv {algo} {dtype} counts {counts}")
    for root in range(size):
        out = np.empty(offs[-1], dtype) if r == root else None
        res = comm.gatherv(blocks[r], out, counts if r == root else None, root)
        if r == root:
            assert res is out
            check(out, want, None, f"gatherv root {root} counts {counts}")
        else:
            assert res is None
        src = data(seed, 1000 + root, offs[-1], dtype) if r == root else None
        mine = np.empty(counts[r], dtype)
        assert comm.scatterv(mine, src, counts if r == root else None, root) is mine
        check(mine, data(seed, 1000 + root, offs[-1], dtype)[offs[r]:offs[r + 1]], None,
              f"scatterv root {root}")
    # all_to_allv: rank i sends m[i][j] elements to rank j
    m = [vcounts(seed, size, 1 + i) for i in range(size)]
    send = [m[r][q] for q in range(size)]
    recv = [m[q][r] for q in range(size)]
    buf = data(seed, r, sum(send), dtype)
    out = np.empty(sum(recv), dtype)
    assert comm.all_to_allv(out, buf, send, recv) is out
    parts = []
    for q in range(size):
        theirs = data(seed, q, sum(m[q]), dtype)
        lo = sum(m[q][:r])
        parts.append(theirs[lo:lo + m[q][r]])
    check(out, np.concatenate(parts).astype(dtype), None, f"all_to_allv {m}")
    return True


def varsize_mismatch(comm):
    """Ranks that disagree on counts raise CollectiveMismatchError naming the sizes."""
    sub = C.new_group(comm, list(range(comm.size)))
    r, n = comm.rank, comm.size
    send = [2] * n
    recv = [2] * n
    recv[(r + 1) % n] = 3          # rank r+1 sends 2, rank r expects 3
    try:
        C.all_to_allv(sub, np.empty(sum(recv), np.int32), np.zeros(sum(send), np.int32), send,
                      recv, timeout=30)
        C.barrier(sub, timeout=30)
    except CollectiveMismatchError as exc:
        return str(exc)
    return None


def varsize_invalid(comm):
    import pytest

    n, r = comm.size, comm.rank
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="one per rank"):
        C.all_gatherv(comm, np.empty(3 * n, np.float32), x, [3] * (n + 1))
    with pytest.raises(ValueError, match="non-negative"):
        C.all_gatherv(comm, np.empty(3 * n, np.float32), x, [-1] + [3] * (n - 1))
    with pytest.raises(TypeError, match="ints"):
        C.all_gatherv(comm, np.empty(3 * n, np.float32), x, [1.5] * n)
    with pytest.raises(ValueError, match=r"buf must hold 2 elements"):
        C.all_gatherv(comm, np.empty(2 * n, np.float32), x, [2] * n)
    with pytest.raises(ValueError, match="out must hold"):
        C.all_gatherv(comm, np.empty(3 * n + 1, np.float32), x, [3] * n)
    with pytest.raises(ValueError, match="counts"):
        C.gatherv(comm, x, np.empty(3 * n, np.float32), None, r)
    with pytest.raises(ValueError, match="differ"):
        own = [1] * n
        other = list(own)
        other[r] = 2
        C.all_to_allv(comm, np.empty(sum(other), np.float32), np.ones(n, np.float32), own, other)
    C.all_reduce(comm, x)  # nothing was sent: the next collective still works
    assert np.all(x == n)
    return True


def calibration_timeout(comm):
    """Rank 1 starts the job's first all-reduce alone (rank 0 never joins it): the
    cost model's calibration inside it times out, and the error names the user's
    call, not the internal one."""
    from commrt.errors import CommTimeoutError

    if comm.rank == 0:
        time.sleep(3)
        return None
    try:
        C.all_reduce(comm, np.ones(4, np.float32), timeout=1.5)
    except CommTimeoutError as exc:
        return str(exc)
    return "no error"


def calibration_with_a_stalled_rank(comm, stall_s):
    """Rank 1 stalls for stall_s inside one of the calibration's fresh calls (a
    descheduled or stopped rank on a loaded host), so the others wait past the
    probe interval there and probe each other: the calibration still ends, and
    the user's all-reduce with it."""
    from commrt.collectives import cost

    if comm.rank == 1:
        made, fresh_call = [0], cost._fresh_call

        def stalling(call):
            made[0] += 1
            if made[0] == 7:
                time.sleep(stall_s)
            return fresh_call(call)
        cost._fresh_call = stalling
    x = np.ones(4, np.float32)
    C.all_reduce(comm, x)
    assert np.all(x == comm.size)
    return True


def calibration_behind_a_rank_past_it(comm, stall_s, rank3_calls="broadcast"):
    """N = 4, the user's broadcast rooted at rank 3.  Rank 2 stalls before the
    calibration's last broadcast (root 0; its third, after the first and the
    pair measurement's), so rank 3, its child there, waits in
    the calibration while rank 0, done with it, waits in the user's broadcast on
    rank 3 and probes it with that call's fingerprint at the same number: rank 3
    must wait, not take it for a mismatch (a SIGSTOP campaign job at N = 6
    aborted with "rank 5 called broadcast #2 (its calibrate ...); rank 0 called
    #2 broadcast(count=100 ...)").  rank3_calls="reduce": rank 3 then calls a
    reduce instead, a real mismatch, which the probes find once it is in that
    call; returns the error's text."""
    from commrt.collectives.broadcast import binomial

    if comm.rank == 2:
        run, seen = binomial.run, [0]

        def stalling(call, buf, root, who=None):
            if call.kind == "calibrate":
                seen[0] += 1
                if seen[0] == 3:
                    time.sleep(stall_s)
            return run(call, buf, root, who)
        binomial.run = stalling
    x = np.full(100, 7.0 if comm.rank == 3 else 0.0, np.float32)
    try:
        if comm.rank == 3 and rank3_calls == "reduce":
            C.reduce(comm, x, root=3)
        else:
            C.broadcast(comm, x, root=3)
    except CommError as exc:
        return f"{type(exc).__name__}: {exc}"
    assert np.all(x == 7.0)
    return True


def calibration_leaves_numbers(comm):
    """The first all-reduce calibrates the cost model inside it (its barrier plan
    and fresh calls among it): afterwards the user's calls are numbered 0, 1, ...
    and the history holds them only."""
    from commrt.collectives.state import state_of

    x = np.ones(4, np.float32)
    C.all_reduce(comm, x)
    st = state_of(comm)
    after_first = (st.seq, [e[0] for e in st.history])
    C.all_reduce(comm, x, algorithm="tree")
    assert np.all(x == comm.size ** 2)
    return after_first, st.seq
