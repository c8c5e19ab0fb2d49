"""Reduce-receives (Engine.irecv_reduce): the message is combined into the
buffer as it lands -- eager, streamed through the ring, read with
process_vm_readv, over TCP in reads that split elements, unexpected, to
self -- and a message other than the one expected leaves the buffer untouched
and the channel in step."""
import pytest

import reduce_ranks as R
from commrt.testing import World

# shm: eager (<= 16 KiB), streamed through the ring, and read by CMA (forced down to 64 KiB)
PATHS = {"shm": {}, "shm-cma": {"COMMRT_CMA_MIN_BYTES": "65536"}, "tcp": {}}


@pytest.fixture(scope="module", params=list(PATHS))
def world(request):
    transport = "tcp" if request.param == "tcp" else "shm"
    with World(2, transport=transport, env=PATHS[request.param], timeout=120) as w:
        yield w


@pytest.mark.parametrize("skew", [False, True], ids=["posted", "skewed"])
@pytest.mark.parametrize("n,dtype,op", [(1, "float64", "sum"), (1001, "int16", "bxor"),
                                         (70001, "float32", "min"), (600_000, "float64", "sum")])
def test_combines_in_place(world, n, dtype, op, skew):
    for ok, meta, nbytes in world.run(R.pairwise, n, dtype, op, skew):
        assert ok and meta == R.META, (ok, meta)
        assert nbytes == n * {"float64": 8, "int16": 2, "float32": 4}[dtype]


@pytest.mark.parametrize("piece", [4096, 512 << 10, 4 << 20])
@pytest.mark.parametrize("n,dtype,op", [(70001, "float64", "sum"), (300_001, "int16", "bxor")])
def test_any_piece_size_combines_every_element(world, piece, n, dtype, op):
    # messages of 560,008 and 600,002 bytes: many pieces of one page, a short last
    # one of 512 KiB, or one piece larger than the message (read by CMA on shm-cma)
    for ok, meta, nbytes in world.run(R.in_pieces, piece, n, dtype, op):
        assert ok and meta == R.META, (ok, meta)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_any_placement_of_either_buffer_combines_every_element(world, dtype):
    # 600,000 elements: pieces of 512 KiB read with process_vm_readv on shm-cma into
    # a bounce buffer at the sender's offset mod 64, which differs from the receiver's
    offsets = [0, 8, 16, 24, 40, 56] if dtype == "float64" else [0, 4, 16, 36, 52, 60]
    for rank_result in world.run(R.at_offsets, 600_000, dtype, offsets):
        assert len(rank_result) == len(offsets)
        for off, mine, placed, ok in rank_result:
            assert placed == mine and ok, (off, mine, placed)


def test_a_piece_that_could_split_an_element_is_refused():
    from commrt.transport import _core

    for bad in (0, 1000, 4095, 4097, 6144):
        with pytest.raises(ValueError, match="multiple of 4096"):
            _core._set_cma_piece(bad)
    old = _core._set_cma_piece(8192)
    assert _core._set_cma_piece(old) == 8192


def test_to_self(world):
    assert world.run(R.to_self, 5000) == [True, True]


@pytest.mark.parametrize("n", [3, 100_000])
@pytest.mark.parametrize("what", ["meta", "short", "long"])
def test_unexpected_message_leaves_buffer_untouched(world, what, n):
    _, (untouched, meta, nbytes, summed, meta2, nbytes2) = world.run(R.mismatch, n, what)
    assert untouched, "a message that was not the one expected changed the buffer"
    want = {"meta": (R.META + 1, 8 * n), "short": (R.META, 8 * (n - 1)),
            "long": (R.META, 8 * (n + 3))}[what]
    assert (meta, nbytes) == want
    assert summed and (meta2, nbytes2) == (R.META, 8 * n), "the channel lost its step"


def test_bad_arguments_are_refused():
    with World(1) as w:
        out, = w.run(R.bad_arguments)
    assert "combine function" in out["no hook"] and "combine function" in out["itemsize 3"]
    assert "whole number" in out["split element"]
    assert out["read-only"] is not None


def test_sender_copier_streams_a_reduce_receive():
    """Two ranks with a core each: a 3 MiB reduce-receive is read with
    process_vm_readv (from COMMRT_CMA_MIN_BYTES, 2 MiB, up: one RTS comes
    through the ring), unless its copier is the SENDER (a binomial reduce's
    combines): then it streams, the sender copying the chunks in while this
    rank combines them (a DATA record per 64 KiB chunk); the same sum.  On
    one core (ranks outnumber cores) streaming would need the sender scheduled
    too, and both are read."""
    with World(2, transport="shm", timeout=120) as w:
        own_core = w.run(R.cores)[0] >= 2
        res = w.run(R.copier_headers, 3 << 17)[1]
    assert all(ok for _, ok, _ in res), res
    hdr = dict((c, h) for c, _, h in res)
    assert hdr[0] <= 2 * 64, hdr
    assert (hdr[2] >= 48 * 64) if own_core else (hdr[2] <= 2 * 64), hdr


def test_the_bounce_buffer_takes_the_senders_offset_within_its_slack():
    """A CMA read lands in the bounce buffer at the sender's address mod 64 (the
    kernel's copy runs 1.5-5x slower between addresses that differ there), and
    never further than the 2 * 64 bytes of slack the buffer has past its piece."""
    from commrt.transport import _core

    for base in range(0x7F0000001000, 0x7F0000001000 + 64 * 3, 4):
        for addr in (0x55AA00000000 + k for k in range(0, 200, 4)):
            at = _core._bounce_at(base, addr)
            assert at % 64 == addr % 64 and 0 <= at - base <= 126, (hex(base), hex(addr))
