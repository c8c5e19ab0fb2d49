"""Fixtures of the launcher tests (helpers live in launch_helpers.py)."""
import os
import textwrap

import pytest


@pytest.fixture
def script(tmp_path):
    """script(text) -> path of a rank program; PIDS is the directory where
    ``record_pid()`` leaves each rank's pid."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    header = textwrap.dedent(f"""\
        import os, sys, time
        RANK = int(os.environ["COMMRT_RANK"])
        SIZE = int(os.environ["COMMRT_WORLD_SIZE"])
        PIDS = {str(pid_dir)!r}
        def record_pid():
            with open(os.path.join(PIDS, str(RANK)), "w") as f:
                f.write(str(os.getpid()))
        """)

    def write(text, name="prog.py"):
        path = tmp_path / name
        path.write_text(header + textwrap.dedent(text))
        return str(path)

    write.pid_dir = pid_dir
    return write


@pytest.fixture
def shm_snapshot():
    """No commrt shared-memory name may be left in /dev/shm (other processes
    on the machine may create their own names meanwhile: only ours count)."""
    def ours():
        return {n for n in os.listdir("/dev/shm") if "commrt" in n.lower()}
    before = ours()
    yield
    assert ours() <= before, f"left in /dev/shm: {sorted(ours() - before)}"


