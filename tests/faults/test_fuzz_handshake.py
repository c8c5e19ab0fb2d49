"""Random and mutated bytes at a rank's data-plane listeners while its mesh is being
built (before and just after authentication), COMMRT_FUZZ_CASES / 10 cases.

Rank 0 waits in connect.build_engine for rank 1; the fuzzer connects to its
TCP and Unix listeners and sends garbage, a real hello with a forged proof,
or the real handshake (it knows the secret) followed by a random channel
hello.  Every connection must be closed by rank 0 without a channel offer;
then the real rank 1 joins and a message goes through: the rank was unaffected.
"""
import json
import multiprocessing as mp
import os
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import campaign_ranks as R
from commrt import config
from commrt.rendezvous import auth
from commrt.rendezvous.store import Store, StoreServer
from commrt.transport.connect import ACK, ACK_MAGIC, HELLO, HELLO_MAGIC
from harness import SEED

CASES = max(8, config.get("COMMRT_FUZZ_CASES") // 10)
BATCH = 8
PREFIX = struct.pack("!8sH", auth.MAGIC, auth.VERSION)


@st.composite
def approach(draw):
    """(listener, bytes before, authenticate?, bytes after)."""
    where = draw(st.sampled_from(["tcp", "unix"]))
    how = draw(st.sampled_from(["garbage", "forged", "hello"]))
    if how == "garbage":
        return where, draw(st.binary(max_size=200)), False, b""
    if how == "forged":
        return where, PREFIX + draw(st.binary(min_size=32, max_size=32)) + \
            draw(st.binary(max_size=64)), False, b""
    # the channel hello: its magic then random fields (whatever its layout: a random
    # one is the real peer's own with odds of 2^-64 and less)
    magic = draw(st.one_of(st.just(HELLO_MAGIC), st.binary(min_size=4, max_size=4)))
    hello = magic + draw(st.binary(min_size=HELLO.size - 4, max_size=HELLO.size - 4))
    if draw(st.booleans()):
        hello = hello[:draw(st.integers(0, len(hello)))] + draw(st.binary(max_size=40))
    if len(hello) >= 12 and struct.unpack_from("<i", hello, 8)[0] == 1:
        # a whole hello from rank 1, the rank the mesh waits for, in another version
        # ends rank 0's init at once (a rank of this job running another commrt:
        # test_wire_version.py); the fuzzer claims other ranks
        hello = hello[:8] + struct.pack("<i", 2) + hello[12:]
    return where, b"", True, hello


def connect(addr, where):
    if where == "tcp":
        return socket.create_connection(tuple(addr["tcp"]), timeout=10)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(bytes.fromhex(addr["unix"]))
    return s


CHALLENGE_BYTES = len(PREFIX) + 32 + 32


def answer(sock):
    """Everything rank 0 sends until it closes the connection; AssertionError if it
    passes descriptors (a shared-memory channel) or never closes."""
    data = b""
    end = time.monotonic() + 15
    while time.monotonic() < end:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
        except (ConnectionResetError, BrokenPipeError):
            return data
        except socket.timeout:
            continue
        for fd in fds:
            os.close(fd)
        assert not fds, "rank 0 offered a shared-memory channel"
        if not msg:
            return data
        data += msg
    raise AssertionError("rank 0 neither closed nor answered within 15 s (hang)")


@pytest.mark.timeout(900)
def test_listeners_refuse_everything_but_the_real_peer(tmp_path):
    secret = auth.new_secret()
    server = StoreServer(secret).start()
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    log = open(tmp_path / "ranks.log", "ab")
    saved = os.dup(2)
    try:
        os.dup2(log.fileno(), 2)       # rank 0 logs every refused connection
        for rank in (0,):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=R.mesh_rank, args=(rank, server.address, secret, child),
                            daemon=True)
            p.start()
            procs.append(p)
            conns.append(parent)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    try:
        store = Store(*server.address, secret, timeout=30)
        addr = json.loads(store.get("commrt/mesh/0/addr/0", timeout=60).decode())
        # rank 0 starts accepting once every address is known: a placeholder for
        # rank 1 lets it, and the real rank 1 overwrites it when it joins
        store.set("commrt/mesh/0/addr/1", json.dumps(
            {"host": "fuzz-host", "pid": 0, "tcp": ["127.0.0.1", 9], "unix": "00"}).encode())

        @settings(max_examples=max(1, CASES // BATCH), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @seed(SEED)
        @given(batch=st.lists(approach(), min_size=BATCH, max_size=BATCH))
        def some(batch):
            for where, before, authenticate, after in batch:
                assert procs[0].is_alive(), "rank 0 died"
                sock = connect(addr, where)
                try:
                    try:
                        sock.sendall(before)
                        if authenticate:
                            auth.client_handshake(sock, secret, 10)
                        sock.sendall(after)
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    # at most its challenge before authentication, nothing after it
                    # (a TCP channel would begin with b"OK")
                    # (since wire version 2, a hello in another version gets an ack
                    # that refuses it, naming rank 0's version: still no channel)
                    data = answer(sock)
                    limit = 0 if authenticate else CHALLENGE_BYTES
                    refusal = authenticate and len(data) == ACK.size and \
                        ACK.unpack(data)[0] == ACK_MAGIC and ACK.unpack(data)[2] != 0
                    assert len(data) <= limit or refusal, f"rank 0 answered {data!r} to " \
                                                          f"{where} {before!r} {after!r}"
                finally:
                    sock.close()

        some()
        parent, child = ctx.Pipe()
        p1 = ctx.Process(target=R.mesh_rank, args=(1, server.address, secret, child), daemon=True)
        p1.start()
        procs.append(p1)
        conns.append(parent)
        want = sum(range(1000))
        for r, c in enumerate(conns):
            assert c.poll(120), f"rank {r} of the real mesh did not finish"
            assert c.recv() == want
        store.close()
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        server.close()
        log.close()
