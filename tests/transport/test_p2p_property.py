"""Random schedules of messages deliver exactly the bytes sent, in order per (source, tag).

Sizes from 0 to several MiB, every dtype, tags, blocking and non-blocking
mixed, wildcard receives; 2, 3 and 4 processes; shared memory and TCP.  The
worlds live for the whole module so examples are cheap."""
import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commrt.testing import World

import p2p_ranks as R

SIZES = [0, 1, 3, 8, 100, 4096, 16383, 16384, 16385, 65536, 300_001, 1 << 20, 3 << 20]


@pytest.fixture(scope="module", params=[(2, "shm"), (3, "shm"), (4, "shm"), (3, "shm-two-copy"),
                                        (2, "tcp"), (4, "tcp"), (3, "tcp-streams")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def world(request):
    n, name = request.param
    transport, _, variant = name.partition("-")
    env = {"two": {"COMMRT_CMA": "0"}, "streams": {"COMMRT_TCP_STREAMS": "2"}}.get(
        variant.split("-")[0], {})
    with World(n, transport=transport, env=env) as w:
        yield w


def schedules(n):
    message = st.tuples(
        st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 3),
        st.sampled_from(SIZES), st.integers(0, len(R.DTYPES) - 1), st.booleans(), st.booleans())
    return st.lists(message, min_size=1, max_size=14)


def normalise(schedule, wildcard=False):
    """Round sizes to the dtype; receives of one (source, tag) stream are posted
    in send order (pre-posted ones first); blocking sends only to pre-posted
    receives, and with wildcard receives only to oneself.

    (A wildcard receive takes whatever arrives first, one's own messages
    included, so the receive pre-posted "for" a blocking send may be gone by
    the time it arrives; two ranks each blocked sending a large message the
    other has no receive left for is a deadlock by MPI's rules, not a bug.
    So with wildcards a blocking send goes only to oneself, on a rank that
    pre-posts every receive: one is then always free for it.)"""
    deferred = set()
    posted = []
    for src, dst, tag, nbytes, dti, blocking, preposted in schedule:
        stream = (src, dst, tag)
        preposted = preposted and stream not in deferred
        if not preposted:
            deferred.add(stream)
        posted.append(preposted)
    # with wildcards a peer's message may take the receive pre-posted for one's
    # own: a blocking send to oneself is safe only on a rank whose receives are
    # all pre-posted (else it may wait for a receive posted after it returns)
    late = {dst for (_, dst, *_), p in zip(schedule, posted) if not p}
    out = []
    for (src, dst, tag, nbytes, dti, blocking, _), preposted in zip(schedule, posted):
        item = np.dtype(R.DTYPES[dti]).itemsize
        blocking = blocking and preposted and (not wildcard or (src == dst and dst not in late))
        out.append((src, dst, tag, nbytes - nbytes % item, dti, blocking, preposted))
    return out


def check(schedule, results):
    """Every rank got exactly its messages, bytes intact, in send order per (source, tag)."""
    for me, got in enumerate(results):
        expected = collections.defaultdict(list)
        for i, (src, dst, tag, nbytes, dti, _, _) in enumerate(schedule):
            if dst == me:
                data = R.payload(src, dst, i, nbytes, R.DTYPES[dti]).view(np.uint8).tobytes()
                expected[(src, tag)].append(data)
        arrived = collections.defaultdict(list)
        for src, tag, nbytes, data in got:
            assert len(data) == nbytes
            arrived[(src, tag)].append(data)
        assert dict(arrived) == dict(expected)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_schedules(world, data):
    wildcard = data.draw(st.booleans())
    schedule = normalise(data.draw(schedules(world.size)), wildcard)
    results = world.run(R.run_schedule, schedule, wildcard, timeout=90)
    check(schedule, results)
