"""``python -m commrt.bench floor``: the local work of a large all-reduce, measured."""
import re

import numpy as np
import pytest

from commrt.bench import floor
from commrt.testing import World


def _reduce_for_real(comm, nbytes, piece):
    """The floor's all-reduce on inputs that differ by rank: what every rank holds."""
    w = floor.Work(comm, nbytes, piece)
    w.data[:] = np.arange(w.data.size, dtype=np.float32) * (comm.rank + 1)
    comm.barrier()
    w.all_reduce()
    comm.barrier()                  # the others may still read our blocks
    return w.data.copy()


@pytest.mark.timeout(60)
def test_its_reads_and_combines_make_the_all_reduce_itself():
    # 3 ranks, blocks of 1000 floats read in 256-byte pieces (several per block,
    # the last one short): the work timed is the real work, every byte of it
    with World(3, transport="shm", timeout=50) as w:
        got = w.run(_reduce_for_real, 3 * 1000 * 4, 256, timeout=50)
    want = np.arange(3000, dtype=np.float32) * (1 + 2 + 3)
    for data in got:
        np.testing.assert_array_equal(data, want)


@pytest.mark.timeout(90)
def test_it_prints_each_phase_for_each_world(capsys):
    assert floor.main(["--nranks", "2", "--sizes", "64K", "--rounds", "1", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce floor, N = 2" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("size"))
    assert all(f"{ph} µs" in header for ph in floor.PHASES)
    row = next(ln for ln in out.splitlines() if ln.startswith("64 KiB"))
    figures = [float(x) for x in re.findall(r"[\d.]+", row[len("64 KiB"):])]
    assert len(figures) == 3 and all(f > 0 for f in figures), row


@pytest.mark.parametrize("argv", [["--piece", "0"], ["--nranks", "1"], ["--calls", "0"]])
def test_it_refuses_what_it_cannot_measure(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        floor.main(argv)
    assert exc.value.code == 2
    assert "--nranks from 2" in capsys.readouterr().err


def test_a_failed_read_names_the_process_and_the_permission_it_needs():
    buf = np.zeros(4, np.uint8)
    with pytest.raises(OSError, match="process_vm_readv from pid 999999999"):
        floor._read_from(999999999, buf, 4096)
