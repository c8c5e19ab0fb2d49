"""Faults: a peer killed mid-transfer, strangers and garbage at the listeners,
messages over 2 GiB, and nothing left behind."""
import logging
import os
import socket
import threading

import numpy as np
import pytest

from commrt.rendezvous.auth import new_secret
from commrt.rendezvous.store import Store, StoreServer
from commrt.testing import World
from commrt.transport.connect import build_engine

import p2p_ranks as R


def survivors(comm, nbytes):
    """Like die_mid_transfer, but returns only on the survivors (rank 2 is killed by the test)."""
    return R.die_mid_transfer(comm, nbytes)


@pytest.mark.parametrize("transport", ["shm", "tcp", "tcp-streams"])
@pytest.mark.parametrize("nbytes", [1000, 8 << 20])
def test_survivors_see_peer_lost_within_deadline(transport, nbytes):
    transport, _, streams = transport.partition("-")
    w = World(3, transport=transport, env={"COMMRT_TCP_STREAMS": "3"} if streams else {}).start()
    try:
        results = _run_without_rank(w, 2, survivors, nbytes)
    finally:
        w.close()
    r0 = results[0]
    # pending and later operations on the dead rank: PeerLostError naming rank 2, not a timeout
    assert r0["pending"][0] == 2, r0
    assert "rank 2" in r0["pending"][1]
    assert r0["later"][0] == 2, r0
    assert results[1] == [9, 9, 9, 9]          # the other pair keeps working


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receive_matching_the_announcement_of_a_dead_rank_fails(transport):
    """Found by the fault campaign: a SIGKILL during a reduce-scatter of 40 KB blocks
    left every survivor waiting (COMMRT_FAULT_SEED=305, tcp)."""
    w = World(2, transport=transport).start()
    try:
        res = _run_without_rank(w, 1, R.rts_then_death, 1 << 20)
    finally:
        w.close()
    kind, rank, took = res[0]
    assert kind == "PeerLostError" and rank == 1, res
    assert took < 5, res                        # at once, not at the 10 s deadline


def _run_without_rank(world, dead, fn, *args):
    """Run fn on every rank; the `dead` rank kills itself, so collect only the others."""
    for conn in world._conns:
        conn.send((fn, args, {}))
    out = {}
    import time
    deadline = time.monotonic() + 30
    for rank in range(world.size):
        if rank == dead:
            continue
        kind, value = world._receive(rank, deadline)
        if kind != "ok":
            world._raise(rank, value)
        out[rank] = value
    return out


def test_strangers_and_garbage_are_refused_and_job_unaffected(caplog):
    """While two ranks build their mesh, connections without the secret and
    random bytes hit rank 0's listeners: refused, logged, and the mesh works."""
    secret = new_secret()
    server = StoreServer(secret).start()
    host, port = server.address
    engines, errors = {}, []
    release = threading.Event()

    def rank(r):
        try:
            store = Store(host, port, secret, timeout=20)
            if r == 1:
                release.wait(20)
            engines[r] = build_engine(r, 2, store, secret, host_id="h", local_size=2, timeout=20)[0]
        except BaseException as exc:        # pragma: no cover - reported below
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="commrt")
    logging.getLogger("commrt").propagate = True
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    import json
    store = Store(host, port, secret, timeout=20)
    addr = json.loads(store.get("commrt/mesh/0/addr/0", timeout=20))
    tcp_host, tcp_port = addr["tcp"]
    with socket.create_connection((tcp_host, tcp_port)) as s:
        s.sendall(os.urandom(4096))
    with socket.create_connection((tcp_host, tcp_port)) as s:
        s.sendall(b"CMRTAUTH" + os.urandom(64))
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(bytes.fromhex(addr["unix"]))
        s.sendall(os.urandom(100))
    import time
    time.sleep(0.5)
    release.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    a, b = engines[0], engines[1]
    got = np.zeros(4, np.int64)
    req = b.irecv(got, 0, 0, 1)
    a.send(np.arange(4, dtype=np.int64), 1, 0, 1)
    req.wait(5)
    assert got.tolist() == [0, 1, 2, 3]
    # once per source (TCP from 127.0.0.1 twice, the Unix socket once), with a count;
    # the listener handles the strangers on its own, possibly after the mesh is up
    until = time.monotonic() + 15
    while True:
        refused = [rec.getMessage() for rec in caplog.records if "refused" in rec.getMessage()]
        if len(refused) >= 3 or time.monotonic() > until:
            break
        time.sleep(0.05)
    assert len(refused) == 3, refused
    assert any("refused 2 connections from 127.0.0.1 in all" in m for m in refused), refused
    a.close()
    b.close()
    store.close()
    server.close()


# Fresh pages fault in slowly on this host at times: NumPy's transparent huge
# pages for large arrays ran at 50-100 MB/s for minutes (a fresh 2 GiB array:
# 20-50 s, against 1-2 s in small pages), and in one whole-suite run small pages
# took 39 s too.  That is the host's time, not the transport's, so the receiver
# asks for small pages and the sender repeats 64 MiB across its 2 GiB
# (p2p_ranks.periodic_buffer): one fresh 2 GiB array per test, not two.
SMALL_PAGES = {"NUMPY_MADVISE_HUGEPAGE": "0"}


def test_message_over_2_gib_shared_memory():
    with World(2, transport="shm", env=SMALL_PAGES) as w:
        nbytes = (2 << 30) + 4096
        res = w.run(R.big_message, nbytes, timeout=110)
        assert res[1] == (nbytes, True)


@pytest.mark.timeout(200)
def test_message_over_2_gib_tcp():
    with World(2, transport="tcp", env=SMALL_PAGES) as w:
        nbytes = (2 << 30) + 4096
        res = w.run(R.big_message, nbytes, timeout=180)
        assert res[1] == (nbytes, True)


def fd_count(comm):
    return len(os.listdir("/proc/self/fd"))


def soak(comm, rounds):
    """Many mixed messages; returns this rank's (fds, rss pages, unexpected msgs) after."""
    peer = 1 - comm.rank
    sizes = [0, 8, 1000, 20000, 200000]
    bufs = {n: np.zeros(n, np.uint8) for n in sizes}
    for i in range(rounds):
        n = sizes[i % len(sizes)]
        reqs = [comm.irecv(bufs[n], peer, i % 3), comm.isend(np.full(n, i % 251, np.uint8), peer, i % 3)]
        for r in reqs:
            r.wait(10)
    info = comm.memory_info()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1])
    return fd_count(comm), rss, info["unexpected_messages"], info["live_requests"]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_soak_leaves_memory_and_fds_flat(transport):
    shm_before = _commrt_shm()
    with World(2, transport=transport) as w:
        first = w.run(soak, 2000)
        second = w.run(soak, 8000)
    for a, b in zip(first, second):
        assert a[0] == b[0]                          # no descriptor leaked
        assert b[1] <= a[1] * 1.05 + 256             # resident memory flat (pages)
        assert b[2] == 0 and b[3] == 0               # nothing stuck in the transport
    assert _commrt_shm() == shm_before == set()


def _commrt_shm():
    return {name for name in os.listdir("/dev/shm") if "commrt" in name}


@pytest.mark.timeout(120)
def test_a_push_never_lands_after_its_receive_failed():
    """process_vm_writev into a buffer the receiver has given up on would write
    into memory it may have reused: the push slot taken back at the loss
    keeps a sender that reads the CTS later from writing."""
    env = {"COMMRT_LIVENESS_TIMEOUT_S": "1.5", "COMMRT_HEARTBEAT_S": "0.25"}
    with World(2, transport="shm", env=env, timeout=60) as w:
        res = w.run(R.push_after_loss, 1 << 20, timeout=60)
    assert res[1] == ("PeerUnresponsiveError", True), res
    assert res[0] is True, res
