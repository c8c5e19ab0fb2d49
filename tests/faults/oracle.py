"""Random collectives and their NumPy reference, shared by the fault jobs and the soak.

Operation i of a stream with seed s is drawn from (s, i) alone, and rank r's
input from (s, i, r), so every rank draws the same stream and can compute the
expected result of every rank itself, with no message beyond the collective.
Inputs are small integers (also in float dtypes), so every reduction is exact
whatever the order of combination: results are compared bit for bit.
"""
import functools

import numpy as np

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
               "reduce_scatter", "all_to_all", "barrier")
DTYPES = ("float32", "float64", "int32", "int64")
OPS = ("SUM", "MIN", "MAX", "PROD")
# element counts: 0, tiny, odd, not divisible by world sizes, past the eager limit
COUNTS = (0, 1, 3, 7, 100, 1001, 5000, 70001)
COUNT_WEIGHTS = (1, 4, 4, 4, 4, 3, 2, 1)
_UFUNC = {"SUM": np.add, "MIN": np.minimum, "MAX": np.maximum, "PROD": np.multiply}


def spec(seed, i, size):
    """The i-th operation of stream `seed` in a world of `size` ranks."""
    rng = np.random.default_rng([seed, i])
    coll = COLLECTIVES[rng.integers(len(COLLECTIVES))]
    w = np.array(COUNT_WEIGHTS, dtype=float)
    count = int(COUNTS[rng.choice(len(COUNTS), p=w / w.sum())])
    if coll in ("all_gather", "gather", "scatter", "reduce_scatter", "all_to_all"):
        count = min(count, 5000)        # per block: size blocks travel
    return {"i": i, "seed": seed, "coll": coll, "count": count,
            "dtype": DTYPES[rng.integers(len(DTYPES))], "op": OPS[rng.integers(len(OPS))],
            "root": int(rng.integers(size))}


def data(s, rank, n):
    """Rank `rank`'s n input elements of operation s: small integers, exact everywhere."""
    rng = np.random.default_rng([s["seed"], s["i"], rank])
    lo, hi = (-1, 3) if s["op"] == "PROD" else (-50, 51)
    return rng.integers(lo, hi, n).astype(s["dtype"])


def _reduce(s, size, n):
    with np.errstate(all="ignore"):
        return functools.reduce(lambda a, b: _UFUNC[s["op"]](a, b).astype(s["dtype"]),
                                [data(s, q, n) for q in range(size)])


def run(comm, s):
    """Run operation s on comm and check this rank's result; returns a digest of it.
    Raises AssertionError naming the operation on a wrong result."""
    import commrt

    r, size, n, root = comm.rank, comm.size, s["count"], s["root"]
    op = getattr(commrt, s["op"])
    coll = s["coll"]
    if coll == "barrier":
        comm.barrier()
        return 0
    if coll in ("all_reduce", "reduce", "broadcast"):
        buf = data(s, r, n)
        mine = buf.copy()
        if coll == "all_reduce":
            comm.all_reduce(buf, op)
            want = _reduce(s, size, n)
        elif coll == "reduce":
            comm.reduce(buf, root, op)
            want = _reduce(s, size, n) if r == root else mine
        else:
            comm.broadcast(buf, root)
            want = data(s, root, n)
        got = buf
    elif coll in ("all_gather", "gather"):
        buf = data(s, r, n)
        out = np.full(size * n, -7, dtype=s["dtype"])
        if coll == "all_gather":
            comm.all_gather(out, buf)
        else:
            comm.gather(buf, out if r == root else None, root)
        full = np.concatenate([data(s, q, n) for q in range(size)])
        want = full if (coll == "all_gather" or r == root) else np.full(size * n, -7, s["dtype"])
        got = out
    elif coll == "scatter":
        out = np.full(n, -7, dtype=s["dtype"])
        comm.scatter(out, data(s, root, size * n) if r == root else None, root)
        want = data(s, root, size * n)[r * n:(r + 1) * n]
        got = out
    elif coll == "reduce_scatter":
        out = np.full(n, -7, dtype=s["dtype"])
        comm.reduce_scatter(out, data(s, r, size * n), op)
        want = _reduce(s, size, size * n)[r * n:(r + 1) * n]
        got = out
    elif coll == "all_to_all":
        out = np.full(size * n, -7, dtype=s["dtype"])
        comm.all_to_all(out, data(s, r, size * n))
        want = np.concatenate([data(s, q, size * n)[r * n:(r + 1) * n] for q in range(size)])
        got = out
    else:
        raise ValueError(f"unknown collective {coll}")
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)[:5].tolist()
        raise AssertionError(f"op {s['i']} {coll} count={n} {s['dtype']} {s['op']} root={root} "
                             f"on rank {r} of {size}: wrong at {bad}: got {got[bad]}, "
                             f"want {want[bad]}")
    return int(np.sum(got.astype(np.int64)))
