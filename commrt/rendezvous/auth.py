"""Mutual HMAC challenge-response over a connected socket, and the job secret.

Every commrt connection (the rendezvous store and the transport's data
plane) runs this handshake before a single byte of payload is read, so a
process that does not know the job's secret learns nothing and can make
commrt parse nothing but these fixed-size messages.

The exchange (``K`` is the secret, ``Nc``/``Ns`` fresh 32-byte nonces)::

    client -> server   HELLO     = MAGIC | VERSION | Nc
    server -> client   CHALLENGE = MAGIC | VERSION | Ns | HMAC(K, "server" | Nc | Ns)
    client -> server   PROOF     = HMAC(K, "client" | Ns | Nc)

Both sides prove they know ``K``; the role labels keep one side's proof
from being reflected as the other's, and fresh nonces keep a recorded
exchange from being replayed.  ``K`` itself never crosses the wire.  MAGIC
and VERSION lead every opening message so that random bytes are rejected
after the first 10 bytes.  Every read has a fixed size and shares one
deadline, so a silent or slow peer costs at most ``timeout`` seconds.
"""
import hashlib
import hmac
import os
import socket
import stat
import struct
import threading
import time

from commrt import config
from commrt.errors import AuthError, BootstrapError

MAGIC = b"CMRTAUTH"
VERSION = 1
NONCE_BYTES = 32
MIN_SECRET_BYTES = 16

_PREFIX = struct.Struct("!8sH")  # magic, version
_DIGEST_BYTES = hashlib.sha256().digest_size
_HELLO_BYTES = _PREFIX.size + NONCE_BYTES
_CHALLENGE_BYTES = _PREFIX.size + NONCE_BYTES + _DIGEST_BYTES


# -- handshake ---------------------------------------------------------------

def server_handshake(sock: socket.socket, secret: bytes, timeout: float) -> None:
    """Authenticate the client on ``sock`` and prove our own knowledge of ``secret``.

    Returns when the client has proved it knows the secret; raises AuthError
    (naming the peer) on a wrong secret, foreign bytes, a short read or a
    timeout.  The socket's own timeout is restored afterwards.
    """
    _check_secret(secret)
    with _Deadline(sock, timeout) as deadline:
        peer = _peer_name(sock)
        _read_prefix(sock, deadline, peer, reply_version=True)
        client_nonce = _recv_exact(sock, NONCE_BYTES, deadline, peer, "hello")
        server_nonce = os.urandom(NONCE_BYTES)
        proof = _mac(secret, b"server", client_nonce, server_nonce)
        _send(sock, _PREFIX.pack(MAGIC, VERSION) + server_nonce + proof, deadline, peer)
        answer = _recv_exact(sock, _DIGEST_BYTES, deadline, peer, "proof")
        if not hmac.compare_digest(answer, _mac(secret, b"client", server_nonce, client_nonce)):
            raise AuthError(f"connection from {peer} did not prove it knows the job secret "
                            f"(wrong secret)")


def client_handshake(sock: socket.socket, secret: bytes, timeout: float) -> None:
    """Prove to the server on ``sock`` that we know ``secret``, and check it knows it too.

    Raises AuthError (naming the peer) when the server's proof is wrong, when
    it speaks another protocol or version, on a short read or a timeout.
    """
    _check_secret(secret)
    with _Deadline(sock, timeout) as deadline:
        peer = _peer_name(sock)
        client_nonce = os.urandom(NONCE_BYTES)
        _send(sock, _PREFIX.pack(MAGIC, VERSION) + client_nonce, deadline, peer)
        _read_prefix(sock, deadline, peer, reply_version=False)
        server_nonce = _recv_exact(sock, NONCE_BYTES, deadline, peer, "challenge")
        proof = _recv_exact(sock, _DIGEST_BYTES, deadline, peer, "challenge")
        if not hmac.compare_digest(proof, _mac(secret, b"server", client_nonce, server_nonce)):
            raise AuthError(f"server {peer} did not prove it knows the job secret "
                            f"(wrong secret, or another job's server on that port)")
        _send(sock, _mac(secret, b"client", server_nonce, client_nonce), deadline, peer)


def _mac(secret, role, first, second):
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


def _read_prefix(sock, deadline, peer, reply_version):
    raw = _recv_exact(sock, _PREFIX.size, deadline, peer, "greeting")
    magic, version = _PREFIX.unpack(raw)
    if magic != MAGIC:
        raise AuthError(f"{peer} is not speaking commrt's authentication protocol "
                        f"(first bytes {raw[:8]!r})")
    if version != VERSION:
        if reply_version:  # tell the client which version we speak, so it can say so
            try:
                _send(sock, _PREFIX.pack(MAGIC, VERSION), deadline, peer)
            except AuthError:
                pass
        raise AuthError(f"{peer} speaks authentication protocol version {version}, "
                        f"this commrt speaks version {VERSION}")


def _check_secret(secret):
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")


def _peer_name(sock):
    try:
        addr = sock.getpeername()
    except OSError:
        return "an unknown peer"
    if isinstance(addr, tuple):
        return f"{addr[0]}:{addr[1]}"
    return repr(addr) if addr else "a local socket"


class _Deadline:
    """One deadline shared by every read and write of a handshake; restores the
    socket's own timeout on exit."""

    def __init__(self, sock, timeout):
        if timeout is None or timeout <= 0:
            raise ValueError(f"handshake timeout must be a positive number, got {timeout!r}")
        self.sock, self.timeout = sock, timeout
        self.end = time.monotonic() + timeout

    def __enter__(self):
        self.saved = self.sock.gettimeout()
        return self

    def __exit__(self, *exc):
        try:
            self.sock.settimeout(self.saved)
        except OSError:
            pass

    def arm(self, peer, what):
        left = self.end - time.monotonic()
        if left <= 0:
            raise AuthError(f"authentication with {peer} timed out after {self.timeout:g} s "
                            f"(waiting for {what})")
        self.sock.settimeout(left)


def _recv_exact(sock, nbytes, deadline, peer, what):
    chunks, got = [], 0
    while got < nbytes:
        deadline.arm(peer, what)
        try:
            chunk = sock.recv(nbytes - got)
        except socket.timeout:
            raise AuthError(f"authentication with {peer} timed out after "
                            f"{deadline.timeout:g} s (waiting for {what})") from None
        except OSError as exc:
            raise AuthError(f"authentication with {peer} failed: {exc}") from None
        if not chunk:
            raise AuthError(f"{peer} closed the connection during authentication "
                            f"({got} of {nbytes} bytes of {what} received)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _send(sock, data, deadline, peer):
    deadline.arm(peer, "the peer to accept our message")
    try:
        sock.sendall(data)
    except socket.timeout:
        raise AuthError(f"authentication with {peer} timed out after {deadline.timeout:g} s "
                        f"(sending)") from None
    except OSError as exc:
        raise AuthError(f"authentication with {peer} failed while sending: {exc}") from None


# -- the job secret ------------------------------------------------------------

def new_secret(nbytes: int = 32) -> bytes:
    """A fresh random job secret."""
    return os.urandom(nbytes)


def parse_secret(text: str, source: str = "secret") -> bytes:
    """The secret written as hex in ``text`` (as in COMMRT_SECRET or a secret file)."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise BootstrapError(f"{source} is not a hex string") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise BootstrapError(f"{source} holds {len(secret)} bytes; at least "
                             f"{MIN_SECRET_BYTES} are needed (e.g. `openssl rand -hex 32`)")
    return secret


def write_secret_file(path: str, secret: bytes) -> None:
    """Write ``secret`` as hex to a new file readable only by its owner (mode 0600).

    Fails if ``path`` exists, so an attacker cannot pre-create it with wider
    permissions; the file is complete when it appears under its final name.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret.hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic, and fails if path already exists
    finally:
        os.unlink(tmp)


def read_secret_file(path: str) -> bytes:
    """The secret in ``path``, refusing a file that others could read or write."""
    try:
        text = read_private_file(path)
    except FileNotFoundError:
        raise BootstrapError(f"cannot open the secret file {path}: no such file") from None
    return parse_secret(text, f"secret file {path}")


def read_private_file(path: str, limit: int = 4096) -> str:
    """The text of ``path`` if only its owner, this user, may read it.

    FileNotFoundError passes through (callers may poll); anything else that
    is wrong is a BootstrapError saying how to fix it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BootstrapError(f"cannot open {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise BootstrapError(f"{path} belongs to uid {info.st_uid}, not to this user "
                                 f"(uid {os.getuid()})")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise BootstrapError(f"{path} has mode {stat.S_IMODE(info.st_mode):o}; it must be "
                                 f"readable by its owner only (chmod 600)")
        return os.read(fd, limit).decode("ascii", "replace")
    finally:
        os.close(fd)


def secret_descriptor(secret: bytes) -> int:
    """A memfd holding the secret (hex), sealed against writes, for ranks to inherit
    (COMMRT_SECRET_FD).  It lives in memory only: nothing is left on disk under any
    exit, SIGKILL included, and it can be handed again to a restarted rank.  The
    descriptor is close-on-exec: pass it with subprocess's pass_fds."""
    fd = os.memfd_create("commrt-secret", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, secret.hex().encode() + b"\n")
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


_FROM_FD = {}       # descriptor number -> secret read from it (init() may run twice)


def read_secret_descriptor(fd: int) -> bytes:
    """The secret in inherited descriptor fd (COMMRT_SECRET_FD); closes it, so
    that neither a forked worker nor an exec'd child inherits it."""
    if fd in _FROM_FD:
        return _FROM_FD[fd]
    try:
        text = os.pread(fd, 4096, 0).decode("ascii", "replace")
    except OSError as exc:
        raise ValueError(f"COMMRT_SECRET_FD={fd}: cannot read the job secret from it ({exc}); "
                         f"it must be an open descriptor inherited from the launcher") from None
    secret = parse_secret(text, f"COMMRT_SECRET_FD={fd}")
    _FROM_FD[fd] = secret
    try:
        os.close(fd)
    except OSError:
        pass
    return secret


def load_secret():
    """The job secret from COMMRT_SECRET_FD, COMMRT_SECRET_FILE or COMMRT_SECRET (in
    that order), or None if none is set."""
    fd = config.get("COMMRT_SECRET_FD")
    if fd is not None:
        return read_secret_descriptor(fd)
    path = config.get("COMMRT_SECRET_FILE")
    if path:
        return read_secret_file(path)
    text = config.get("COMMRT_SECRET")
    if text:
        return parse_secret(text, "COMMRT_SECRET")
    return None


class RefusalLog:
    """Refused connections, logged once per source with a count.

    The first refusal from a source (its host address) is logged at WARNING
    with its reason; later ones are only counted (at DEBUG), and summary()
    logs one WARNING per source refused more than once, with the total.  So
    a stranger hammering a port makes at most two lines, not one per
    connection (an attack of 529 connections used to write 529)."""

    def __init__(self, logger, what):
        self._log, self._what = logger, what
        self._counts = {}
        self._lock = threading.Lock()

    def refused(self, source, reason):
        with self._lock:
            n = self._counts.get(source, 0) + 1
            self._counts[source] = n
        if n == 1:
            self._log.warning("%s: refused a connection from %s: %s (later refusals from it "
                              "are counted)", self._what, source, reason)
        else:
            self._log.debug("%s: refused connection %d from %s: %s", self._what, n, source, reason)

    def counts(self):
        with self._lock:
            return dict(self._counts)

    def summary(self):
        """Log the total of every source refused more than once; forget the counts."""
        with self._lock:
            counts, self._counts = self._counts, {}
        for source, n in counts.items():
            if n > 1:
                self._log.warning("%s: refused %d connections from %s in all", self._what, n,
                                  source)


def source_of(sock):
    """The host a connection comes from (its address without the port)."""
    try:
        name = sock.getpeername()
    except OSError:
        return "a closed connection"
    if isinstance(name, tuple):
        return str(name[0])
    return "a local process" if not name or name[:1] == b"\0" else str(name)
