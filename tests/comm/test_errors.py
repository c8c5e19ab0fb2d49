"""commrt/errors.py: one hierarchy, each error the matching built-in too, and every
error survives pickling with its fields (errors cross process boundaries: test
worlds and the launcher re-raise them)."""
import pickle

import pytest

from commrt import errors as E


@pytest.mark.parametrize("cls,builtin", [
    (E.TransportError, ConnectionError), (E.PeerLostError, ConnectionError),
    (E.AuthError, ConnectionError), (E.CommTimeoutError, TimeoutError),
    (E.MessageTruncatedError, ValueError), (E.CollectiveMismatchError, RuntimeError),
])
def test_every_error_is_a_comm_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, E.CommError) and issubclass(cls, builtin)


def test_fields_and_messages_survive_pickling():
    cases = [
        E.PeerLostError(3, "EOF", op="recv", tag=7),
        E.CommTimeoutError("all_reduce #2", 1, 7, 1.5, detail="rank 0 of 2"),
        E.MessageTruncatedError(32, 8, source=1, tag=7, meta=0x1234),
        E.CollectiveMismatchError("collective mismatch: rank 0 called ..."),
    ]
    for exc in cases:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert back.__dict__ == exc.__dict__
    lost = cases[0]
    assert (lost.rank, lost.op, lost.tag) == (3, "recv", 7)
    assert "lost peer rank 3 during recv (tag 7): EOF" == str(lost)
    t = cases[1]
    assert str(t) == "all_reduce #2 timed out after 1.5 s waiting on rank 1, tag 7: rank 0 of 2"
    assert cases[2].meta == 0x1234 and cases[2].message_bytes == 32


def test_the_engine_accepts_exactly_the_failure_codes():
    """An ABORT off the wire is refused unless its code is a FailureCode (engine.pxi,
    abort_fields_ok): the engine's range and the enum must stay one list."""
    from commrt.transport import _core

    assert list(_core.FAILURE_CODES) == sorted(int(c) for c in E.FailureCode)
    eng = _core.Engine(0, 1)
    try:
        with pytest.raises(ValueError, match="FailureCode"):
            eng.abort(2, [], "x", code=max(E.FailureCode) + 1)
        with pytest.raises(ValueError, match="culprit"):
            eng.abort(2, [], "x", code=1, culprit=1)
    finally:
        eng.close()
