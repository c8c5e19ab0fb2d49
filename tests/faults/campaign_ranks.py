"""Rank-side functions of the soak, the leak checks and the flood (module level: spawned ranks import them)."""
import os
import time

import oracle


def soak(comm, seed, count):
    """Run `count` random collectives of stream `seed`, each checked against NumPy."""
    start = time.monotonic()
    total = 0
    for i in range(count):
        total += oracle.run(comm, oracle.spec(seed, i, comm.size))
    return {"ops": count, "digest": total, "seconds": time.monotonic() - start}


def usage():
    """Descriptors, threads and resident memory (KiB) of this process."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "rss_kib": rss_pages * os.sysconf("SC_PAGE_SIZE") // 1024}


def init_close_cycles(comm, cycles, seed):
    """Open and close a whole new world `cycles` times (a few checked collectives
    in each, small and past the eager limit); usage() after every close.
    The world this rank already belongs to (comm) must still work afterwards."""
    import commrt

    rows = []
    for c in range(cycles):
        world = commrt.init()
        for i in range(3):
            s = oracle.spec(seed + c, i, world.size)
            s.update(coll=("all_reduce", "all_gather", "broadcast")[i], count=(7, 5000, 70001)[i])
            oracle.run(world, s)
        world.close()
        rows.append(usage())
    s = oracle.spec(seed, 99, comm.size)
    s.update(coll="all_reduce", count=1001)
    oracle.run(comm, s)
    return rows


def mesh_rank(rank, store_addr, secret, conn):
    """Rank `rank` of a two-rank mesh built with connect.build_engine (not init(), so
    the handshake fuzzer can reach rank 0's listeners while it waits for rank 1);
    sends or receives one message and reports it to the parent."""
    import numpy as np

    from commrt.rendezvous.store import Store
    from commrt.transport.connect import build_engine

    host, port = store_addr
    store = Store(host, port, secret, timeout=60)
    engine, _ = build_engine(rank, 2, store, secret, host_id="fuzz-host", local_size=2,
                             timeout=600)
    buf = np.arange(1000, dtype=np.int64) if rank == 1 else np.zeros(1000, dtype=np.int64)
    if rank == 1:
        engine.send(buf, 0, 0, 3, 0, 60)
    else:
        engine.recv(buf, 1, 0, 3, 60)
    conn.send(int(buf.sum()))
    engine.close()
    store.close()


# -- a flood of unmatched messages (flow control) ---------------------------------
FLOOD_TAG = 31
PARK_TAG = 32


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def flood(comm, count, nbytes, park_s):
    """Rank 0 sends `count` messages of `nbytes` (each stamped with its index) to
    rank 1 with blocking sends.  Rank 1 first leaves them unmatched for park_s
    seconds (its progress thread moves them in meanwhile), sampling its RSS, then
    receives them all in order.  Returns what rank 1 saw."""
    import time

    import numpy as np

    if comm.rank == 0:
        msg = np.zeros(nbytes, np.uint8)
        stamp = msg[:8].view(np.int64)
        comm.barrier()
        for i in range(count):
            stamp[0] = i
            comm.send(msg, 1, FLOOD_TAG, timeout=120)
        comm.barrier()
        return None
    buf = np.empty(nbytes, np.uint8)
    comm.send(buf[:8], 1, 0, timeout=10)            # warm the paths up before the baseline
    comm.recv(buf[:8], 1, 0, timeout=10)
    park = comm.irecv(bytearray(1), 1, PARK_TAG)    # keeps the progress thread moving
    base = rss_bytes()
    comm.barrier()
    peak, held_peak = base, 0
    end = time.monotonic() + park_s
    while time.monotonic() < end:
        time.sleep(0.05)
        peak = max(peak, rss_bytes())
        held_peak = max(held_peak, comm.memory_info()["unexpected_bytes"])
    parked_unexpected = comm.memory_info()["unexpected_bytes"]
    in_order = True
    stamp = buf[:8].view(np.int64)
    drain_peak = 0
    for i in range(count):
        st = comm.recv(buf, 0, FLOOD_TAG, timeout=120)
        if stamp[0] != i or st.nbytes != nbytes:
            in_order = False
            break
        if i % 1024 == 0:
            drain_peak = max(drain_peak, rss_bytes())
    comm.send(bytearray(1), 1, PARK_TAG, timeout=10)
    park.wait(10)
    comm.barrier()
    after = rss_bytes()
    return {"base": base, "peak": peak, "drain_peak": drain_peak, "after": after,
            "held_peak": held_peak, "parked_unexpected": parked_unexpected,
            "in_order": in_order, "left": comm.memory_info()["unexpected_messages"]}
