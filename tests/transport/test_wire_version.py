"""The wire version is checked when a channel is set up: a rank that speaks
another version is refused on both sides, with an error naming both versions."""
import multiprocessing as mp
import os
import socket
import struct
import time

import pytest

from commrt.errors import ProtocolError
from commrt.rendezvous.auth import new_secret
from commrt.rendezvous.store import StoreServer
from commrt.transport import _core, connect


def _rank_main(rank, env, version, out):
    os.environ.update(env)
    import commrt
    from commrt.transport import _core as core

    core.WIRE_VERSION = version             # what this rank says in its hello and ack
    t0 = time.monotonic()
    try:
        commrt.init().close()
        out.put((rank, None, "", time.monotonic() - t0))
    except BaseException as exc:           # noqa: BLE001 - reported to the test
        out.put((rank, type(exc).__name__, str(exc), time.monotonic() - t0))


def _world_with_versions(versions, transport):
    secret = new_secret()
    server = StoreServer(secret).start()
    host, port = server.address
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    try:
        for rank, version in enumerate(versions):
            env = {"COMMRT_RANK": str(rank), "COMMRT_WORLD_SIZE": str(len(versions)),
                   "COMMRT_LOCAL_RANK": str(rank), "COMMRT_LOCAL_WORLD_SIZE": str(len(versions)),
                   "COMMRT_STORE_ADDR": f"{host}:{port}", "COMMRT_SECRET": secret.hex(),
                   "COMMRT_TRANSPORT": transport, "COMMRT_TIMEOUT": str(DEADLINE_S)}
            p = ctx.Process(target=_rank_main, args=(rank, env, version, out), daemon=True)
            p.start()
            procs.append(p)
        results = dict((r, (k, m, s)) for r, k, m, s in
                       (out.get(timeout=DEADLINE_S + 60) for _ in versions))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        server.close()
    return results


DEADLINE_S = 60       # the bootstrap's: a refusal must come long before it


@pytest.mark.timeout(DEADLINE_S + 90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_other_wire_version_is_refused_on_both_sides(transport):
    """Both sides fail at once: the accepting side used to wait for the deadline in
    case the real rank came after all (it had proven the job's secret)."""
    mine = _core.WIRE_VERSION
    res = _world_with_versions([mine, mine + 1], transport)
    for rank in (0, 1):
        kind, msg, took = res[rank]
        assert kind == "ProtocolError", res
        assert f"wire version {mine}" in msg and f"wire version {mine + 1}" in msg, msg
        assert took < DEADLINE_S / 3, f"rank {rank} failed only after {took:.1f} s: {res}"
    assert "rank 1 speaks commrt wire version" in res[0][1]
    assert "rank 0 speaks commrt wire version" in res[1][1]


def test_version_1_hello_is_named():
    a, b = socket.socketpair()
    try:
        a.sendall(struct.pack("<4siii", b"CMHI", 5, 1234, 0))   # wire version 1's hello
        with pytest.raises(ProtocolError, match=r"rank 5 speaks commrt wire version 1, this rank "
                                                rf"speaks wire version {_core.WIRE_VERSION}"):
            connect._read_hello(b, 0)
    finally:
        a.close()
        b.close()


def test_acceptor_tells_a_newer_peer_its_version():
    a, b = socket.socketpair()
    try:
        a.sendall(connect.HELLO.pack(connect.HELLO_MAGIC, _core.WIRE_VERSION + 7, 0, 3, 99, 1 << 20))
        with pytest.raises(ProtocolError, match=f"wire version {_core.WIRE_VERSION + 7}"):
            connect._read_hello(b, 0)
        with pytest.raises(ProtocolError, match=rf"rank 0 speaks commrt wire version "
                                                rf"{_core.WIRE_VERSION}"):
            _core_version = _core.WIRE_VERSION
            try:
                _core.WIRE_VERSION = _core_version + 7      # read as the newer rank would
                connect._read_ack(a, 3, 0)
            finally:
                _core.WIRE_VERSION = _core_version
    finally:
        a.close()
        b.close()


def test_header_is_64_bytes():
    assert _core.HEADER_BYTES == 64


@pytest.fixture(scope="module", params=["shm", "tcp"])
def pair(request):
    from commrt.testing import World

    with World(2, transport=request.param) as w:
        yield w


@pytest.mark.parametrize("nbytes", [0, 8, 100_000])
def test_both_meta_words_reach_the_receiver(pair, nbytes):
    import wire_ranks as W

    r0, r1 = pair.run(W.meta_words, nbytes)
    hi = W.HI
    assert r1["send"] == (hi, hi - 1) and r1["isend"] == (1, 1 << 63)
    assert r0["sendrecv"] == (5, 8) and r1["sendrecv"] == (5, 7)
    # matching words: combined; meta2 differs (rank 1 expects 3, rank 0 sent 4): untouched
    assert r0["reduce3"][:2] == (3, True) and r1["reduce3"][:2] == (3, True)
    assert r1["reduce4"] == (4, nbytes == 0, True)
    assert r0["reduce4"][:2] == (3, True)
