"""What start-up needs and costs (docs/launcher.md "Start-up time"): commrt.init()
and a barrier import no NumPy, and the launch benchmark can tell stale bytecode."""
import os
import py_compile

from commrt.bench import launch as bench_launch
from launch_helpers import clean_env, launch


def test_init_imports_no_numpy(script):
    """NumPy costs a rank ~50 ms of CPU to import and ~13 ms to tear down; the
    bootstrap, the mesh and the Communicator need none of it."""
    prog = script("""
        import commrt
        comm = commrt.init()
        print("numpy" in sys.modules, comm.size)
        comm.close()
        """)
    out = launch(["-n", "3", prog], env=clean_env(COMMRT_TIMEOUT="30"), timeout=90)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"[{r}] False 3" for r in range(3)]


def test_a_barrier_imports_no_numpy_and_arrays_work_after(script):
    """The collectives load NumPy at their first call with data, not at import
    nor for a barrier (planned or not, on 2 and 4 ranks); a NumPy imported
    afterwards by the program is the one they use, fast paths included."""
    prog = script("""
        import commrt
        comm = commrt.init()
        comm.barrier()                      # the general path, then its plan
        comm.barrier()
        comm.barrier(timeout=30)            # the general path once more
        before = "numpy" in sys.modules
        import numpy as np
        import commrt.collectives as coll
        x = np.full(3, comm.rank + 1.0)
        for _ in range(3):                  # general path, plan, planned fast path
            y = x.copy()
            comm.all_reduce(y)
            assert (y == sum(range(1, comm.size + 1))).all(), y
        print(before, coll._ndarray is np.ndarray, comm.size)
        comm.close()
        """)
    for n in (2, 4):
        out = launch(["-n", str(n), prog], env=clean_env(COMMRT_TIMEOUT="30"), timeout=90)
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.splitlines()) == [f"[{r}] False True {n}" for r in range(n)]


def test_fresh_bytecode_is_told_from_stale(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("x = 1\n")
    assert not bench_launch._fresh_bytecode(str(source))       # none written yet
    py_compile.compile(str(source))
    assert bench_launch._fresh_bytecode(str(source))
    source.write_text("x = 12\n")                                # another size
    stat = source.stat()
    os.utime(source, (stat.st_atime, stat.st_mtime + 5))
    assert not bench_launch._fresh_bytecode(str(source))
