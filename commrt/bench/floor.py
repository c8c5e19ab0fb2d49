"""The memory floor of a large all-reduce: its ranks' reads and combines, no messages.

    python -m commrt.bench floor [--nranks 2,4] [--sizes 16M,64M] [--piece 256K]
        [--rounds 3] [--calls 10] [--peers] [--json out.json]

Where a collective is memory-bound (large blocks, ranks sharing the cores),
its time is set by the bytes its ranks copy and combine, not by its
messages.  This measures that work on the host: N processes, spawned and
placed as the benchmarks' ranks are, each with one buffer of S bytes
(float32, rewritten before every call as with ``--fresh-inputs``), doing at
once what a bandwidth-optimal all-reduce (reduce-scatter then all-gather:
Rabenseifner's and the ring's volumes) asks of a rank, reading the other
ranks' buffers with process_vm_readv as commrt's single-copy receives do:

* reduce_scatter: the other N-1 ranks' copies of our block (S/N each)
  combined into ours (float32 sum, the reduce-receive's C loop), read a
  bounce piece of ``--piece`` bytes at a time as a reduce-receive reads;
* all_gather: the other N-1 ranks' own blocks copied in, one read each;
* all_reduce: both, with a barrier between (the blocks read are final).

No message moves, no rank waits on another inside a phase, so what is left
is the copying and combining themselves, on cores the ranks share.  A
barrier begins and ends each call, so a call's time is the slowest rank's.
Per round, each phase's median over ``--calls`` calls; the table gives the
median [min-max] over rounds.  With ``--peers`` every round also launches
commrt's all-reduce (auto) and OpenMPI's (default and without single copy,
the better counts), interleaved, and the table gives each over the floor's
all_reduce: OpenMPI's is about the most an algorithm that moves these bytes
this way could be ahead of it.  Not a bound for every algorithm: where each
rank has a core, a sender's idle core can copy half of a message
(transport/shm.pxi, split reads), which no phase here does
(docs/performance-collectives.md, "Thirty-third session").
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

from commrt.bench._stats import Summary, fmt_size, parse_size, table

PHASES = ("reduce_scatter", "all_gather", "all_reduce")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None


def _read_from(pid, dst, addr):
    """Copy len(dst) bytes at addr in process pid into dst with process_vm_readv,
    as the transport's single-copy receive does (its 1 GiB steps)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.process_vm_readv.restype = ctypes.c_ssize_t
    base, n, done = dst.ctypes.data, dst.nbytes, 0
    while done < n:
        step = min(n - done, 1 << 30)
        loc, rem = _Iovec(base + done, step), _Iovec(addr + done, step)
        got = _libc.process_vm_readv(pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)} (the "
                               "floor reads the other ranks' memory as commrt's single-copy "
                               "path does; it needs the same permission)")
        done += got


class Work:
    """One rank's buffer and local work for an all-reduce of nbytes float32 on n
    ranks (the module's docstring): blocks of the other ranks' buffers read
    with process_vm_readv, combined or copied, no message sent."""

    def __init__(self, comm, nbytes, piece):
        self.comm, self.rank, self.n = comm, comm.rank, comm.size
        self.m = m = max(1, nbytes // 4 // self.n)
        # placed and paged as every benchmark's buffers (_coll.zeros: 64-aligned,
        # huge pages from 2 MiB), as the collectives it is compared with
        from commrt.bench._coll import zeros

        self.data = zeros(self.n * m)
        self.bounce = np.empty(max(1, min(piece // 4, m)), np.float32)
        # every rank's (pid, address of its buffer)
        self.where = comm.all_gather_obj((os.getpid(), self.data.ctypes.data))

    def fresh(self, i):
        """Write this rank's input, as a job does before a call (not timed)."""
        self.data.fill(i & 7)

    def own(self):
        r, m = self.rank, self.m
        return self.data[r * m:(r + 1) * m]

    def reduce_scatter(self):
        """Combine the other ranks' copies of our block into ours (r-1, r-2, ...),
        read a bounce piece at a time as a reduce-receive reads."""
        from commrt.kernels import combine_into

        own, p, r, n = self.own(), self.bounce.size, self.rank, self.n
        for k in range(1, n):
            pid, addr = self.where[(r - k) % n]
            at = addr + r * self.m * 4
            for o in range(0, own.size, p):
                b = self.bounce[:min(p, own.size - o)]
                _read_from(pid, b, at + o * 4)
                combine_into(own[o:o + b.size], b, "sum")

    def all_gather(self):
        """Copy every other rank's own block into ours, in one read each."""
        r, m, n = self.rank, self.m, self.n
        for k in range(1, n):
            q = (r + k) % n
            pid, addr = self.where[q]
            _read_from(pid, self.data[q * m:(q + 1) * m], addr + q * m * 4)

    def all_reduce(self):
        self.reduce_scatter()
        self.comm.barrier()         # the blocks the all-gather reads are final
        self.all_gather()


def floor_entry(comm, spec):
    """Rank 0's {phase: {bytes: median seconds per call}} (each call timed from a
    barrier to a barrier); every rank does the work."""
    from commrt.bench._coll import bind

    bind(comm.rank, comm.size)
    out = {ph: {} for ph in spec["phases"]}
    for nbytes in spec["sizes"]:
        w = Work(comm, nbytes, spec["piece"])
        for ph in spec["phases"]:
            fn = getattr(w, ph)
            times = []
            for i in range(spec["calls"] + 2):        # two untimed: pages, caches
                w.fresh(i)
                comm.barrier()
                t0 = time.perf_counter()
                fn()
                comm.barrier()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            out[ph][nbytes] = statistics.median(times)
        comm.barrier()              # no rank frees its buffer while another reads it
    return out


def run_floor(n, spec, timeout):
    from commrt.bench import _launch

    return _launch.run_in_world(n, "shm", floor_entry, spec, timeout,
                                max(5.0, timeout * 0.8))[0]


def _peer_jobs(n, sizes, timeout, log):
    """[(name, job)] of the all-reduces measured beside the floor: commrt's own
    and, where mpirun and mpi4py exist, OpenMPI's two configurations."""
    from commrt.bench import _peers

    spec = {"kinds": ["all_reduce"], "sizes": sizes, "fresh": True}
    return ([("commrt", lambda: _peers.run_commrt(n, dict(spec, algos=["auto"]), "shm",
                                                   timeout))]
            + [(name, lambda job=job: job(dict(spec, algos=["default"])))
               for name, job in _peers.mpi_jobs(n, timeout, log)])


def collect(args, log):
    """{n: {"floor": {phase: {bytes: [s per round]}}, system: {bytes: [...]}}}."""
    data = {}
    for n in args.nranks:
        per = data.setdefault(n, {"floor": {ph: {} for ph in PHASES}})
        spec = {"sizes": args.sizes, "phases": list(PHASES), "piece": args.piece,
                "calls": args.calls}
        jobs = [("floor", lambda n=n: run_floor(n, spec, args.timeout))]
        if args.peers:
            jobs += _peer_jobs(n, args.sizes, args.timeout, log)
        for rnd in range(args.rounds):
            for name, job in jobs:
                log(f"N={n} round {rnd + 1}/{args.rounds}: {name}")
                got = job()
                if name == "floor":
                    for ph, by in got.items():
                        for k, t in by.items():
                            per["floor"][ph].setdefault(int(k), []).append(t)
                else:
                    for row in got["rows"]:
                        per.setdefault(name, {}).setdefault(row["bytes"], []).append(
                            row["time_s"])
    return data


def report(data, sizes):
    """The text tables: per N, each phase's floor and, with peers, the ratios."""
    blocks = []
    for n, per in data.items():
        peers = [s for s in ("commrt", "ompi", "ompi-nocma") if s in per]
        headers = ["size"] + [f"{ph} µs" for ph in PHASES] + [f"{s} µs" for s in peers]
        if peers:
            headers += ["commrt/floor", "OpenMPI/floor"]
        rows = []
        for k in sizes:
            f = {ph: Summary([t * 1e6 for t in per["floor"][ph].get(k, [])]) for ph in PHASES}
            s = {name: Summary([t * 1e6 for t in per[name].get(k, [])]) for name in peers}
            row = [fmt_size(k)] + [f[ph].cell() for ph in PHASES] + [s[x].cell() for x in peers]
            if peers:
                lo = f["all_reduce"].median
                mpi = [s[x].median for x in ("ompi", "ompi-nocma") if x in s and s[x].median]
                row.append(_over(s["commrt"].median, lo))
                row.append(_over(min(mpi) if mpi else None, lo))
            rows.append(row)
        blocks.append(f"all-reduce floor, N = {n} (float32, local work only): µs per call, "
                      f"median [min-max] of rounds\n" + table(headers, rows))
    return "\n\n".join(blocks)


def _over(t, lo):
    return "n/a" if t is None or not lo else f"{t / lo:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m commrt.bench floor",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", default="2,4", help="world sizes (default 2,4)")
    ap.add_argument("--sizes", default="16M,64M", help="all-reduce sizes (default 16M,64M)")
    ap.add_argument("--piece", default="512K",
                    help="bounce piece of the reduce-scatter's reads (default 512K, the "
                         "transport's reduce-receive piece: shm.pxi cma_piece)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="timed calls per phase and round")
    ap.add_argument("--peers", action="store_true",
                    help="also commrt's and OpenMPI's all-reduce, interleaved by round")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="write the samples here")
    args = ap.parse_args(argv)
    args.nranks = [int(x) for x in args.nranks.split(",")]
    args.sizes = [parse_size(x) for x in args.sizes.split(",")]
    args.piece = parse_size(args.piece)
    if min(args.nranks) < 2 or args.rounds < 1 or args.calls < 1 or args.piece < 4:
        ap.error("--nranks from 2, --rounds and --calls from 1, --piece from 4 bytes")
    data = collect(args, lambda msg: print(msg, file=sys.stderr, flush=True))
    print(report(data, args.sizes))
    if args.json:
        from commrt.bench._launch import write_json

        write_json(args.json, data)     # {N: {"floor": {phase: {bytes: [s]}}, system: ...}}
    return 0
