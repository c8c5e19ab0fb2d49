"""Rank-side functions of the soak and the leak checks (module level: spawned ranks import them)."""
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
