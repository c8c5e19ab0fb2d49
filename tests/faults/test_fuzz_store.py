"""Random and mutated requests fed to a real store server (commrt/rendezvous/store.py),
before and after authentication, COMMRT_FUZZ_CASES cases per run.

After authentication every case ends within its deadline with well-formed
replies to the requests the server could read, then a dropped connection at
the first malformed one; before authentication nothing is ever answered,
not even a valid request sent after the garbage.  After every case a
healthy client still sets and gets, and at the end the server holds no more
threads than before.
"""
import math
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from commrt import config
from commrt.rendezvous import auth
from commrt.rendezvous.auth import client_handshake, new_secret
from commrt.rendezvous.store import Store, StoreServer
from harness import SEED

CASES = config.get("COMMRT_FUZZ_CASES")
BATCH = 8
REQUEST = struct.Struct("!BId")
REPLY = struct.Struct("!BI")
ITEM = struct.Struct("!I")
BLOCKING = (2, 3)                 # get, wait: they wait up to the timeout they are sent
CASE_DEADLINE_S = 10.0


def items(parts):
    return b"".join(ITEM.pack(len(p)) + p for p in parts)


keys = st.one_of(st.sampled_from([b"k", b"fuzz/a", b"fuzz/counter", b"present"]),
                 st.binary(max_size=40))
honest_body = st.lists(st.one_of(keys, st.binary(max_size=64), st.sampled_from([b"1", b"-3",
                                                                                 b"x"])),
                       max_size=4).map(items)
floats = st.one_of(st.floats(0, 0.05), st.sampled_from([math.nan, math.inf, -math.inf, -1.0]),
                   st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def request(draw):
    op = draw(st.one_of(st.integers(1, 6), st.integers(0, 255)))
    body = draw(st.one_of(honest_body, st.binary(max_size=200)))
    nbytes = len(body) if draw(st.integers(0, 4)) else draw(st.integers(0, (1 << 32) - 1))
    timeout = draw(floats)
    if op in BLOCKING and 0.05 < timeout <= 1e9:
        timeout = 0.05                # a wait as long as asked is not a hang
    frame = REQUEST.pack(op, nbytes, timeout) + body
    if draw(st.integers(0, 5)) == 0:
        cut = draw(st.integers(0, len(frame)))
        frame = frame[:cut]
    return frame


def _short_waits(blob):
    """blob with every blocking request that the server will read (frames walked
    as it walks them) asking to wait at most 0.05 s: a flipped bit in an op or
    a timeout can make a get or wait of any length up to the server's 1e9 s
    limit, which it honours, and a case that long is not a hang."""
    off = 0
    while off + REQUEST.size <= len(blob):
        op, nbytes, timeout = REQUEST.unpack_from(blob, off)
        if op in BLOCKING and 0.05 < timeout <= 1e9:
            REQUEST.pack_into(blob, off, op, nbytes, 0.05)
        off += REQUEST.size + nbytes
    return blob


@st.composite
def case(draw):
    blob = bytearray(b"".join(draw(st.lists(request(), min_size=1, max_size=4))))
    for pos, xor in draw(st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)),
                                  max_size=2)):
        if blob:
            blob[pos % len(blob)] ^= xor
    return bytes(_short_waits(blob))


@pytest.fixture(scope="module")
def store():
    secret = new_secret()
    base = threading.active_count()
    server = StoreServer(secret).start()
    host, port = server.address
    healthy = Store(host, port, secret, timeout=10)
    healthy.set("present", b"1")
    yield server, secret, healthy
    healthy.close()
    server.close()
    end = time.monotonic() + 10
    while threading.active_count() > base and time.monotonic() < end:
        time.sleep(0.05)
    assert threading.active_count() <= base, "the store server left threads behind"


def read_until_eof(sock, deadline):
    data = b""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no end within {CASE_DEADLINE_S} s after {len(data)} bytes (hang)"
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def check_replies(data):
    """Every reply the server sent is whole and well-formed."""
    off = 0
    while off < len(data):
        assert off + REPLY.size <= len(data), f"a torn reply header: {data[off:]!r}"
        status, nbytes = REPLY.unpack_from(data, off)
        assert status in (0, 1, 2), status
        off += REPLY.size
        body = data[off:off + nbytes]
        assert len(body) == nbytes, "a torn reply body"
        pos = 0
        while pos < nbytes:
            (size,) = ITEM.unpack_from(body, pos)
            pos += ITEM.size + size
        assert pos == nbytes, "a reply body that is not a list of items"
        off += nbytes


def still_serves(healthy, n):
    healthy.set(f"fuzz/ok/{n % 64}", str(n).encode())
    assert healthy.get(f"fuzz/ok/{n % 64}", timeout=5) == str(n).encode()


@pytest.mark.timeout(900)
def test_requests_after_authentication(store):
    server, secret, healthy = store
    done = []

    @settings(max_examples=max(1, CASES // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @seed(SEED)
    @given(batch=st.lists(case(), min_size=BATCH, max_size=BATCH))
    def some(batch):
        for blob in batch:
            sock = socket.create_connection(server.address, timeout=5)
            try:
                client_handshake(sock, secret, 5)
                sock.sendall(blob)
                sock.shutdown(socket.SHUT_WR)
                check_replies(read_until_eof(sock, time.monotonic() + CASE_DEADLINE_S))
            finally:
                sock.close()
            done.append(1)
        still_serves(healthy, len(done))   # once a batch: a batch that broke it fails

    some()
    assert len(done) >= CASES // BATCH * BATCH


@st.composite
def before_auth(draw):
    """Garbage, or a real client hello followed by a forged proof, then a valid request."""
    if draw(st.booleans()):
        head = draw(st.binary(max_size=120))
    else:
        nonce = draw(st.binary(min_size=32, max_size=32))
        head = struct.pack("!8sH", auth.MAGIC, auth.VERSION) + nonce
        head += draw(st.binary(min_size=0, max_size=40))
    return head + REQUEST.pack(4, 0, 0.0) + items([b"fuzz/unauth", b"1"])


@pytest.mark.timeout(600)
def test_nothing_is_parsed_before_authentication(store):
    server, secret, healthy = store

    @settings(max_examples=max(1, CASES // 10 // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @seed(SEED)
    @given(batch=st.lists(before_auth(), min_size=BATCH, max_size=BATCH))
    def some(batch):
        for blob in batch:
            sock = socket.create_connection(server.address, timeout=5)
            try:
                try:
                    sock.sendall(blob)
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass                       # already dropped
                data = read_until_eof(sock, time.monotonic() + CASE_DEADLINE_S)
            finally:
                sock.close()
            # at most the server's challenge (or its version), never a reply
            assert len(data) <= struct.calcsize("!8sH") + 32 + 32, data
    some()
    assert not healthy.check(["fuzz/unauth"]), "a request was served without authentication"
