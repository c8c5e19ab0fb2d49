"""Random and mutated frames fed to a real engine's TCP socket and shared-memory ring
(the data plane after authentication), COMMRT_FUZZ_CASES cases per run split
between the two (see commrt/config.py), and a sixth as many on an extra TCP
stream of a pair (COMMRT_TCP_STREAMS), which may carry only DATA and BYE.

Each case must end in one of two ways, never a crash or a hang: the engine
takes the frames (as messages, truncation errors, an abort...) or it drops
the peer with a reason; either way the requests involving that peer end in
a commrt error or stay pending, and the engine's other peer (the witness)
still delivers a valid message intact.  A frame whose header is plainly not
commrt's (magic, version, opcode, source, sequence), or an EAGER longer than
the credit the engine grants, must drop the peer.
"""
import random

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

import wire
from commrt import config
from fuzz_driver import Driver
from harness import SEED

CASES = config.get("COMMRT_FUZZ_CASES")
# a campaign's bound grows with its cases (~10 ms a case here; the long campaign's
# 10^5 ran past pytest's default 120 s), 50 ms a case
CAMPAIGN_TIMEOUT_S = max(120, CASES // 20)
ALLOWED = {"done", "pending", "PeerLostError", "MessageTruncatedError",
           "CollectiveMismatchError", "AbortedError", "CommError"}
BATCH = 8
OP = wire.OPCODES
DATA_OPS = (OP["EAGER"], OP["DATA"], OP["ABORT"], OP["PAD"])


def field(name):
    return st.integers(wire.field_min(name), wire.field_max(name))


def frame_fields(kind):
    ops = [v for k, v in OP.items() if kind == "shm" or k != "PAD"]
    return st.fixed_dictionaries(
        {"opcode": st.one_of(st.sampled_from(ops), field("opcode")),
         "src": st.one_of(st.just("$src"), st.just("$src"), field("src")),
         "seq": st.one_of(st.just("$seq"), st.just("$seq"), field("seq")),
         "ctx": st.one_of(st.just("$ctx"), st.just("$ctx"), field("ctx")),
         "tag": st.one_of(st.sampled_from([5, 6, 9, 0]), field("tag")),
         "nbytes": st.one_of(st.integers(0, 5000),
                             st.sampled_from([4031, 4032, 4096, 4097, 16384, 16385, 32768,
                                              32769, 1 << 40, (1 << 63), (1 << 64) - 1]),
                             field("nbytes")),
         "cookie": st.one_of(st.sampled_from(["$send", "$recv", 777]), field("cookie")),
         "addr": st.one_of(st.integers(0, 40000),
                           st.sampled_from([(1 << 64) - 1, (1 << 64) - 8, 1 << 63]),
                           field("addr")),
         "meta": field("meta")},
        optional={"magic": field("magic"), "version": field("version")})


@st.composite
def frames(draw, kind):
    fields = draw(frame_fields(kind))
    n = fields["nbytes"]
    honest = fields["opcode"] in DATA_OPS and n <= 40000 and draw(st.booleans())
    plen = n if honest else draw(st.integers(0, 300))
    # payload bytes from a drawn seed: hypothesis drawing 40 KB byte by byte is slow
    payload = random.Random(draw(st.integers(0, 1 << 32))).randbytes(plen)
    return fields, payload


@st.composite
def cases(draw, kind):
    case = {"frames": draw(st.lists(frames(kind), min_size=0, max_size=4))}
    if not case["frames"] or draw(st.integers(0, 9)) == 0:
        case["raw"] = draw(st.binary(max_size=300))
    case["flips"] = draw(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)),
                                  max_size=3))
    if draw(st.integers(0, 4)) == 0:
        case["cut"] = draw(st.integers(0, 1 << 20))
    if kind == "shm" and draw(st.integers(0, 9)) == 0:
        case["tail"] = draw(st.integers(-(1 << 20), 1 << 20)) % (1 << 64)
    return case


def _one(**fields):
    base = {"src": "$src", "seq": "$seq", "ctx": "$ctx", "tag": 6}
    base.update(fields)
    return {"frames": [(base, b"\x5a" * 16)]}


# cases written out: where an unchecked sum of two wire fields would wrap around
EDGES = [
    _one(opcode=OP["DATA"], cookie="$recv", addr=(1 << 64) - 8, nbytes=16),   # offset + length
    _one(opcode=OP["DATA"], cookie="$recv", addr=1 << 63, nbytes=1 << 63),
    _one(opcode=OP["EAGER"], tag=5, nbytes=(1 << 64) - 1),
    _one(opcode=OP["PAD"], nbytes=8),          # a ring record that leaves the ring misaligned
    _one(opcode=OP["PAD"], nbytes=(1 << 64) - 64),
    _one(opcode=OP["ABORT"], nbytes=(1 << 64) - 1),
]


@pytest.fixture(scope="module", params=["tcp", "shm"])
def driver(request, tmp_path_factory):
    d = Driver(request.param, str(tmp_path_factory.mktemp("fuzz") / "engine.log"))
    yield d
    d.stop()


def check(case, kind, v):
    """The verdict of one case (see the module docstring)."""
    assert not v["defects"], v
    assert v["witness"] == "ok", f"the engine's other peer was harmed: {v}"
    for name, outcome in v["requests"].items():
        assert outcome in ALLOWED, f"{name} ended in {outcome}: {v}"
    if v["lost"] is not None:
        assert v["lost"].strip(), v
    if v["foreign_first"]:         # decided by the target, on the values it sent
        assert v["lost"] is not None and "protocol error" in v["lost"], \
            f"a frame with a foreign header was taken: {v}"


def test_codec_matches_the_engine(driver):
    """The Python header agrees with the engine's: a valid EAGER is delivered, and
    the engine's own RTS and CTS decode (checked inside every case's set-up)."""
    v = driver.run({"frames": [({"opcode": OP["EAGER"], "src": "$src", "seq": "$seq",
                                 "ctx": "$ctx", "tag": 5, "nbytes": 3}, b"abc")]})
    assert v["lost"] is None and v["requests"]["recv-small"] == "done", v
    assert v["witness"] == "ok", v


def _abort(**fields):
    base = {"opcode": OP["ABORT"], "src": "$src", "seq": "$seq", "ctx": "$ctx", "tag": 1,
            "meta": 3, "addr": 1, "cookie": 0, "nbytes": 4}
    base.update(fields)
    return {"frames": [(base, b"boom"[:base["nbytes"]] if base["nbytes"] <= 4 else
                        b"x" * base["nbytes"])]}


# an ABORT's fields reach the error every rank raises: each one commrt never writes
FORGED_ABORTS = {
    "unknown code": _abort(meta=99),
    "code 0": _abort(meta=0),
    "culprit outside the world": _abort(tag=1 << 30),
    "culprit negative": _abort(tag=-5),
    "origin 2**63": _abort(addr=1 << 63),
    "origin outside the world": _abort(addr=1 << 30),
    "cookie beyond the pair bit": _abort(cookie=2),
    "meta2 set": _abort(meta2=1),
    "reason too long": _abort(nbytes=256),
}


@pytest.mark.parametrize("what", sorted(FORGED_ABORTS))
def test_a_forged_abort_is_refused_and_poisons_nothing(driver, what):
    v = driver.run(FORGED_ABORTS[what])
    assert v["lost"] is not None and "protocol error" in v["lost"], v
    assert not v["poisoned"], v
    assert set(v["requests"].values()) == {"PeerLostError"}, v
    assert v["witness"] == "ok" and not v["defects"], v


def test_a_well_formed_abort_poisons_its_context(driver):
    v = driver.run(_abort())
    assert v["lost"] is None and v["poisoned"], v
    assert v["requests"]["recv-small"] == "PeerLostError", v      # code 3: PEER_LOST, rank 1
    assert v["witness"] == "ok" and not v["defects"], v


# EAGER lengths whose sums wrapped around (an unexpected message's block of
# sizeof(umsg_t) + nbytes bytes; its credit cost MSG_COST + nbytes as int64):
# the TCP engine allocated a few bytes and streamed the payload past them
HUGE_EAGERS = {"2**64-1": (1 << 64) - 1, "2**64-16": (1 << 64) - 16, "2**63": 1 << 63,
               "2**63+256": (1 << 63) + 256}


@pytest.mark.parametrize("what", sorted(HUGE_EAGERS))
def test_an_eager_message_longer_than_the_credit_is_refused(driver, what):
    """An EAGER frame that announces more bytes than the credit the engine granted
    (a sender may never send one) drops its sender as a protocol error before
    anything is allocated for it, matched by no receive (tag 9) or by one; the
    engine's other peer is unharmed."""
    for tag in (9, 5):
        v = driver.run(_one(opcode=OP["EAGER"], tag=tag, nbytes=HUGE_EAGERS[what]))
        assert v["lost"] is not None and "protocol error" in v["lost"], (tag, v)
        assert v["witness"] == "ok" and not v["defects"], (tag, v)


@pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)
def test_random_and_mutated_frames_are_refused_cleanly(driver):
    _campaign(driver, CASES // 2)


@pytest.fixture(scope="module")
def lane_driver(tmp_path_factory):
    d = Driver("lane", str(tmp_path_factory.mktemp("fuzz") / "engine.log"))
    yield d
    d.stop()


@pytest.mark.parametrize("opcode", sorted(set(OP) - {"DATA", "BYE"}))
def test_an_extra_tcp_stream_refuses_every_frame_but_data_and_bye(lane_driver, opcode):
    """A pair's extra streams (COMMRT_TCP_STREAMS) carry only DATA and BYE: any
    other frame there, well formed or not, drops the peer as a protocol error."""
    fields = {"opcode": OP[opcode], "src": "$src", "seq": "$seq", "ctx": "$ctx", "tag": 5,
              "nbytes": 4, "cookie": "$recv"}
    v = lane_driver.run({"frames": [(fields, b"abcd")]})
    why = "bad frame header" if opcode == "PAD" else "a frame other than DATA or BYE"
    assert v["lost"] is not None and f"protocol error: {why}" in v["lost"], v
    assert set(v["requests"].values()) == {"PeerLostError"}, v
    assert v["witness"] == "ok" and not v["defects"], v


def test_data_on_an_extra_tcp_stream_lands_in_its_receive(lane_driver):
    """The striped half of a rendezvous: DATA for the receive the engine's CTS
    named, on the extra stream, is taken (the control test of the one above)."""
    fields = {"opcode": OP["DATA"], "src": "$src", "seq": "$seq", "ctx": "$ctx", "tag": 6,
              "nbytes": 16, "cookie": "$recv", "addr": 0}
    v = lane_driver.run({"frames": [(fields, b"\x5a" * 16)]})
    assert v["lost"] is None and not v["defects"], v
    assert v["witness"] == "ok", v


@pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)
def test_random_and_mutated_frames_on_an_extra_tcp_stream_are_refused_cleanly(lane_driver):
    _campaign(lane_driver, CASES // 6)


def _campaign(driver, ncases):
    """ncases random, mutated and cut frames (in batches) through driver, each case
    checked; COMMRT_FAULT_SEED replays the run."""
    kind = driver.kind
    start = driver.cases

    # BATCH cases per example: hypothesis's cost per example, not per case, dominates.
    # No shrinking: a crashing case costs a fresh engine process per try; the failing
    # case is printed whole, and COMMRT_FAULT_SEED replays the run.
    @settings(max_examples=max(1, ncases // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @seed(SEED)
    @given(batch=st.lists(cases("tcp" if kind == "lane" else kind), min_size=BATCH,
                          max_size=BATCH))
    @example(batch=EDGES)
    def some(batch):
        for i, case in enumerate(batch):
            try:
                check(case, kind, driver.run(case))
            except AssertionError as exc:
                raise AssertionError(f"case {i} of the batch: {case}\n{exc}") from None

    some()
    assert driver.cases - start >= ncases // BATCH * BATCH
