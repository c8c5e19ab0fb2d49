"""What start-up needs and costs (docs/launcher.md "Start-up time"): commrt.init()
imports no NumPy, and the launch benchmark can tell stale bytecode."""
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
