"""Reduction kernel throughput: commrt.kernels.reduce_into against np.add(a, b, out=a).

    python -m commrt.bench kernels [--sizes 4K,64K,...] [--dtypes float32,...]
                                   [--ops sum,...] [--rounds 7] [--json out.json]

For each size, dtype and op, both loops are timed in alternating rounds (the
machine's speed drifts, so each round times both back to back) and the table
gives the medians with their spread: GB/s as bytes of ``dst`` reduced per
second, and ``ratio`` = median over rounds of (np.add time / reduce_into
time) for the same arrays.  The target is ratio >= 0.9 at every size.
``path`` says which twin ran (numba: serial loop; numba-par: Numba's
threads; numpy: NumPy's loop, e.g. float16).
"""
import argparse
import json
import time

import numpy as np

from commrt.bench._stats import Summary, fmt_size, parse_size, table

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"


def _time(fn, a, b, target_s):
    """Seconds per call of fn(a, b), looping enough calls to fill ~target_s."""
    fn(a, b)
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(a, b)
        dt = time.perf_counter() - t0
        if dt >= target_s or n >= 1 << 22:
            return dt / n
        n = max(n * 2, int(n * target_s / max(dt, 1e-9)))


def _path(a, op):
    from commrt.kernels import reduce as R

    table_ = R._FAST.get(op) or {}
    fast = table_.get(a.dtype)
    if fast is None:
        return "numpy"
    if a.size < fast[2]:
        return "numba"
    return "numba-par" if fast[1] is fast[3] else "numpy-large"


def measure(nbytes, dtype, op, rounds, target_s):
    from commrt.kernels import reduce_into

    dt = np.dtype(dtype)
    n = max(1, nbytes // dt.itemsize)
    rng = np.random.default_rng(0)
    if dt.kind in "iu":
        a = rng.integers(0, 3, n).astype(dt)
        b = rng.integers(0, 3, n).astype(dt)
    elif dt.kind == "b":
        a = rng.integers(0, 2, n).astype(dt)
        b = rng.integers(0, 2, n).astype(dt)
    else:  # values that stay finite however often the loops add them
        a = np.zeros(n, dt)
        b = np.zeros(n, dt)

    def ours(x, y):
        reduce_into(x, y, op)

    def numpy_add(x, y):
        np.add(x, y, out=x)

    t_np, t_us, ratios = [], [], []
    for _ in range(rounds):
        tn = _time(numpy_add, a, b, target_s)
        tu = _time(ours, a, b, target_s)
        t_np.append(nbytes / tn / 1e9)
        t_us.append(nbytes / tu / 1e9)
        ratios.append(tn / tu)
    return {"bytes": n * dt.itemsize, "dtype": dt.name, "op": op, "path": _path(a, op),
            "np_add_gbs": Summary(t_np).as_dict(), "ours_gbs": Summary(t_us).as_dict(),
            "ratio": Summary(ratios).as_dict()}


def main(argv):
    p = argparse.ArgumentParser(prog="python -m commrt.bench kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--ops", default="sum")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--target-s", type=float, default=0.05, help="seconds per timed loop")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results, rows = [], []
    worst = None
    for dtype in args.dtypes.split(","):
        for op in args.ops.split(","):
            for nbytes in sizes:
                r = measure(nbytes, dtype, op, args.rounds, args.target_s)
                results.append(r)
                ratio = Summary([])
                ratio.median, ratio.min, ratio.max, ratio.n = (r["ratio"][k] for k in
                                                                ("median", "min", "max", "n"))
                cells = []
                for key in ("np_add_gbs", "ours_gbs"):
                    s = Summary([])
                    s.median, s.min, s.max, s.n = (r[key][k] for k in ("median", "min", "max", "n"))
                    cells.append(s.cell())
                rows.append([fmt_size(r["bytes"]), r["dtype"], op, r["path"], *cells, ratio.cell()])
                worst = r["ratio"]["median"] if worst is None else min(worst, r["ratio"]["median"])
                print(f"  {fmt_size(r['bytes'])} {r['dtype']} {op}: ratio {r['ratio']['median']:.2f}",
                      flush=True)
    print()
    print(table(["size", "dtype", "op", "path", "np.add GB/s", "reduce_into GB/s",
                 "ours/np.add"], rows, "lllrrrr"))
    print(f"\nworst median ratio: {worst:.2f} (target >= 0.90)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
