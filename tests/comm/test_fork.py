"""Fork safety: commrt's descriptors are close-on-exec and closed in forked
children, so a data-loader worker neither hides its rank's death from the peers
(EOF-based detection) nor touches its parent's engine."""
import os
import subprocess
import sys
import time

import pytest

from commrt.testing import World

import comm_ranks as R


@pytest.mark.parametrize("transport", ["shm", pytest.param("tcp", marks=pytest.mark.long)])
def test_forked_dataloader_workers_do_not_hide_a_killed_rank(transport):
    pytest.importorskip("torch")
    w = World(2, transport=transport, timeout=60).start()
    try:
        for conn in w._conns:
            conn.send((R.forked_loader_then_peer_killed, (), {}))
        kind, value = w._receive(0, time.monotonic() + 60)
        assert kind == "ok", value
    finally:
        for pid in w.pids[1:]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        w.close()
    seen, got, took = value
    assert seen == ["closed", "closed"], seen      # the workers cannot use the parent's engine
    assert got == ("PeerLostError", 1), got
    assert took < 10, took


CHILD_FDS = """
import os, sys, numpy as np
import commrt
comm = commrt.init()
comm.barrier()
mine = set(int(f) for f in os.listdir('/proc/self/fd'))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    kept = [f for f in map(int, os.listdir('/proc/self/fd')) if f in mine and f > 2]
    links = []
    for f in kept:
        try:
            links.append(os.readlink(f'/proc/self/fd/{f}'))
        except OSError:
            pass
    os.write(w, repr(links).encode())
    os._exit(0)
os.close(w)
data = os.read(r, 65536).decode()
os.waitpid(pid, 0)
comm.barrier()
comm.close()
print("CHILD", data)
# and every descriptor commrt holds is close-on-exec
"""


def test_forked_child_holds_no_channel_descriptor(tmp_path):
    """After fork the child has closed its copies of every socket, eventfd,
    epoll set and memfd of commrt (the parent's stay open)."""
    prog = tmp_path / "prog.py"
    prog.write_text(CHILD_FDS)
    res = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "2", str(prog)],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "CHILD" in ln]
    assert len(lines) == 2, res.stdout
    for ln in lines:
        links = eval(ln.split("CHILD", 1)[1].strip())
        bad = [x for x in links if x.startswith(("socket:", "anon_inode:", "/memfd:"))]
        assert not bad, ln
