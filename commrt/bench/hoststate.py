"""The host's state now: fast, or slow where shared-memory streams crawl (check before a run).

    python -m commrt.bench hoststate [--launches 3] [--wait 120]

Some hosts (the 2-core VMs these tables come from) flip every 30-60 s
between two states.  In the slow one a message streamed through the
shared-memory ring takes 10-12x as long (1 MiB one way: 38-41 -> 458-471
µs), while a process_vm_readv read and a private copy do not change
(docs/performance-collectives.md, "Twenty-sixth session").  A benchmark
whose rounds mix the states reports the state, not the code.  This
measures, in one launch of two ranks pinned as the benchmarks pin them
(rank 0 on the first core, rank 1 on the second): the round trip of 8 bytes,
a private 1 MiB copy, 1 MiB one way from rank 0 and from rank 1 (streamed:
below the single-copy threshold, COMMRT_CMA_MIN_BYTES, 2 MiB by default)
and 4 MiB one way (read with process_vm_readv).  A launch is slow when a
stream either way costs more than ``SLOW_STREAM_PER_COPY`` private copies:
the slow state is often one way only (a stream is as fast as its sender,
and a sender whose core the hypervisor takes away stalls it; its
receiver's stalls the ring absorbs).  ``--wait S`` launches again
every few seconds until one is fast, for at most S seconds: exit status 0
once fast, 1 if the host stayed slow.  Run it on an otherwise quiet host
(load below 1), as the benchmarks: other work inflates every figure.

From code, ``in_fast_state(work)`` runs a piece of measurement in the fast
state (waits for it, probes after, runs again where it changed): ``bench
collectives --fast-state`` and ``sim validate`` use it.
"""
import argparse
import statistics
import sys
import time

import numpy as np

# A 1 MiB stream costs 1.6-1.8 private 1 MiB copies in the fast state and 15-20
# in the slow one (2 cores, 2026-12-06): anything past 5 is the slow state.
SLOW_STREAM_PER_COPY = 5.0
PROBES = ("round_trip_us", "copy_1MiB_us", "stream_1MiB_us", "stream_back_1MiB_us",
          "read_4MiB_us")


def _timed(comm, fn, reps, slices=5):
    """µs per call: the median of slices loops of reps calls, each loop begun on a
    barrier (a burst of other work spoils one slice, not the figure)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(slices):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(times)


def probe(comm):
    """Rank 0's and rank 1's timings of PROBES, µs (each rank's own loop)."""
    from commrt.bench._coll import bind

    bind(comm.rank, comm.size)
    peer = 1 - comm.rank
    small = np.zeros(1)
    src, dst = np.ones(1 << 18, np.float32), np.empty(1 << 18, np.float32)
    one, four = np.ones(1 << 18, np.float32), np.ones(1 << 20, np.float32)

    def one_way(buf, sender=0):
        """buf from the sender to the other rank, answered with 8 bytes."""
        def run():
            if comm.rank == sender:
                comm.send(buf, peer)
                comm.recv(small, peer)
            else:
                comm.recv(buf, peer)
                comm.send(small, peer)
        return run

    return {"round_trip_us": _timed(comm, one_way(small), 400),
            "copy_1MiB_us": _timed(comm, lambda: np.copyto(dst, src), 20),
            "stream_1MiB_us": _timed(comm, one_way(one), 20),
            "stream_back_1MiB_us": _timed(comm, one_way(one, sender=1), 20),
            "read_4MiB_us": _timed(comm, one_way(four), 6)}


def state(t):
    """'slow' or 'fast' for one launch's timings (a dict of PROBES): slow where a
    stream either way costs more than SLOW_STREAM_PER_COPY private copies."""
    worst = max(t["stream_1MiB_us"], t["stream_back_1MiB_us"])
    return "slow" if worst > SLOW_STREAM_PER_COPY * t["copy_1MiB_us"] else "fast"


def launch():
    """One launch of two ranks: rank 0's timings."""
    from commrt.testing import World

    with World(2, transport="shm", timeout=60) as w:
        return w.run(probe, timeout=60)[0]


def now():
    """The host's state now: one launch's timings (PROBES) and "state"."""
    t = launch()
    return dict(t, state=state(t))


# how long a piece of measurement waits for the fast state, and how often it runs
# again where the state changed under it (in_fast_state)
FAST_WAIT_S = 180.0
FAST_TRIES = 3


def in_fast_state(work, log=print, wait=FAST_WAIT_S, tries=FAST_TRIES):
    """(work(), probes): work run once the host is in its fast state (a launch
    every few seconds, for at most ``wait`` s), and run again, up to ``tries``
    times in all, while the launch after it finds the state changed.  probes:
    {"before", "after": now(), "tries": runs}; ``steady(probes)`` says whether
    the last run was fast at both ends.  wait=0: run at once, probed on both
    sides only.  A flip and back inside the work goes unseen."""
    for attempt in range(1, tries + 1):
        until = time.monotonic() + wait
        before = now()
        while before["state"] != "fast" and time.monotonic() < until:
            time.sleep(3)
            before = now()
        got = work()
        after = now()
        probes = {"before": before, "after": after, "tries": attempt}
        if steady(probes) or not wait:
            return got, probes
        log(f"  the host's state changed under it ({before['state']} -> "
            f"{after['state']}): again")
    return got, probes


def steady(probes):
    """Whether in_fast_state's probes both found the fast state."""
    return probes["before"]["state"] == probes["after"]["state"] == "fast"


def line(t):
    return "  ".join(f"{k} {t[k]:8.1f}" for k in PROBES) + f"  -> {state(t)}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m commrt.bench hoststate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3, help="launches to report (default 3)")
    ap.add_argument("--wait", type=float, default=0.0,
                    help="launch until one is fast, at most this many seconds; exit 1 if none was")
    args = ap.parse_args(argv)
    if args.wait > 0:
        until = time.monotonic() + args.wait
        while True:
            t = launch()
            print(line(t), flush=True)
            if state(t) == "fast":
                return 0
            if time.monotonic() > until:
                print(f"still slow after {args.wait:g} s", file=sys.stderr)
                return 1
            time.sleep(5)
    for _ in range(args.launches):
        print(line(launch()), flush=True)
    return 0
