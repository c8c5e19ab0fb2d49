"""A rank of the multi-host tests, started by commrt-launch (or ssh, srun, mpirun)
across pretend hosts whose ranks fill hosts in blocks of COMMRT_LOCAL_WORLD_SIZE.

    python hosts_rank.py layout HOSTS   host identity, channels, every all-reduce
    python hosts_rank.py traffic DEV    bytes of a large all-reduce leave by DEV
    python hosts_rank.py choice         the model's all-reduce per size, one line
    python hosts_rank.py burst          ranks 0 and 1: exchanges after the link was idle
                                        and back to back (sim validate's calibration)
    python hosts_rank.py hello          an all-reduce; rank, size and host, one line
"""
import os
import sys

import numpy as np

import commrt
import commrt.collectives as C
from commrt.collectives import cost, registry

COUNTS = (0, 1, 7, 1000, 65537)


def say(*parts):
    """One line in one write: ranks share their launcher's pipe, and an unbuffered
    print writes each part apart, so two ranks' lines could interleave."""
    os.write(1, (" ".join(map(str, parts)) + "\n").encode())


def check_layout(comm, hosts):
    r, n = comm.rank, comm.size
    local = n // hosts
    for q in range(n):
        same = q // local == r // local
        assert (comm.host_of(q) == comm.host_of(r)) == same, (r, q, comm.host_of(q))
        want = "self" if q == r else ("shm" if same else "tcp")
        assert comm.transport_of(q) == want, (r, q, comm.transport_of(q), want)
    p = cost.params(comm)
    assert (p.hosts, p.local) == (hosts, local), (p.hosts, p.local)
    assert p.alpha_net > 0 and p.beta_net > 0, p
    if local > 1:  # two classes, measured apart: the network is the slower
        assert p.beta_net > p.beta, p
    return p


def check_all_reduce(comm):
    r, n = comm.rank, comm.size
    for algo in registry.names("all_reduce") + (None,):
        for count in COUNTS:
            for op, dtype in (("SUM", np.float64), ("MAX", np.int32)):
                base = np.arange(count) % 13
                x = (base + 5 * r).astype(dtype)
                ranks = np.arange(n)[:, None]
                want = (base + 5 * ranks).sum(0) if op == "SUM" else base + 5 * (n - 1)
                C.all_reduce(comm, x, op, algo)
                assert np.array_equal(x, want.astype(dtype)), (algo, count, op, r)


def tx_bytes(dev):
    with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
        return int(f.read())


def main():
    mode = sys.argv[1]
    comm = commrt.init()
    r = comm.rank
    if mode == "layout":
        p = check_layout(comm, int(sys.argv[2]))
        check_all_reduce(comm)
        say("ok", r, comm.host_of(r), f"beta_net/beta={p.beta_net / p.beta:.1f}")
    elif mode == "traffic":
        dev = sys.argv[2]
        before = tx_bytes(dev)
        x = np.ones(1 << 20, np.float32)  # 4 MiB
        C.all_reduce(comm, x, "SUM", "ring")
        assert np.all(x == comm.size)
        # our last piece may still sit in our socket buffer when our all-reduce ends;
        # the peer's barrier comes after it received every byte, so all have left
        comm.barrier()
        say("ok", r, tx_bytes(dev) - before)
    elif mode == "choice":
        picks = [cost.choose_allreduce(comm, k) for k in (8, 64 << 10, 16 << 20)]
        p = cost.params(comm)
        say("ok", r, *picks, f"beta_net/beta={p.beta_net / p.beta:.0f}")
    elif mode == "burst":
        from commrt.sim import validate

        idle = validate._idle_pair_times(comm, (0, 1), validate.BURST_SIZES)
        busy = validate._pair_times(comm, (0, 1), (validate.BURST_SIZES[-1],))
        say("ok", r, idle[-1][1], busy[0][1], validate.burst_beta(idle))
    else:
        x = np.full(3, r + 1, np.int64)
        C.all_reduce(comm, x)
        assert np.all(x == comm.size * (comm.size + 1) // 2), x
        say("ok", r, comm.size, comm.host_of(r), os.environ.get("COMMRT_HOST_ID", "-"))
    comm.close()


if __name__ == "__main__":
    main()
