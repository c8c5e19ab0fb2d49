"""Point-to-point over shared memory and TCP between real processes."""
import os

import pytest

from commrt.testing import World

import p2p_ranks as R

SIZES = [0, 1, 7, 64, 4096, 16320, 16384, 16385, 100_000, 1 << 20, 5 << 20 | 3]


VARIANTS = {"": {}, "two-copy": {"COMMRT_CMA": "0"}, "single-copy": {"COMMRT_CMA_MIN_BYTES": "0"},
            "streams": {"COMMRT_TCP_STREAMS": "3"}}


@pytest.fixture(scope="module",
                params=["shm", "shm-two-copy", "shm-single-copy", "tcp", "tcp-streams"])
def world3(request):
    """Shared memory as configured by default (large messages below
    COMMRT_CMA_MIN_BYTES stream through the ring, larger ones copy once with
    process_vm_readv), without process_vm_readv at all, with it for every
    large message, TCP, and TCP with three connections per pair (a large
    message's DATA striped over them)."""
    transport, _, variant = request.param.partition("-")
    env = VARIANTS[variant]
    with World(3, transport=transport, env=env) as w:
        yield w


@pytest.mark.parametrize("nbytes", SIZES)
def test_exchange_sizes(world3, nbytes):
    res = world3.run(R.exchange, nbytes)
    assert res[0] is None
    for rank in (1, 2):
        assert res[rank] == (0, 3, nbytes, True)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "bool", "complex64"])
def test_exchange_dtypes(world3, dtype):
    res = world3.run(R.exchange, 40_000, dtype)
    assert all(r[3] for r in res[1:])


@pytest.mark.parametrize("nbytes", [100, 1 << 20])
def test_truncation_names_both_sizes_and_pair_survives(world3, nbytes):
    err, after = world3.run(R.truncation, nbytes)[1]
    assert err[0] == nbytes and err[1] == nbytes // 2
    assert str(nbytes) in err[2] and str(nbytes // 2) in err[2]
    assert after == [3] * 10


def test_bad_arguments(world3):
    out = world3.run(R.bad_arguments)[0]
    assert out["non_contiguous"][0] == "ValueError" and "non-contiguous" in out["non_contiguous"][1]
    assert out["read_only"][0] == "ValueError" and "read-only" in out["read_only"][1]
    for key, word in [("dst_range", "dst"), ("dst_negative", "dst"), ("src_range", "src"),
                      ("negative_tag", "tag")]:
        assert out[key] is not None and out[key][0] == "ValueError", key
        assert word in out[key][1], out[key]
    assert out["not_a_buffer"][0] == "TypeError" and "buf" in out["not_a_buffer"][1]


def test_timeout_names_operation_peer_and_tag(world3):
    msg, took = world3.run(R.timeout_recv)[1]
    assert "recv" in msg and "rank 0" in msg and "77" in msg
    assert took < 5


def test_stats_count_exact_payload_bytes(world3):
    sizes = [0, 10, 20000, 3 << 20]
    res = world3.run(R.stats_exact, sizes)
    total = sum(sizes)
    assert res[0]["bytes_sent"] == total and res[0]["msgs_sent"] == len(sizes)
    assert res[0]["bytes_recv"] == 0 and res[0]["msgs_recv"] == 0
    assert res[1]["bytes_recv"] == total and res[1]["msgs_recv"] == len(sizes)
    assert res[1]["bytes_sent"] == 0 and res[1]["msgs_sent"] == 1     # the 0-byte "go"


def test_copier_chooses_who_copies_a_large_message(world3):
    """A receive whose copier is the RECEIVER (a scatter's receivers) reads a
    large shared-memory message with process_vm_readv below
    COMMRT_CMA_MIN_BYTES too where ranks share cores: only its RTS comes
    through the ring.  One whose copier is EXCHANGE (an all-to-all's) reads
    it from a quarter of the threshold up in any case.  One whose copier is
    the SENDER (a gather's root) has the sender write it with
    process_vm_writev: its RTS and a FIN.  A plain receive of the same
    message gets a DATA record per 64 KiB chunk.  Eager messages, TCP and
    shared memory without process_vm_readv/writev (two-copy) ignore the
    choice and still deliver the same bytes."""
    big = 1 << 19       # below COMMRT_CMA_MIN_BYTES (1 MiB oversubscribed, else 2), from 1/4 up
    sizes = [100, 100_000, big]
    res = world3.run(R.copier_receive, sizes)[1]
    assert all(ok for _, _, ok, _ in res), res
    hdr = {(n, copier): h for n, copier, _, h in res}
    assert set(hdr) == {(n, c) for n in sizes for c in (0, 1, 2, 3)}, hdr
    assert all(h > 0 for h in hdr.values()), hdr
    shared_cores = world3.size > len(os.sched_getaffinity(0))
    if world3.transport == "shm" and world3.env.get("COMMRT_CMA") != "0":
        if shared_cores or "COMMRT_CMA_MIN_BYTES" in world3.env:
            assert hdr[(big, 1)] <= 2 * 64, hdr             # the RTS (a credit frame at most)
        else:
            assert hdr[(big, 1)] >= 8 * 64, hdr             # a core each: streamed
        assert hdr[(big, 3)] <= 2 * 64, hdr
        assert hdr[(big, 2)] <= 3 * 64, hdr                 # the RTS and the FIN
        if "COMMRT_CMA_MIN_BYTES" not in world3.env:
            assert hdr[(big, 0)] >= 8 * 64, hdr             # streamed in 64 KiB chunks
    elif world3.transport == "shm":
        assert min(hdr[(big, c)] for c in (0, 1, 2, 3)) >= 8 * 64, hdr   # two-copy: streamed


def test_sendrecv_reads_half_an_exchange_once(world3):
    """sendrecv's receive is half of an exchange (its rank sends meanwhile), so a
    large shared-memory message is read with process_vm_readv from a quarter
    of COMMRT_CMA_MIN_BYTES up (the EXCHANGE copier), not streamed, which
    would cost each core two copies per byte: only control frames come
    through the ring.  Two-copy shared memory and TCP stream it, and every
    variant delivers the same bytes."""
    big = 1 << 19
    res = [r for r in world3.run(R.sendrecv_headers, big) if r is not None]
    assert len(res) == 2 and all(ok for ok, _ in res), res
    if world3.transport == "shm" and world3.env.get("COMMRT_CMA") != "0":
        assert all(h <= 4 * 64 for _, h in res), res
    elif world3.transport == "shm":
        assert all(h >= 8 * 64 for _, h in res), res


def test_a_copier_out_of_range_is_refused(world3):
    for out in world3.run(R.bad_copiers):
        assert len(out) == 4 and all("copier must be 0, 1 (receiver), 2 (sender) or 3 "
                                     "(exchange)" in m for m in out), out


def test_objects(world3):
    a, big_ok = world3.run(R.objects)[1]
    assert a == {"small": [1, 2, 3]} and big_ok


def test_dlpack_buffers(world3):
    assert world3.run(R.dlpack_buffers)[1] is True


def test_progress_thread_moves_messages_while_caller_sleeps(world3):
    res = world3.run(R.background_progress, 4 << 20)
    assert res[0] is True and res[1] is True


def test_ranks_on_two_pretend_hosts_mix_shared_memory_and_tcp():
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    with World(4, transport="auto", rank_env={r: {"COMMRT_HOST_ID": h} for r, h in hosts.items()}) as w:
        res = w.run(R.mixed_channels)
    for me, (kinds, ok) in enumerate(res):
        assert ok
        for peer, kind in kinds.items():
            want = "self" if peer == me else ("shm" if hosts[peer] == hosts[me] else "tcp")
            assert kind == want, (me, peer, kind)


@pytest.mark.parametrize("nbytes", [0, 8, 16385, 1 << 20])
def test_sendrecv_ring_shift_and_pairs(world3, nbytes):
    assert world3.run(R.sendrecv_shift, nbytes) == [(True, True)] * 3


def test_sendrecv_errors(world3):
    out = world3.run(R.sendrecv_errors)
    for r in (0, 1):
        assert out[r]["trunc"] == (8, 4), out[r]
        assert "out of range" in out[r]["bad_dst"]
        msg, elapsed = out[r]["timeout"]
        assert "recv" in msg and elapsed < 5, out[r]


def test_wait_without_spinning(world3):
    got, timed_out = world3.run(R.wait_without_spinning)[1]
    assert got == (1000, 7000)
    assert timed_out is not None and 0.15 < timed_out < 5


def test_receives_match_a_backlog_in_arrival_order(world3):
    """Per-peer unexpected lists (a receive from one peer looks at its messages
    only) keep MPI's order: every receive, by source, tag or wildcard, takes the
    first message it accepts in arrival order."""
    res = world3.run(R.matching_order)
    assert res[0] == [] and res[1:] == [None, None]


@pytest.mark.parametrize("cores", ["own", "shared"])
def test_a_large_one_way_message_is_copied_by_both_cores_or_by_the_receiver_alone(cores):
    """From cma_min (2 MiB with a core per rank, 1 MiB where ranks share cores),
    the receiver reads one half while its waiting sender writes the other
    (shm.pxi, split copies); a sender busy elsewhere leaves the receiver both
    halves.  Every message arrives intact; the first (before single copy has
    proven itself) is read in one piece.  cores="shared": both ranks on one
    core (this process pinned to one while World spawns them), where the
    sender writes only when the scheduler gives it the core while the receiver
    reads, and the receiver takes back a half its sender has not begun."""
    if cores == "own" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core here: the shared case covers it")
    # the sleeping sender's progress thread and heartbeat would push its part for it
    quiet = {"COMMRT_PROGRESS_DELAY_US": "5000000", "COMMRT_HEARTBEAT_S": "5",
             "COMMRT_LIVENESS_TIMEOUT_S": "60"}
    mask = os.sched_getaffinity(0)
    if cores == "shared":                   # the ranks inherit it when spawned
        os.sched_setaffinity(0, {min(mask)})
    try:
        with World(2, transport="shm", env=quiet, timeout=90) as w:
            os.sched_setaffinity(0, mask)
            res = w.run(R.split_copies, 16 << 20, timeout=80)
    finally:
        os.sched_setaffinity(0, mask)
    ok, split = res[1]
    assert ok == [True] * 8, ok
    # 5 waited-for sends, the slept-on one, the larger buffer's; not the first
    assert split["shared"] + split["alone"] == 7, split
    assert split["alone"] >= 1, split       # (the slept-on one at least)
    if cores == "own":
        assert split["shared"] >= 1, split
