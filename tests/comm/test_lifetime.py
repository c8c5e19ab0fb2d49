"""Lifetime: after close() every operation raises CommError('... closed') (it used to
kill the process with SIGSEGV); requests pending at close fail with it."""
import subprocess
import sys

import pytest

from commrt.testing import World

import comm_ranks as R


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_operation_after_close_raises_closed(transport):
    with World(2, transport=transport, timeout=60) as w:
        res = w.run(R.use_after_close, timeout=50)
    for rank, out in enumerate(res):
        for op, what in out.items():
            assert "closed" in what and "Error" not in what.split(":")[0], (rank, op, what)
        assert "pending" in out["wait_pending"], out["wait_pending"]


def test_closing_a_subcommunicator_leaves_the_world_open():
    with World(2, timeout=60) as w:
        res = w.run(R.subcomm_close_leaves_world, timeout=50)
    for errs, value in res:
        assert value == 2.0
        for op, msg in errs.items():
            assert msg is not None and "closed" in msg, (op, msg)


SCRIPT = """
import numpy as np
from commrt.transport._core import Engine
e = Engine(0, 1)
e.start(progress_thread=True)
e.close()
for f in (lambda: e.send(np.ones(1), 0), lambda: e.irecv(np.ones(1)), e.stats, e.pending,
          e.memory_info, lambda: e.abort(0, [0], 'x'), e.progress, lambda: e.peer_kind(0)):
    try:
        f()
        print("no error")
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_engine_methods_after_close_raise():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 8 and all(ln == "CommError the communicator is closed" for ln in lines), \
        res.stdout


WITH_BLOCK = """
import commrt, numpy as np
with commrt.init() as comm:
    comm.all_reduce(np.ones(2))
try:
    comm.all_reduce(np.ones(2))
except commrt.CommError as exc:
    print("raised:", exc)
"""


def test_call_after_with_block_raises(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(WITH_BLOCK)
    res = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "2", str(script)],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("raised:") == 2 and "closed" in res.stdout, res.stdout


GENERATIONS = """
import commrt, numpy as np
for gen in (None, 7, None):          # counted, given, counted again (8: after the given one)
    with commrt.init(generation=gen) as comm:
        x = np.ones(2)
        comm.all_reduce(x)
        print("mesh", gen, x.tolist())
for bad in (-1, "1", True):
    try:
        commrt.init(generation=bad)
    except ValueError as exc:
        print("refused:", exc)
"""


def test_init_generation_names_the_mesh_and_rejects_bad_values(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(GENERATIONS)
    res = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", "2", "--no-prefix",
                          str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for gen in ("None", "7"):
        assert res.stdout.count(f"mesh {gen} [2.0, 2.0]") == (4 if gen == "None" else 2), \
            res.stdout
    assert res.stdout.count("refused: generation must be a non-negative int") == 6, res.stdout
