"""An RLIMIT_NOFILE too low for the mesh gives a clear error naming the limit, at
init, instead of EMFILE half-way through connecting."""
import subprocess
import sys

PROG = """
import os, resource
import numpy as np
import commrt
import commrt.transport.connect, commrt.rendezvous.bootstrap, commrt.comm
if os.environ["COMMRT_RANK"] == "0":
    n = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 3, n + 3))
try:
    comm = commrt.init(timeout=30)
except commrt.BootstrapError as exc:
    print("BOOTSTRAP", exc, flush=True)
    raise SystemExit(3)
comm.close()
"""


def test_too_low_rlimit_nofile_is_named(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    res = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "3", str(prog)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    lines = [ln for ln in res.stdout.splitlines() if "BOOTSTRAP" in ln]
    assert lines and "RLIMIT_NOFILE" in lines[0] and "ulimit -n" in lines[0], \
        (res.stdout, res.stderr[-2000:])
