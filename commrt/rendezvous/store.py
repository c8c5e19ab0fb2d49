"""A small authenticated TCP key-value store, through which ranks find each other.

``StoreServer`` runs in a background thread of one process (commrt-launch,
or rank 0 under other launchers); every rank holds a ``Store`` client.
Keys are strings, values bytes; ``get`` and ``wait`` block until keys are
set, ``add`` is an atomic counter (its value is stored as ASCII decimal, so
``get`` of a counter returns e.g. ``b"3"``).

Every connection first passes the HMAC handshake of ``auth.py``; a peer
that fails it is logged and dropped before any request is parsed.  Then
each request is one frame and gets one reply frame::

    request  = op:u8 | body_bytes:u32 | timeout_s:f64 | body
    reply    = status:u8 | body_bytes:u32 | body
    body     = item*,  item = nbytes:u32 | bytes

Blocking requests wait on the server (no polling), up to the timeout the
client sends.  The server serves each connection in its own thread: the
store is control plane (a handful of requests per rank), and a thread per
connection keeps a slow or hostile peer from stalling anyone else.

A ``Store`` is safe to share between threads: each request borrows an idle
authenticated connection from a small pool, or opens one, so a thread
blocked in ``get`` never holds up another thread's ``set``.
"""
import logging
import os
import selectors
import socket
import struct
import threading
import time
import weakref

from commrt.errors import AuthError, CommTimeoutError, StoreError
from commrt.rendezvous.auth import RefusalLog, client_handshake, server_handshake, source_of

log = logging.getLogger("commrt")

OP_SET, OP_GET, OP_WAIT, OP_ADD, OP_CHECK, OP_DELETE = 1, 2, 3, 4, 5, 6
ST_OK, ST_TIMEOUT, ST_ERROR = 0, 1, 2
_OP_NAMES = {OP_SET: "set", OP_GET: "get", OP_WAIT: "wait", OP_ADD: "add",
             OP_CHECK: "check", OP_DELETE: "delete"}

_REQUEST = struct.Struct("!BId")
_REPLY = struct.Struct("!BI")
_ITEM = struct.Struct("!I")

MAX_BODY_BYTES = 64 << 20     # one request or reply
MAX_KEY_BYTES = 4096
AUTH_TIMEOUT = 10.0           # a connection must authenticate within this
FRAME_TIMEOUT = 30.0          # a started frame must arrive (or be taken) within this
CLOSE_GRACE_S = 1.0          # close() lets requests already read be answered, this long at most
REPLY_GRACE = 10.0            # beyond a blocking request's own timeout
MAX_CONNECTIONS = 65536


# -- framing (shared by server and client) ------------------------------------

def _pack_items(items):
    parts = []
    for item in items:
        parts.append(_ITEM.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _unpack_items(body):
    items, offset = [], 0
    while offset < len(body):
        if offset + _ITEM.size > len(body):
            raise ValueError("truncated item header")
        (size,) = _ITEM.unpack_from(body, offset)
        offset += _ITEM.size
        if offset + size > len(body):
            raise ValueError(f"item of {size} bytes overruns its frame")
        items.append(bytes(body[offset:offset + size]))
        offset += size
    return items


# A frame's length comes from the peer: the buffer grows with what arrives, in
# steps of at most this, so a length that lies costs what was sent, not what it
# claims (a claimed 64 MiB was allocated at once, and a log record of the
# dropped client pinned it through its traceback: 24 GB in 10^5 fuzz cases
# under pytest, whose log capture keeps every record)
RECV_STEP_BYTES = 1 << 20


def _recv_exact(sock, nbytes):
    """``nbytes`` from ``sock`` under its current timeout; None on a clean EOF
    before the first byte; EOFError on an EOF inside the frame."""
    buf = bytearray(min(nbytes, RECV_STEP_BYTES))
    view, got = memoryview(buf), 0
    while got < nbytes:
        if got == len(buf):
            view.release()
            buf.extend(bytes(min(nbytes - got, len(buf))))     # at most doubles
            view = memoryview(buf)
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise EOFError(f"connection closed after {got} of {nbytes} bytes")
        got += n
    view.release()
    return buf


# -- server -----------------------------------------------------------------------

class StoreServer:
    """The store's server: ``StoreServer(secret).start()`` serves in background threads."""

    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0):
        self._secret = bytes(secret)
        self._host, self._port = host, port
        self._data = {}
        self._cond = threading.Condition()
        self._conns = set()
        self._threads = set()
        self._closed = False
        self._inflight = 0           # requests read but not yet answered
        self._listener = None
        self._accept_thread = None
        self._wake_r, self._wake_w = None, None
        self.refusals = RefusalLog(log, "store")
        _FORKSAFE.add(self)

    # lifecycle
    def bind(self):
        """Bind and listen without serving yet; returns self.

        Lets a launcher learn the address, then fork its ranks while it still
        has a single thread, then ``start()``: connections wait in the backlog.
        """
        if self._listener is None:
            self._listener = _listen(self._host, self._port)
        return self

    def start(self):
        """Bind (unless bound), listen and serve in a background thread; returns self."""
        if self._accept_thread is not None:
            raise StoreError("store server already started")
        self.bind()
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="commrt-store-accept")
        self._accept_thread.start()
        return self

    @property
    def address(self):
        """(host, port) the server listens on."""
        if self._listener is None:
            raise StoreError("store server not started")
        host, port = self._listener.getsockname()[:2]
        return host, port

    def keys(self, prefix=""):
        """The keys set so far that start with ``prefix`` (read in-process, for the
        launcher's reports)."""
        with self._cond:
            return [k for k in self._data if k.startswith(prefix)]

    def close(self):
        """Stop serving: wakes every waiter, closes every connection. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            # answer requests already taken in (a last set may be what let the
            # host decide to close: its client must still get the reply)
            self._cond.wait_for(lambda: self._inflight == 0, CLOSE_GRACE_S)
            conns = list(self._conns)
        if self._wake_w is not None:
            self._wake_w.send(b"x")
            self._accept_thread.join(5.0)
            self._wake_w.close()
            self._wake_r.close()
        if self._listener is not None:
            self._listener.close()
        for conn in conns:
            _shutdown(conn)
        for thread in list(self._threads):
            thread.join(1.0)
        self.refusals.summary()

    def __enter__(self):
        return self if self._accept_thread is not None else self.start()

    def __exit__(self, *exc):
        self.close()

    def _forget_in_child(self):
        """After fork, in the child: the server is the parent's (its threads were
        not forked); close our copies of its sockets, never shut them down."""
        self._cond = threading.Condition()
        self._closed = True
        conns, self._conns = list(self._conns), set()
        for sock in conns + [self._listener, self._wake_r, self._wake_w]:
            if sock is not None:
                sock.close()

    # connections
    def _accept_loop(self):
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closed:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    self._accept_one()

    def _accept_one(self):
        try:
            conn, addr = self._listener.accept()
        except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
            log.warning("store: accept failed: %s", str(exc))
            time.sleep(0.05)
            return
        with self._cond:
            if self._closed or len(self._conns) >= MAX_CONNECTIONS:
                conn.close()
                if not self._closed:
                    self.refusals.refused(str(addr[0]) if isinstance(addr, tuple) else "a local process",
                                          f"{MAX_CONNECTIONS} connections open")
                return
            self._conns.add(conn)
        thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                  name="commrt-store-conn")
        self._threads.add(thread)
        thread.start()

    def _serve(self, conn):
        source = source_of(conn)            # now: a refused peer may close before we log
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server_handshake(conn, self._secret, AUTH_TIMEOUT)
        except (AuthError, OSError) as exc:
            if not self._closed:
                self.refusals.refused(source, exc)
            self._drop(conn)
            return
        try:
            while not self._closed and self._serve_one(conn):
                pass
        except (OSError, EOFError, ValueError) as exc:
            if not self._closed:
                # the message, not the exception: a handler that keeps records
                # (pytest's capture, a MemoryHandler) would keep its frames too
                log.warning("store: dropped client %s: %s", _peer(conn), str(exc))
        finally:
            self._drop(conn)

    def _drop(self, conn):
        with self._cond:
            self._conns.discard(conn)
        self._threads.discard(threading.current_thread())
        conn.close()

    def _serve_one(self, conn):
        """Read one request and answer it; False when the client has gone."""
        conn.settimeout(None)  # an authenticated client may idle for the whole job
        first = _recv_exact(conn, 1)
        if first is None:
            return False
        conn.settimeout(FRAME_TIMEOUT)
        rest = _recv_exact(conn, _REQUEST.size - 1)
        if rest is None:
            raise EOFError("connection closed inside a request header")
        op, nbytes, timeout = _REQUEST.unpack(bytes(first) + bytes(rest))
        if nbytes > MAX_BODY_BYTES:
            raise ValueError(f"request body of {nbytes} bytes exceeds {MAX_BODY_BYTES}")
        body = _recv_exact(conn, nbytes) if nbytes else b""
        if body is None:
            raise EOFError("connection closed inside a request body")
        if not 0.0 <= timeout <= 1e9:  # also refuses NaN
            timeout = 0.0
        with self._cond:
            self._inflight += 1
        try:
            status, items = self._handle(op, _unpack_items(body), timeout)
            payload = _pack_items(items)
            conn.sendall(_REPLY.pack(status, len(payload)) + payload)
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()
        return True

    # requests
    def _handle(self, op, items, timeout):
        try:
            keys = [_decode_key(k) for k in items] if op != OP_SET else None
            if op == OP_SET:
                if len(items) != 2:
                    raise ValueError("set takes a key and a value")
                return self._set(_decode_key(items[0]), items[1])
            if op == OP_GET:
                return self._wait(keys[:1], timeout, want_value=True)
            if op == OP_WAIT:
                return self._wait(keys, timeout, want_value=False)
            if op == OP_ADD:
                return self._add(keys[0], int(keys[1]))
            if op == OP_CHECK:
                with self._cond:
                    return ST_OK, [b"1" if all(k in self._data for k in keys) else b"0"]
            if op == OP_DELETE:
                with self._cond:
                    return ST_OK, [b"1" if self._data.pop(keys[0], None) is not None else b"0"]
            raise ValueError(f"unknown store operation {op}")
        except (ValueError, IndexError) as exc:
            return ST_ERROR, [str(exc).encode()]

    def _set(self, key, value):
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()
        return ST_OK, []

    def _add(self, key, delta):
        with self._cond:
            old = self._data.get(key, b"0")
            try:
                new = int(old) + delta
            except ValueError:
                raise ValueError(f"add: key {key!r} holds a value that is not an integer") from None
            self._data[key] = str(new).encode()
            self._cond.notify_all()
        return ST_OK, [str(new).encode()]

    def _wait(self, keys, timeout, want_value):
        if not keys:
            raise ValueError("no key given")
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._closed or all(k in self._data for k in keys), timeout)
            if self._closed:
                return ST_ERROR, [b"store server is shutting down"]
            if not done:
                return ST_TIMEOUT, [k.encode() for k in keys if k not in self._data]
            return ST_OK, [self._data[keys[0]]] if want_value else []


def _listen(host, port):
    try:
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=4096)
    except OSError as exc:
        raise StoreError(f"store server cannot listen on {host}:{port}: {exc}") from None


def _decode_key(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("key is not valid UTF-8") from None


def _peer(sock):
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a closed connection"


def _shutdown(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# -- client -------------------------------------------------------------------------

class Store:
    """A client of the store at ``host:port``; connects and authenticates at once,
    retrying the connection until ``timeout`` (the server may still be starting).

    ``timeout`` is also the default deadline of every request.
    """

    def __init__(self, host: str, port: int, secret: bytes, timeout: float = 30.0):
        if timeout is None or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.host, self.port = host, int(port)
        self.timeout = float(timeout)
        self._secret = bytes(secret)
        self._lock = threading.Lock()
        self._idle, self._busy = [], set()
        self._closed = False
        self._idle.append(self._connect(retry=True))
        _FORKSAFE.add(self)

    def _forget_in_child(self):
        """After fork, in the child: close our copies of the parent's connections
        (close, never shutdown: that would cut the parent's too)."""
        self._lock = threading.Lock()
        self._closed = True
        conns, self._idle, self._busy = self._idle + list(self._busy), [], set()
        for conn in conns:
            conn.close()

    @property
    def address(self):
        return self.host, self.port

    # public operations
    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value``, waking every waiter on it."""
        self._request(OP_SET, [_encode_key(key), _as_bytes(value)], 0.0)

    def get(self, key: str, timeout=None) -> bytes:
        """The value of ``key``, waiting until it is set (CommTimeoutError after ``timeout``)."""
        return self._request(OP_GET, [_encode_key(key)], self._wait_time(timeout))[0]

    def wait(self, keys, timeout=None) -> None:
        """Return when every key in ``keys`` is set (CommTimeoutError naming those missing)."""
        keys = _key_list(keys)
        if keys:
            self._request(OP_WAIT, [_encode_key(k) for k in keys], self._wait_time(timeout))

    def add(self, key: str, delta: int = 1) -> int:
        """Atomically add ``delta`` to the integer at ``key`` (0 if unset); returns the sum."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be an int, got {type(delta).__name__}")
        return int(self._request(OP_ADD, [_encode_key(key), str(delta).encode()], 0.0)[0])

    def check(self, keys) -> bool:
        """Whether every key in ``keys`` is set, without waiting."""
        keys = _key_list(keys)
        if not keys:
            return True
        return self._request(OP_CHECK, [_encode_key(k) for k in keys], 0.0)[0] == b"1"

    def delete(self, key: str) -> bool:
        """Remove ``key``; returns whether it was set."""
        return self._request(OP_DELETE, [_encode_key(key)], 0.0)[0] == b"1"

    def close(self) -> None:
        """Close every connection; a request blocked in another thread fails at once."""
        with self._lock:
            self._closed = True
            idle, busy = self._idle, list(self._busy)
            self._idle = []
        for conn in idle:
            conn.close()
        for conn in busy:
            _shutdown(conn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # machinery
    def _wait_time(self, timeout):
        t = self.timeout if timeout is None else float(timeout)
        if t < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        return t

    def _request(self, op, items, wait_s):
        body = _pack_items(items)
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"store request of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
        conn = self._checkout()
        healthy = False
        try:
            status, reply = self._exchange(conn, op, body, wait_s)
            healthy = True
        finally:
            self._checkin(conn, healthy)
        if status == ST_OK:
            return reply
        if status == ST_TIMEOUT:
            raise CommTimeoutError(f"store {_OP_NAMES[op]}", timeout=wait_s,
                                   detail=_describe_missing(reply))
        raise StoreError(f"store {_OP_NAMES[op]} failed at {self.host}:{self.port}: "
                         f"{b''.join(reply).decode('utf-8', 'replace')}")

    def _exchange(self, conn, op, body, wait_s):
        what = f"store {_OP_NAMES[op]}"
        reply_timeout = (wait_s + REPLY_GRACE) if op in (OP_GET, OP_WAIT) else self.timeout
        try:
            conn.settimeout(self.timeout)
            conn.sendall(_REQUEST.pack(op, len(body), wait_s) + body)
            conn.settimeout(reply_timeout)
            header = _recv_exact(conn, _REPLY.size)
            if header is None:
                raise EOFError("the server closed the connection")
            status, nbytes = _REPLY.unpack(header)
            if nbytes > MAX_BODY_BYTES:
                raise StoreError(f"{what}: reply of {nbytes} bytes from {self.host}:{self.port} "
                                 f"exceeds {MAX_BODY_BYTES}")
            reply = _recv_exact(conn, nbytes) if nbytes else b""
            if reply is None:
                raise EOFError("the server closed the connection")
            return status, _unpack_items(reply)
        except socket.timeout:
            raise CommTimeoutError(what, timeout=reply_timeout,
                                   detail=f"no answer from the store at {self.host}:{self.port}")
        except (OSError, EOFError, ValueError) as exc:
            if self._closed:
                raise StoreError(f"{what}: the store client was closed") from None
            raise StoreError(f"{what}: lost the connection to the store at "
                             f"{self.host}:{self.port}: {exc}") from None

    def _checkout(self):
        with self._lock:
            if self._closed:
                raise StoreError("the store client is closed")
            conn = self._idle.pop() if self._idle else None
            if conn is not None:
                self._busy.add(conn)
                return conn
        conn = self._connect(retry=False)
        with self._lock:
            if self._closed:
                conn.close()
                raise StoreError("the store client is closed")
            self._busy.add(conn)
        return conn

    def _checkin(self, conn, healthy):
        with self._lock:
            self._busy.discard(conn)
            if healthy and not self._closed:
                self._idle.append(conn)
                return
        conn.close()  # its state is unknown after an error: never reuse it

    def _connect(self, retry):
        """An authenticated connection; while ``retry``, a refused connection is
        retried until the deadline (the server may still be starting)."""
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(left, 0.001))
            except OSError as exc:
                left = deadline - time.monotonic()
                if not retry or left <= 0:
                    raise StoreError(f"cannot reach the store at {self.host}:{self.port}"
                                     f"{f' after {self.timeout:g} s' if retry else ''}: "
                                     f"{exc}") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.25)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client_handshake(sock, self._secret, max(min(left, AUTH_TIMEOUT), 0.001))
            except BaseException:
                sock.close()
                raise
            return sock


def _encode_key(key):
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}")
    raw = key.encode("utf-8")
    if not raw or len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"store key must be 1 to {MAX_KEY_BYTES} bytes, got {len(raw)}: "
                         f"{key[:60]!r}")
    return raw


def _as_bytes(value):
    if isinstance(value, str):
        raise TypeError("store values are bytes; encode the str first (value.encode())")
    try:
        return bytes(memoryview(value))
    except TypeError:
        raise TypeError(f"store values are bytes, got {type(value).__name__}") from None


def _key_list(keys):
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def _describe_missing(items):
    names = [i.decode("utf-8", "replace") for i in items]
    shown = ", ".join(repr(n) for n in names[:10])
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return f"key{'s' if len(names) != 1 else ''} not set: {shown}{more}"


# Forked children (data-loader workers) must not hold the store's connections:
# every Store and StoreServer closes its copies in the child.
_FORKSAFE = weakref.WeakSet()


def _after_fork_in_child():
    for obj in list(_FORKSAFE):
        obj._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
