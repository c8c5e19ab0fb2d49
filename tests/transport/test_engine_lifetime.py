"""An Engine never closed, with finished requests still in its live set, is freed
by the garbage collector at interpreter exit: the process must exit cleanly (a
request's dealloc can drop the engine's last reference; the engine must not
sweep that request again)."""
import subprocess
import sys

import pytest

import p2p_ranks as P
from commrt.testing import World

SCRIPT = """
import numpy as np
from commrt.transport._core import Engine
e = Engine(0, 1)
e.start(progress_thread=False)
x = np.ones(2, np.float32)
t = np.empty_like(x)
for _ in range(10):
    e.exchange(x, 0, t, 0, 2, 7, 5, 1.0)
print("done")
"""


def test_unclosed_engine_with_live_requests_exits_cleanly():
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0 and res.stdout.strip() == "done", (res.returncode, res.stderr)
        assert "Traceback" not in res.stderr, res.stderr



@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_requests_freed_by_the_garbage_collector_release_their_buffers(transport):
    """A request in a reference cycle is freed by the garbage collector, which must
    not drop the reference its Py_buffer holds without releasing the export
    (Cython's generated tp_clear did: @cython.no_gc_clear now).  CPython then
    reports "deallocated bytearray object has exported buffers", and a
    memoryview in that state crashes the process."""
    with World(2, transport=transport, timeout=60) as w:
        printed = w.run(P.requests_in_garbage_cycles)
    assert printed == [[], []], printed


@pytest.mark.parametrize("ring, resident", [(None, True), (64 << 20, False)])
def test_shared_memory_segments_are_faulted_in_when_small_enough(ring, resident):
    """A pair's segment is resident from connect time while the host's segments
    fit connect.SHM_POPULATE_BYTES (no message pays its ring page's first touch);
    beyond it (64 MiB rings) pages come as the rings fill."""
    env = {} if ring is None else {"COMMRT_SHM_RING_BYTES": str(ring)}
    with World(2, transport="shm", env=env, timeout=60) as w:
        segs = w.run(P.shm_segments_resident)
    for rank_segs in segs:
        assert len(rank_segs) == 1, segs
        size, rss = rank_segs[0]
        assert (rss == size) if resident else (rss < size // 2), segs
