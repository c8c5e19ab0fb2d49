"""The launcher's job secret reaches the ranks through an inherited descriptor and
leaves no file behind under any exit of the launcher, SIGKILL included."""
import os
import signal
import subprocess
import sys
import time

import pytest

PROG = """
import os, sys, time
import commrt
comm = commrt.init()
comm.barrier()
print("RANK", comm.rank, "FD", os.environ.get("COMMRT_SECRET_FD"),
      "FILE", os.environ.get("COMMRT_SECRET_FILE"), flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
comm.close()
"""


def _launch(tmp_path, mode):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    env.pop("COMMRT_SECRET_FILE", None)
    return tmp, subprocess.Popen([sys.executable, "-m", "commrt.launcher", "-n", "2", str(prog),
                                  mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env, start_new_session=True)


def test_ranks_get_the_secret_by_descriptor_and_no_file_is_written(tmp_path):
    tmp, proc = _launch(tmp_path, "exit")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    lines = [ln for ln in out.splitlines() if "RANK" in ln]
    assert len(lines) == 2, out
    for ln in lines:
        assert "FILE None" in ln and "FD None" not in ln, ln
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_secret_file_left_when_the_launcher_is_killed(tmp_path, sig):
    tmp, proc = _launch(tmp_path, "hang")
    deadline = time.monotonic() + 60
    seen = ""
    while time.monotonic() < deadline and seen.count("RANK") < 2:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert seen.count("RANK") == 2, seen
    proc.send_signal(sig)
    proc.wait(30)
    assert os.listdir(tmp) == [], os.listdir(tmp)       # nothing left where the file was
