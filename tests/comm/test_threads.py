"""The thread rule: collectives of one communicator are entered by one thread at a
time; a second thread gets ConcurrentCollectiveError at once, naming both threads,
and nobody gets wrong data.  Point-to-point and async_op=True are not affected."""
import pytest

from commrt.testing import World

import comm_ranks as R


@pytest.fixture(scope="module")
def world2():
    with World(2, transport="shm", env={"COMMRT_COLL_PROBE_S": "0.5"}, timeout=90) as w:
        yield w


@pytest.mark.parametrize("nbytes,kind", [(8, "all_reduce"), (1 << 20, "all_reduce"),
                                          (8, "barrier")])
def test_second_thread_gets_immediate_error_naming_both(world2, nbytes, kind):
    r0, r1 = world2.run(R.second_thread_enters, nbytes, kind, timeout=60)
    if kind == "all_reduce":
        assert r0["value"] == 3.0 and r1["value"] == 3.0      # the holder's call is right
    for what, err in r0["errors"].items():
        assert err is not None, f"{what} from a second thread was let in"
        msg, took = err
        assert "'holder'" in msg and f"'{r0['me']}'" in msg, msg
        assert "one thread at a time" in msg
        assert msg.startswith(("all_reduce" if what == "async" else what) + ":"), msg
        assert took < 1.0, (what, took)                         # at once, not after a wait


def test_async_collectives_from_one_thread_are_not_a_violation(world2):
    r0, r1 = world2.run(R.async_from_one_thread_is_fine, timeout=60)
    assert r0 == r1 == [2.0 * i + 1 for i in range(8)] + [2.0]


def test_threads_with_their_own_subcommunicators(world2):
    r0, r1 = world2.run(R.threads_with_own_subcomms, 50, timeout=90)
    assert r0 == r1
    for i in range(2):
        assert r0[i] == [2.0 * (k + i) + 1 for k in range(50)]


def test_two_threads_on_one_comm_never_give_wrong_data():
    with World(2, transport="shm", env={"COMMRT_COLL_PROBE_S": "0.5"}, timeout=120) as w:
        r0, r1 = w.run(R.threads_hammer_one_comm, 200, timeout=110)
    for r in (r0, r1):
        assert r["wrong"] == 0, r
        assert set(r["errors"]) <= {"ConcurrentCollectiveError", "CollectiveMismatchError",
                                    "CommTimeoutError", "AbortedError"}, r
