"""Rank-side functions of test_reduce_order.py: results bit for bit against NumPy
combining the ranks' float32 buffers in each algorithm's documented order.

float32 addition rounds, so (a + b) + c and (a + c) + b differ in some
elements of random data: a reduce-receive that combined two messages in
arrival order instead of the algorithm's order shows here, where the
property tests' tolerance would let it through.
"""
import numpy as np

import commrt.collectives as C


def data(seed, rank, n):
    return (np.random.default_rng([seed, rank]).standard_normal(n) * 10).astype(np.float32)


def tree(xs):
    """Heap-ordered binary tree: (own + first child's) + second child's, at every node."""
    def value(r):
        v = xs[r].copy()
        for c in (2 * r + 1, 2 * r + 2):
            if c < len(xs):
                v = v + value(c)
        return v
    return value(0)


def binomial(xs, root):
    """Binomial reduce: relative rank v adds v+1, v+2, v+4... below its lowest set bit."""
    n = len(xs)

    def value(v):
        acc = xs[(v + root) % n].copy()
        mask = 1
        while mask < n and not v & mask:
            if v + mask < n:
                acc = acc + value(v + mask)
            mask <<= 1
        return acc
    return value(0)


def recursive_doubling(xs):
    """Fold (odd rank's own + the even rank's below), then the lower virtual rank's
    partial result on the left at every step."""
    n = len(xs)
    p2 = 1 << (n.bit_length() - 1)
    rem = n - p2
    vals = [xs[2 * v + 1] + xs[2 * v] if v < rem else xs[v + rem].copy() for v in range(p2)]
    mask = 1
    while mask < p2:
        vals = [vals[min(v, v ^ mask)] + vals[max(v, v ^ mask)] for v in range(p2)]
        mask <<= 1
    return vals[0]


def ps(xs):
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = acc + x
    return acc


def _same(got, want, what):
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    if bad.size:
        raise AssertionError(f"{what}: {bad.size} elements differ from the documented order, "
                             f"first {bad[:5].tolist()}: got {got[bad[:5]]}, want {want[bad[:5]]}")


def all_reduce(comm, seed, n, algo):
    xs = [data(seed, q, n) for q in range(comm.size)]
    want = {"tree": tree, "reduce_bcast": lambda v: binomial(v, 0), "ps": ps,
            "recursive_doubling": recursive_doubling}[algo](xs)
    x = xs[comm.rank].copy()
    C.all_reduce(comm, x, "SUM", algo)
    _same(x, want, f"all_reduce {algo} rank {comm.rank}")
    return True


def reduce(comm, seed, n, root):
    xs = [data(seed, q, n) for q in range(comm.size)]
    x = xs[comm.rank].copy()
    C.reduce(comm, x, root, "SUM", algorithm="binomial")
    if comm.rank == root:
        _same(x, binomial(xs, root), f"reduce binomial root {root}")
    return True


def reduce_scatter(comm, seed, m):
    size, r = comm.size, comm.rank
    xs = [data(seed, q, size * m) for q in range(size)]
    out = np.empty(m, np.float32)
    C.reduce_scatter(comm, out, xs[r], "SUM", algorithm="direct")
    want = xs[r][r * m:(r + 1) * m].copy()
    for q in range(size):
        if q != r:
            want = want + xs[q][r * m:(r + 1) * m]
    _same(out, want, f"reduce_scatter direct rank {r}")
    # pairwise: our own block, then the copies of ranks r-1, r-2, ... (mod N)
    C.reduce_scatter(comm, out, xs[r], "SUM", algorithm="pairwise")
    want = xs[r][r * m:(r + 1) * m].copy()
    for k in range(1, size):
        want = want + xs[(r - k) % size][r * m:(r + 1) * m]
    _same(out, want, f"reduce_scatter pairwise rank {r}")
    return True
