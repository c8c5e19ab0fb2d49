"""The HMAC challenge-response of commrt.rendezvous.auth, and the secret helpers."""
import os
import socket
import stat
import struct
import threading
import time

import pytest

from commrt.errors import AuthError, BootstrapError
from commrt.rendezvous import auth

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))


def run_pair(server_secret, client_secret, timeout=2.0):
    """Handshake over a socketpair; returns (server outcome, client outcome)."""
    a, b = socket.socketpair()
    outcome = {}

    def side(name, fn, sock, secret):
        try:
            fn(sock, secret, timeout)
            outcome[name] = None
        except Exception as exc:  # recorded for the test to inspect
            outcome[name] = exc
        finally:
            sock.close()

    threads = [threading.Thread(target=side, args=("server", auth.server_handshake, a, server_secret)),
               threading.Thread(target=side, args=("client", auth.client_handshake, b, client_secret))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return outcome["server"], outcome["client"]


def serve_raw(fn, timeout=2.0):
    """Run server_handshake on one end of a socketpair in a thread; ``fn`` drives the other."""
    a, b = socket.socketpair()
    box = {}

    def server():
        try:
            auth.server_handshake(a, SECRET, timeout)
            box["error"] = None
        except Exception as exc:
            box["error"] = exc
        finally:
            box["elapsed"] = time.monotonic() - start

    start = time.monotonic()
    thread = threading.Thread(target=server)
    thread.start()
    try:
        fn(b)
    finally:
        thread.join(10)
        b.close()
        a.close()
    return box["error"], box["elapsed"]


def test_matching_secrets_authenticate_both_sides():
    assert run_pair(SECRET, SECRET) == (None, None)


def test_wrong_secret_fails_on_both_sides():
    server_err, client_err = run_pair(SECRET, OTHER)
    assert isinstance(client_err, AuthError)
    assert "did not prove it knows the job secret" in str(client_err)
    assert isinstance(server_err, AuthError)


def test_random_bytes_are_rejected_at_once():
    error, elapsed = serve_raw(lambda s: s.sendall(os.urandom(64)))
    assert isinstance(error, AuthError)
    assert "not speaking commrt's authentication protocol" in str(error)
    assert elapsed < 1.0


def test_http_request_is_rejected():
    error, _ = serve_raw(lambda s: s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert isinstance(error, AuthError)


def test_short_read_is_an_auth_error():
    error, elapsed = serve_raw(lambda s: (s.sendall(auth.MAGIC[:5]), s.shutdown(socket.SHUT_WR)))
    assert isinstance(error, AuthError)
    assert "closed the connection during authentication" in str(error)
    assert elapsed < 1.0


def test_silent_client_times_out():
    error, elapsed = serve_raw(lambda s: time.sleep(0.5), timeout=0.2)
    assert isinstance(error, AuthError)
    assert "timed out" in str(error)
    assert 0.15 < elapsed < 1.0


def test_other_version_is_named_and_answered():
    def old_client(sock):
        sock.sendall(struct.pack("!8sH", auth.MAGIC, auth.VERSION + 1) + os.urandom(32))
        sock.settimeout(2)
        reply = sock.recv(10)
        assert struct.unpack("!8sH", reply) == (auth.MAGIC, auth.VERSION)

    error, _ = serve_raw(old_client)
    assert f"version {auth.VERSION + 1}" in str(error)


def test_client_rejects_a_server_that_sends_garbage():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(os.urandom(200))
        with pytest.raises(AuthError, match="not speaking"):
            auth.client_handshake(b, SECRET, 1.0)


def test_client_rejects_a_silent_server_in_time():
    a, b = socket.socketpair()
    with a, b:
        start = time.monotonic()
        with pytest.raises(AuthError, match="timed out"):
            auth.client_handshake(b, SECRET, 0.2)
        assert time.monotonic() - start < 1.0


def test_recorded_proof_does_not_replay():
    """A client that replays proofs recorded from an earlier exchange is refused:
    the server's nonce is fresh each time."""
    a, b = socket.socketpair()
    recorded = []

    def recording_client():
        nonce = os.urandom(32)
        b.sendall(struct.pack("!8sH", auth.MAGIC, auth.VERSION) + nonce)
        challenge = b.recv(74, socket.MSG_WAITALL)
        server_nonce = challenge[10:42]
        proof = auth._mac(SECRET, b"client", server_nonce, nonce)
        recorded.append((nonce, proof))
        b.sendall(proof)

    t = threading.Thread(target=recording_client)
    t.start()
    auth.server_handshake(a, SECRET, 2.0)
    t.join()
    a.close(), b.close()

    nonce, proof = recorded[0]

    def replaying_client(sock):
        sock.sendall(struct.pack("!8sH", auth.MAGIC, auth.VERSION) + nonce)
        sock.recv(74, socket.MSG_WAITALL)
        sock.sendall(proof)

    error, _ = serve_raw(replaying_client)
    assert isinstance(error, AuthError) and "wrong secret" in str(error)


def test_socket_timeout_is_restored():
    a, b = socket.socketpair()
    a.settimeout(7.0)
    b.settimeout(None)
    t = threading.Thread(target=auth.server_handshake, args=(a, SECRET, 2.0))
    t.start()
    auth.client_handshake(b, SECRET, 2.0)
    t.join()
    assert a.gettimeout() == 7.0 and b.gettimeout() is None
    a.close(), b.close()


def test_bad_secret_arguments():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ValueError, match="at least 16 bytes"):
            auth.client_handshake(a, b"short", 1.0)
        with pytest.raises(TypeError):
            auth.client_handshake(a, "a string", 1.0)
        with pytest.raises(ValueError, match="timeout"):
            auth.client_handshake(a, SECRET, 0)


# -- secret files and the environment --------------------------------------------

def test_secret_file_round_trip_and_mode(tmp_path):
    path = str(tmp_path / "secret")
    auth.write_secret_file(path, SECRET)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert auth.read_secret_file(path) == SECRET
    assert os.listdir(tmp_path) == ["secret"]  # no temporary left behind


def test_secret_file_is_never_overwritten(tmp_path):
    path = tmp_path / "secret"
    path.write_text("x")
    with pytest.raises(FileExistsError):
        auth.write_secret_file(str(path), SECRET)
    assert path.read_text() == "x"


def test_readable_secret_file_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET.hex())
    path.chmod(0o644)
    with pytest.raises(BootstrapError, match="chmod 600"):
        auth.read_secret_file(str(path))


def test_missing_and_malformed_secrets(tmp_path):
    with pytest.raises(BootstrapError, match="no such file"):
        auth.read_secret_file(str(tmp_path / "nope"))
    with pytest.raises(BootstrapError, match="not a hex string"):
        auth.parse_secret("zz", "COMMRT_SECRET")
    with pytest.raises(BootstrapError, match="at least 16"):
        auth.parse_secret("abcd", "COMMRT_SECRET")


def test_load_secret_prefers_the_file(tmp_path, monkeypatch):
    path = str(tmp_path / "secret")
    auth.write_secret_file(path, SECRET)
    monkeypatch.setenv("COMMRT_SECRET_FILE", path)
    monkeypatch.setenv("COMMRT_SECRET", OTHER.hex())
    assert auth.load_secret() == SECRET
    monkeypatch.delenv("COMMRT_SECRET_FILE")
    assert auth.load_secret() == OTHER
    monkeypatch.delenv("COMMRT_SECRET")
    assert auth.load_secret() is None


def test_new_secrets_are_fresh():
    assert len(auth.new_secret()) == 32 and auth.new_secret() != auth.new_secret()
