"""The measurement loop of the collective benchmarks, written once for every backend.

A backend hands ``measure`` an object with:

    rank, size
    run(kind, algo, out, buf)   one collective (kind: one of KINDS), float32 SUM,
                                root 0 where there is one
    barrier()
    agree(x) -> float           the maximum of x over ranks (for times and counts)

Sizes follow nccl-tests: for all_reduce, broadcast and reduce the buffer;
for all_gather and gather the output (N blocks); for reduce_scatter and
scatter the input (N blocks); for all_to_all each buffer (N blocks); a
barrier moves nothing (its rows say 0 bytes).  A spec may list several
``kinds``: every one is measured in the same processes, one after another.
Per (size, algorithm): one checked run (values rank+1, outside the timed
region), warm-up, then a number of iterations chosen so the loops fill
``target_s`` (agreed by all ranks), run in ``slices`` (5) timed slices
between barriers, the algorithms of one size taking turns slice by slice
so that a burst of load from other jobs hits them alike.  The time of one
collective is the median over slices of the slowest rank's average.
commrt and Gloo ranks are bound to cores as mpirun binds OpenMPI's
(``bind``).

``counts`` in the spec adds to each row what a call cost its process
(``getrusage`` around each timed slice, the busiest rank's, per call): user
and system CPU in µs and voluntary (slept) and involuntary (preempted or
yielded) context switches.  Where ranks outnumber cores that tells a waiter
that yields the core too often, or falls asleep, from one that spends its
time running code.

``fresh`` in the spec writes the input before every timed call, as a
training step's gradients or activations are written before they are sent:
without it the input never changes, and a rank that reads a peer's input
(single copy) finds its lines in its own cache from the last call, which a
real job never does.  The writes are timed apart and taken out of the time
of the collective (the same for every backend).

``align`` in the spec (bytes, default ALIGN: 64) places every buffer at that
alignment, as PyTorch's CPU allocator places a tensor (64 bytes); 0 leaves
it where NumPy's allocator puts it (16 bytes past a page from a fresh mmap,
anywhere 16-aligned on the heap, which depends on what the process freed
before).  The single-copy reads are kernel copies (process_vm_readv), and
those run 1.5-5x slower where source and destination differ in their
alignment mod 64 (16 MiB: 0.9-1.2 ms mutually aligned, 2.3 ms 16 bytes apart,
5.5 ms 8 apart, here; a user-space copy does not care).  Left to NumPy, that
alignment was an accident of each system's allocation history, the same
from run to run, which kept the same large cells behind
(docs/performance-collectives.md, "Thirty-sixth session").

``wire`` in the spec (a ``/sys/class/net/IFNAME/statistics`` directory) adds
the interface's bytes sent and received per call, read around each timed
slice; on hosts whose ranks share the interface that is the host's traffic,
the busiest host's (bench hosts --wire).
"""
import os
import resource
import time

import numpy as np

from commrt.transport.buffers import aligned_empty

SLICES = 5
# where every benchmark buffer starts (bytes; 0: wherever NumPy puts it): PyTorch's
# CPU allocator's alignment, so that two ranks' buffers are mutually aligned
ALIGN = 64
# The pages under every large benchmark buffer (bytes from HUGE_MIN, a huge page's
# size): "huge" (default), "small" (4 KiB), "allocator" (wherever NumPy's
# allocator takes them from).  The kernel's single-copy reads run ~3x slower over
# 4 KiB pages than over 2 MiB ones here (16 MiB: 4.0-4.7 ms against 1.2-1.6), and
# NumPy's pages depend on the process's history: a fresh mmap gets huge pages
# (NumPy advises them from 4 MiB), memory glibc reuses from its heap keeps the
# small pages it was first touched with.
PAGES = "huge"
PAGE_POLICIES = ("huge", "small", "allocator")
KINDS = ("broadcast", "reduce", "gather", "scatter", "all_gather", "reduce_scatter",
         "all_to_all", "barrier", "all_reduce")
# The variable-size collectives (not in "all"; --kinds v names them): rank q's
# block holds block - q elements (at least 1), all_to_allv's block from rank s to
# rank d block - (s + d) mod N, so no two ranks' counts agree; sizes count as the
# fixed-size sibling's (all_gatherv and gatherv the output, scatterv the input,
# all_to_allv each buffer), less those few elements.
VKINDS = ("all_gatherv", "gatherv", "scatterv", "all_to_allv")


def v_counts(kind, nbytes, size):
    """The counts of a variable-size kind at nbytes: a list (rank q's block), or for
    all_to_allv the matrix [src][dst]."""
    block = max(1, max(1, nbytes // 4) // size)
    if kind == "all_to_allv":
        return [[max(1, block - (s + d) % size) for d in range(size)] for s in range(size)]
    return [max(1, block - q) for q in range(size)]


def zeros(count, align=ALIGN, pages=PAGES):
    """count float32 zeros starting at a multiple of align bytes (0: NumPy's own
    placement and pages); from HUGE_MIN bytes on, on the pages asked for
    ("huge", "small"; "allocator": NumPy's), as transport.buffers.aligned_empty
    places them."""
    if not align:
        return np.zeros(count, np.float32)
    a = aligned_empty(count, np.float32, align, pages)
    a.fill(0)
    return a


def _v_buffers(kind, nbytes, size, rank, align=ALIGN, pages=PAGES):
    c = v_counts(kind, nbytes, size)
    if kind == "all_to_allv":
        return (zeros(sum(c[s][rank] for s in range(size)), align, pages),
                zeros(sum(c[rank]), align, pages))
    if kind == "scatterv":
        return zeros(c[rank], align, pages), zeros(sum(c), align, pages)
    return zeros(sum(c), align, pages), zeros(c[rank], align, pages)


def _buffers(kind, nbytes, size, rank=0, align=ALIGN, pages=PAGES):
    if kind in VKINDS:
        return _v_buffers(kind, nbytes, size, rank, align, pages)
    count = max(1, nbytes // 4)
    block = max(1, count // size)
    if kind in ("all_gather", "gather"):
        return zeros(block * size, align, pages), zeros(block, align, pages)
    if kind in ("reduce_scatter", "scatter"):
        return zeros(block, align, pages), zeros(block * size, align, pages)
    if kind == "all_to_all":
        return zeros(block * size, align, pages), zeros(block * size, align, pages)
    if kind == "barrier":
        return None, zeros(0, align, pages)
    return None, zeros(count, align, pages)


def _v_checked(kind, r, n, out, c):
    """_checked for the variable-size kinds (c: their counts)."""
    if kind == "scatterv":
        return np.all(out == r + 1)
    if kind == "all_to_allv":               # the block from rank q holds q*n + r
        want = np.concatenate([np.full(c[q][r], q * n + r, np.float32) for q in range(n)])
        return np.array_equal(out, want)
    want = np.concatenate([np.full(c[q], q + 1, np.float32) for q in range(n)])
    return (kind == "gatherv" and r != 0) or np.array_equal(out, want)


def _checked(kind, r, n, out, buf, counts=None):
    """Whether the output of one call (inputs as _check sets them) is right on rank r."""
    if kind in VKINDS:
        return _v_checked(kind, r, n, out, counts)
    blocks = np.arange(1, n + 1, dtype=np.float32)[:, None]
    if kind == "all_reduce":
        return np.all(buf == n * (n + 1) / 2)
    if kind == "broadcast":
        return np.all(buf == 1)
    if kind == "reduce":
        return r != 0 or np.all(buf == n * (n + 1) / 2)
    if kind == "all_gather":
        return np.all(out.reshape(n, -1) == blocks)
    if kind == "gather":
        return r != 0 or np.all(out.reshape(n, -1) == blocks)
    if kind == "scatter":
        return np.all(out == r + 1)
    if kind == "all_to_all":   # rank q's block j holds q*n + j
        return np.all(out.reshape(n, -1) == (np.arange(n)[:, None] * n + r))
    if kind == "barrier":
        return True
    return np.all(out == n * (n + 1) / 2)                  # reduce_scatter


def _check(ops, kind, algo, out, buf):
    r, n = ops.rank, ops.size
    c = getattr(ops, "counts", None)
    if kind == "scatter":                   # root's block j holds j + 1
        buf.reshape(n, -1)[...] = np.arange(1, n + 1, dtype=np.float32)[:, None]
    elif kind == "all_to_all":              # block j holds r*n + j
        buf.reshape(n, -1)[...] = (r * n + np.arange(n, dtype=np.float32))[:, None]
    elif kind == "scatterv":
        buf[...] = np.concatenate([np.full(c[q], q + 1, np.float32) for q in range(n)])
    elif kind == "all_to_allv":
        buf[...] = np.concatenate([np.full(c[r][d], r * n + d, np.float32) for d in range(n)])
    else:
        buf[...] = r + 1
    ops.run(kind, algo, out, buf)
    ok = _checked(kind, r, n, out, buf, c)
    if ops.agree(0.0 if ok else 1.0) != 0.0:
        raise AssertionError(f"{kind} {algo}: wrong result on some rank")


def measure(ops, spec):
    # Timed loops reduce the same buffer over and over: float32 sums overflow to
    # inf after a few hundred calls, which costs nothing but NumPy's warnings.
    with np.errstate(over="ignore", invalid="ignore"):
        return _measure(ops, spec)


def _measure(ops, spec):
    rows = []
    for kind in spec.get("kinds") or [spec["kind"]]:
        if kind in getattr(ops, "unsupported", ()):
            continue                        # a peer without this collective: no row
        algos = spec["algos"]
        if isinstance(algos, dict):
            algos = algos[kind]
        sizes = [0] if kind == "barrier" else spec["sizes"]
        for row in _measure_kind(ops, spec, kind, algos, sizes):
            row["kind"] = kind
            rows.append(row)
    return {"rank": ops.rank, "size": ops.size, "rows": rows}


def wire_bytes(path):
    """(sent, received) bytes so far of the network interface whose statistics
    directory is path (``/sys/class/net/IFNAME/statistics``)."""
    with open(os.path.join(path, "tx_bytes")) as f:
        tx = int(f.read())
    with open(os.path.join(path, "rx_bytes")) as f:
        return tx, int(f.read())


def _measure_kind(ops, spec, kind, algos, sizes):
    target = spec.get("target_s", 0.1)
    slices = max(1, spec.get("slices", SLICES))
    out_rows = []
    for nbytes in sizes:
        out, buf = _buffers(kind, nbytes, ops.size, ops.rank, spec.get("align", ALIGN),
                            spec.get("pages", PAGES))
        # a variable-size kind's counts at this size, for the backend's run
        ops.counts = v_counts(kind, nbytes, ops.size) if kind in VKINDS else None
        iters = {}
        chose = None
        for algo in algos:
            before = ops.choices(kind) if algo == "auto" and hasattr(ops, "choices") else None
            _check(ops, kind, algo, out, buf)
            if before is not None:
                chose = _new_choice(before, ops.choices(kind))
            ops.barrier()
            t0 = time.perf_counter()
            for _ in range(2):
                ops.run(kind, algo, out, buf)
            est = ops.agree((time.perf_counter() - t0) / 2)
            n = int(min(spec.get("max_iters", 2000), max(3, target / max(est, 1e-7))))
            iters[algo] = max(1, -(-n // slices))
        times = {algo: [] for algo in iters}
        used = {algo: [0.0] * 4 for algo in iters}
        counts = spec.get("counts")
        wire = spec.get("wire")
        wired = {algo: [0, 0] for algo in iters}
        fresh = spec.get("fresh") and buf is not None and buf.size
        for _ in range(slices):  # algorithms take turns, so a burst of load hits them alike
            for algo, n in iters.items():
                ops.barrier()
                r0 = resource.getrusage(resource.RUSAGE_SELF) if counts else None
                w0 = wire_bytes(wire) if wire else None
                t0 = time.perf_counter()
                if fresh:
                    dt = _timed_fresh(ops, kind, algo, out, buf, n, t0)
                else:
                    for _ in range(n):
                        ops.run(kind, algo, out, buf)
                    dt = time.perf_counter() - t0
                if wire:
                    w1 = wire_bytes(wire)
                    wired[algo][0] += w1[0] - w0[0]
                    wired[algo][1] += w1[1] - w0[1]
                if counts:
                    _add_usage(used[algo], r0, resource.getrusage(resource.RUSAGE_SELF))
                times[algo].append(ops.agree(dt / n))
        for algo, ts in times.items():
            ts.sort()
            row = {"bytes": nbytes, "algo": algo, "time_s": ts[len(ts) // 2],
                   "iters": iters[algo] * slices}
            if algo == "auto" and chose:
                row["chose"] = chose
            calls = iters[algo] * slices
            if counts:
                row["counts"] = {name: ops.agree(v / calls) for name, v in
                                 zip(COUNTS, used[algo])}
            if wire:
                # the interface is the host's: its ranks read the same counters, and
                # the largest over ranks is the busiest host's
                row["wire"] = {"tx": ops.agree(wired[algo][0] / calls),
                               "rx": ops.agree(wired[algo][1] / calls)}
            out_rows.append(row)
    return out_rows


def _new_choice(before, after):
    """The algorithm the cost model chose for the call just made: the one entry
    its memo gained (None: none, or several)."""
    new = [a for size, a in after.items() if size not in before]
    return new[0] if len(new) == 1 else None


def _timed_fresh(ops, kind, algo, out, buf, n, t0):
    """n calls, each after writing the input; the seconds they took without the
    writes."""
    writing = 0.0
    for i in range(n):
        w0 = time.perf_counter()
        buf.fill(i & 7)
        writing += time.perf_counter() - w0
        ops.run(kind, algo, out, buf)
    return time.perf_counter() - t0 - writing


COUNTS = ("usr_us", "sys_us", "vcs", "ivcs")    # per call: CPU µs, context switches


def _add_usage(acc, r0, r1):
    acc[0] += (r1.ru_utime - r0.ru_utime) * 1e6
    acc[1] += (r1.ru_stime - r0.ru_stime) * 1e6
    acc[2] += r1.ru_nvcsw - r0.ru_nvcsw
    acc[3] += r1.ru_nivcsw - r0.ru_nivcsw


# -- commrt (a World rank) ----------------------------------------------------------
class CommrtOps:
    def __init__(self, comm):
        import commrt.collectives as C

        self.C, self.comm = C, comm
        self.rank, self.size = comm.rank, comm.size
        self._x = np.zeros(1, np.float64)

    def choices(self, kind):
        """{reference bytes: algorithm} the cost model has chosen for kind so far."""
        from commrt.collectives import cost

        return cost.choices(kind, self.comm)

    def run(self, kind, algo, out, buf):
        C, comm = self.C, self.comm
        a = None if algo == "auto" else algo
        if kind in VKINDS:
            self._run_v(kind, a, out, buf)
        elif kind == "all_reduce":
            C.all_reduce(comm, buf, "SUM", a)
        elif kind == "broadcast":
            C.broadcast(comm, buf, 0, algorithm=a)
        elif kind == "reduce":
            C.reduce(comm, buf, 0, "SUM", algorithm=a)
        elif kind == "gather":
            C.gather(comm, buf, out if self.rank == 0 else None, 0, algorithm=a)
        elif kind == "scatter":
            C.scatter(comm, out, buf if self.rank == 0 else None, 0, algorithm=a)
        elif kind == "all_gather":
            C.all_gather(comm, out, buf, algorithm=a)
        elif kind == "all_to_all":
            C.all_to_all(comm, out, buf, algorithm=a)
        elif kind == "barrier":
            C.barrier(comm)
        else:
            C.reduce_scatter(comm, out, buf, "SUM", algorithm=a)

    def _run_v(self, kind, a, out, buf):
        C, comm, c, root = self.C, self.comm, self.counts, self.rank == 0
        if kind == "all_gatherv":
            C.all_gatherv(comm, out, buf, c, algorithm=a)
        elif kind == "gatherv":
            C.gatherv(comm, buf, out if root else None, c if root else None, 0, algorithm=a)
        elif kind == "scatterv":
            C.scatterv(comm, out, buf if root else None, c if root else None, 0, algorithm=a)
        else:
            C.all_to_allv(comm, out, buf, c[self.rank], [row[self.rank] for row in c],
                          algorithm=a)

    def barrier(self):
        self.C.barrier(self.comm)

    def agree(self, x):
        self._x[0] = x
        self.C.all_reduce(self.comm, self._x, "MAX", "recursive_doubling")
        return float(self._x[0])


def commrt_entry(comm, spec):
    bind(comm.rank, comm.size)
    return measure(CommrtOps(comm), spec)


def bind(rank, size):
    """Pin this rank to one core when the ranks fit on the cores, as mpirun binds
    OpenMPI's ranks by default (np <= 2: one core each; more ranks than cores:
    unbound).  Without it, other jobs on a shared host can leave two ranks on
    one core, where a rank spinning on its peer holds the core the peer needs."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return
    if size <= len(cores):
        try:
            threads = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            threads = [0]
        for tid in threads:  # every thread, progress threads included
            try:
                os.sched_setaffinity(tid, {cores[rank]})
            except OSError:
                pass
