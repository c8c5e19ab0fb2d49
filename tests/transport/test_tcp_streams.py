"""Several TCP connections per pair (COMMRT_TCP_STREAMS): a large message's DATA
striped over the extra ones, everything else on the first; the pair takes the smaller of
its two ranks' counts; a BYE on every stream, so closing right after a send
still delivers it; a bad count is refused at init.  (Random schedules over
striped pairs: test_p2p_property's 3-tcp-streams world; every p2p case:
test_p2p_basic's tcp-streams world; a rank killed mid-transfer:
test_p2p_faults.)"""
import threading
import time

import numpy as np
import pytest

from commrt.rendezvous.auth import new_secret
from commrt.rendezvous.store import Store, StoreServer
from commrt.testing import World
from commrt.transport.connect import build_engine


def _engines(monkeypatch, streams, n=2):
    """n engines over TCP, built in threads of this process."""
    monkeypatch.setenv("COMMRT_TRANSPORT", "tcp")
    monkeypatch.setenv("COMMRT_TCP_STREAMS", str(streams))
    secret = new_secret()
    server = StoreServer(secret).start()
    host, port = server.address
    engines, errors = {}, []

    def rank(r):
        try:
            store = Store(host, port, secret, timeout=20)
            engines[r] = build_engine(r, n, store, secret, host_id=f"h{r}", local_size=1,
                                      timeout=20)[0]
        except BaseException as exc:        # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return [engines[r] for r in range(n)], server


def _payload(seed, nbytes):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


SIZES = [9 << 20, 1 << 20, (3 << 20) + 5, 300_000, 100]


def test_data_striped_over_every_stream_in_order_both_ways(monkeypatch):
    (a, b), server = _engines(monkeypatch, 3)
    try:
        for e, peer in ((a, 1), (b, 0)):
            st = e.stats()[peer]
            assert st["streams"] == 3 and len(st["stream_bytes_recv"]) == 3
        # both ways at once, one tag, sent before any receive is posted (the
        # announcements wait unexpected): each receive must get its own message
        sends = [e.isend(_payload((src, i), n), 1 - src, 0, 7)
                 for i, n in enumerate(SIZES) for src, e in ((0, a), (1, b))]
        got = {src: [np.zeros(n, np.uint8) for n in SIZES] for src in (0, 1)}
        recvs = [e.irecv(got[1 - me][i], 1 - me, 0, 7)
                 for i in range(len(SIZES)) for me, e in ((0, a), (1, b))]
        for r in sends + recvs:
            r.wait(30)
        for src in (0, 1):
            for i, n in enumerate(SIZES):
                assert np.array_equal(got[src][i], _payload((src, i), n)), (src, i)
        for e, peer in ((a, 1), (b, 0)):
            per_stream = e.stats()[peer]["stream_bytes_recv"]
            # 14 MiB in 1 MiB pieces over the 2 extra streams: each carried megabytes,
            # the first only the rest (headers, eager messages, replies)
            assert per_stream[0] < (1 << 20) and all(x > (4 << 20) for x in per_stream[1:]), \
                per_stream
    finally:
        a.close()
        b.close()
        server.close()


def test_close_right_after_a_send_still_delivers_it(monkeypatch):
    """A send completes once its DATA is handed to the kernel; its BYE follows on
    every stream, so the receiver reads every piece before it calls the peer closed."""
    (a, b), server = _engines(monkeypatch, 4)
    try:
        want = [_payload(i, 6 << 20) for i in range(3)]
        bufs = [np.zeros(6 << 20, np.uint8) for _ in want]
        recvs = [b.irecv(buf, 0, 0, 5) for buf in bufs]
        for w in want:
            a.send(w, 1, 0, 5, timeout=30)
        a.close()
        for r in recvs:
            r.wait(30)
        assert all(np.array_equal(x, y) for x, y in zip(bufs, want))
        end = time.monotonic() + 10          # the BYEs may still be on their way
        while b.peer_lost(0) is None and time.monotonic() < end:
            b.progress()
            time.sleep(0.01)
        assert b.peer_lost(0) is not None and "closed" in b.peer_lost(0)
    finally:
        a.close()
        b.close()
        server.close()


def test_single_stream_has_no_lanes(monkeypatch):
    (a, b), server = _engines(monkeypatch, 1)
    try:
        assert a.stats()[1]["streams"] == 1 and len(a.stats()[1]["stream_bytes_recv"]) == 1
    finally:
        a.close()
        b.close()
        server.close()


def _streams_seen(comm):
    peer = 1 - comm.rank
    return comm.stats()[peer]["streams"]


def test_a_pair_takes_the_smaller_count():
    with World(2, transport="tcp", rank_env={0: {"COMMRT_TCP_STREAMS": "4"},
                                             1: {"COMMRT_TCP_STREAMS": "2"}}) as w:
        assert w.run(_streams_seen) == [2, 2]


@pytest.mark.parametrize("value", ["0", "9"])
def test_a_bad_count_is_refused(monkeypatch, value):
    monkeypatch.setenv("COMMRT_TCP_STREAMS", value)
    with pytest.raises(ValueError, match="COMMRT_TCP_STREAMS must be 1-8"):
        build_engine(0, 1, None, b"x" * 32, host_id="h", local_size=1, timeout=5)
