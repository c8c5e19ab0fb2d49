"""commrt-launch's command line, environment and output, on one host."""
import os
import socket
import subprocess
import sys

import pytest

from commrt.launcher import hosts
from launch_helpers import LAUNCH, clean_env, launch


def test_help_documents_every_option():
    out = launch(["--help"])
    assert out.returncode == 0
    for option in ("-n", "-m", "--hosts", "--hostfile", "--ssh-cmd", "--timeout", "--no-prefix",
                   "--log-dir", "--env", "--bind", "COMMRT_RANK", "OMP_NUM_THREADS", "-np", "-H",
                   "--nproc-per-node", "--standalone", "--max-restarts", "--start-timeout",
                   "--check-build", "--tag-output", "--timestamp-output", "--output-filename",
                   "--ssh-port", "--ssh-identity-file", "--network-interface", "HOROVOD_RANK",
                   "TORCHELASTIC_RESTART_COUNT", "PROGRAM is read"):
        assert option in out.stdout


@pytest.mark.parametrize("args, message", [
    (["-n", "2"], "no program to run"),
    (["-n", "0", "x.py"], "expected a positive integer"),
    (["x.py"], "how many ranks?"),
    (["-n", "2", "nosuch.py"], "'nosuch.py': no such file"),
    (["-n", "3", "--hosts", "a:1,b:1", "x.py"], "-n 3 ranks but the hosts have only 2 slots"),
    (["-n", "1", "--hosts", "a:zero", "x.py"], "slots must be a positive integer"),
    (["-n", "1", "--env", "NOEQUALS", "x.py"], "expected NAME=VALUE"),
    (["-n", "1", "--timeout", "-1", "x.py"], "positive number of seconds"),
])
def test_usage_errors_exit_2_with_a_clear_message(args, message):
    out = launch(args)
    assert out.returncode == 2
    assert message in out.stderr


def test_arguments_are_passed_untouched(script):
    prog = script("""
        import json
        print(json.dumps(sys.argv[1:]))
        """)
    args = ["a b", "", "-n", "5", "--", "$HOME", "'q'", '"dq"', "ünï", "--timeout=3", "*"]
    out = launch(["-n", "2", prog] + args)
    assert out.returncode == 0, out.stderr
    import json
    lines = sorted(out.stdout.splitlines())
    assert [json.loads(line.split(" ", 1)[1]) for line in lines] == [args, args]


def test_module_mode(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys\nprint('module', os.environ['COMMRT_RANK'], sys.argv[1:])\n")
    out = launch(["-n", "2", "-m", "mypkg.hello", "--flag", "x"], cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["[0] module 0 ['--flag', 'x']",
                                               "[1] module 1 ['--flag', 'x']"]


def test_rank_environment(script):
    prog = script("""
        keys = ["COMMRT_RANK", "COMMRT_WORLD_SIZE", "COMMRT_LOCAL_RANK", "COMMRT_LOCAL_WORLD_SIZE",
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
                "EXTRA", "COMMRT_STORE_ADDR"]
        print(" ".join(os.environ.get(k, "-") for k in keys))
        # the secret comes in an inherited descriptor, never a file or the environment
        fd = int(os.environ["COMMRT_SECRET_FD"])
        os.fstat(fd)
        assert "COMMRT_SECRET_FILE" not in os.environ and "COMMRT_SECRET" not in os.environ
        print("secret", fd)
        """)
    cores = len(os.sched_getaffinity(0))
    out = launch(["-n", "3", "--env", "EXTRA=a=b", prog],
                 env=clean_env(COMMRT_SECRET="ff" * 32))
    assert out.returncode == 0, out.stderr
    rows = sorted(line.split()[1:] for line in out.stdout.splitlines() if "secret" not in line)
    for rank, row in enumerate(rows):
        assert row[:8] == [str(rank), "3", str(rank), "3", str(rank), "3", str(rank), "3"]
        assert row[8] == str(max(1, cores // 3)) and row[9] == "a=b"
        assert row[10].startswith("127.0.0.1:")
    fds = [line.split()[-1] for line in out.stdout.splitlines() if "secret" in line]
    assert len(fds) == 3 and all(fd.isdigit() for fd in fds), out.stdout
    assert "ff" * 32 not in subprocess.list2cmdline(LAUNCH)     # nor on a command line


def test_user_omp_num_threads_is_kept(script):
    prog = script('print(os.environ["OMP_NUM_THREADS"])\n')
    out = launch(["-n", "2", prog], env=clean_env(OMP_NUM_THREADS="7"))
    assert sorted(out.stdout.split()) == ["7", "7", "[0]", "[1]"]


def test_no_python_runs_an_executable():
    out = launch(["-n", "2", "--no-python", "sh", "-c", 'echo "sh rank $COMMRT_RANK"'])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["[0] sh rank 0", "[1] sh rank 1"]


def test_missing_program_fails_cleanly():
    out = launch(["-n", "2", "--no-python", "/nonexistent/program"])
    assert out.returncode == 1
    assert "cannot start rank 0" in out.stderr


def test_output_whole_lines_with_long_and_partial_lines(script):
    prog = script("""
        out = sys.stdout
        if RANK == 0:
            # a 1 MiB line written in 4 KiB pieces, flushed separately, interleaved in time
            # with the other ranks' chatter
            for i in range(256):
                out.write(("x" * 4095) + ("|" if i < 255 else "\\n"))
                out.flush()
                if i % 64 == 0:
                    time.sleep(0.01)
        else:
            for i in range(300):
                out.write(f"short {RANK} {i}\\n")
                out.write("half-")
                out.flush()
                out.write("line\\n")
                out.flush()
        out.write("no newline at exit")
        out.flush()
        sys.stderr.write("err partial")
        """)
    out = launch(["-n", "3", prog])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    for line in lines:
        assert line[:4] in ("[0] ", "[1] ", "[2] "), line[:50]
    long_line = [line for line in lines if line.startswith("[0] xxx")]
    assert len(long_line) == 1 and long_line[0] == "[0] " + "|".join(["x" * 4095] * 256)
    for r in (1, 2):
        assert sum(line == f"[{r}] half-line" for line in lines) == 300
        assert sum(line.startswith(f"[{r}] short {r} ") for line in lines) == 300
        assert f"[{r}] no newline at exit" in lines
    assert sorted(out.stderr.splitlines()) == ["[0] err partial", "[1] err partial",
                                               "[2] err partial"]


def test_no_prefix_and_log_dir(script, tmp_path):
    prog = script("""
        print("out of", RANK)
        print("err of", RANK, file=sys.stderr)
        """)
    logs = tmp_path / "logs"
    out = launch(["-n", "2", "--no-prefix", "--log-dir", str(logs), prog])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["out of 0", "out of 1"]
    assert sorted(os.listdir(logs)) == ["rank.0.log", "rank.1.log"]
    assert sorted((logs / "rank.1.log").read_text().splitlines()) == ["err of 1", "out of 1"]


def test_busy_store_port_falls_back_on_one_host(script):
    prog = script('print("ran", os.environ["COMMRT_STORE_ADDR"])\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = launch(["-n", "2", "--store-port", str(port), prog])
    assert out.returncode == 0, out.stderr
    assert f"store port {port} is busy" in out.stderr
    assert all(not line.endswith(f":{port}") for line in out.stdout.splitlines())


def test_python_m_and_console_script_agree():
    out = subprocess.run([sys.executable, "-c", "from commrt.launcher.cli import main; "
                          "raise SystemExit(main(['-n', '1', '--no-python', 'true']))"],
                         capture_output=True, text=True, timeout=30, env=clean_env())
    assert out.returncode == 0, out.stderr


# -- host lists -----------------------------------------------------------------

def test_parse_hosts_and_placement():
    hs = hosts.parse_hosts("a:2,b,c:3,a:1")
    assert hs == [hosts.Host("a", 3), hosts.Host("b", 1), hosts.Host("c", 3)]
    placed = hosts.place(5, hs)
    assert [(p.rank, p.host, p.local_rank, p.local_size) for p in placed] == [
        (0, "a", 0, 3), (1, "a", 1, 3), (2, "a", 2, 3), (3, "b", 0, 1), (4, "c", 0, 1)]


def test_parse_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\nnode2:2  # two\n\nnode3\n")
    assert hosts.parse_hostfile(str(path)) == [hosts.Host("node1", 4), hosts.Host("node2", 2),
                                               hosts.Host("node3", 1)]
    path.write_text("node1 slots=x\n")
    with pytest.raises(hosts.HostSpecError, match="line 1"):
        hosts.parse_hostfile(str(path))
    with pytest.raises(hosts.HostSpecError, match="names no host"):
        path.write_text("# nothing\n")
        hosts.parse_hostfile(str(path))


def test_launcher_never_imports_numpy_or_numba():
    """Ranks are forked from the launcher: it must hold no numba/numpy threads,
    and stay quick to start."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "commrt.launcher", "-n", "2",
                          "--no-python", "true"], capture_output=True, text=True, timeout=30,
                         env=clean_env())
    assert out.returncode == 0, out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "commrt.launcher.job" in imported
    assert not {m for m in imported if m.split(".")[0] in ("numpy", "numba", "cupy")}


def test_verbose_reports_the_store():
    out = launch(["-n", "2", "-v", "--no-python", "true"])
    assert out.returncode == 0
    assert "commrt-launch: store at 127.0.0.1:" in out.stderr and "2 ranks on localhost" in out.stderr


def test_carriage_returns_pass_through_prefixed_as_they_come():
    """A progress bar redraws its line with \\r: each redraw is shown at once, prefixed."""
    import io

    from commrt.launcher.output import OutputRouter

    out, err = io.BytesIO(), io.BytesIO()
    router = OutputRouter(prefix=True, out=out, err=err)
    router.add_rank(2)
    router.feed(2, 0, b"10%\r")
    assert out.getvalue() == b""                 # could still be the first half of \r\n
    router.feed(2, 0, b"50%\r100%\r\nnext")
    assert out.getvalue() == b"[2] 10%\r[2] 50%\r[2] 100%\r\n"
    router.finish(2, 0)
    assert out.getvalue().endswith(b"[2] next\n")
