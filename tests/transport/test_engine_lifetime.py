"""An Engine never closed, with finished requests still in its live set, is freed
by the garbage collector at interpreter exit: the process must exit cleanly (a
request's dealloc can drop the engine's last reference; the engine must not
sweep that request again)."""
import subprocess
import sys

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
