"""commrt-launch speaks horovodrun's, mpirun's and torchrun's command lines:
every option of docs/launcher.md "Other launchers' options", with real launches
of small programs (each bounded by launch()'s timeout)."""
import importlib.util
import os
import re
import stat
import sys

import pytest

from commrt.launcher import cli
from launch_helpers import clean_env, launch

# "ssh HOST CMD..." that runs CMD here (as test_multihost's stand-in)
FAKE_SSH = "sh -c 'shift; exec \"$@\"' fake-ssh"

SHOW_ENV = "import os, sys; print(' '.join(os.environ.get(k, '-') for k in sys.argv[1:]))"


def _rows(out):
    """stdout lines '[k] a b c' -> {k: ['a', 'b', 'c']}."""
    rows = {}
    for line in out.stdout.splitlines():
        m = re.fullmatch(r"\[(\d+)\] ?(.*)", line)
        assert m, line
        rows[int(m.group(1))] = m.group(2).split()
    return rows


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# -- the number of ranks and where they go -----------------------------------------

@pytest.mark.parametrize("count", [["-np", "3"], ["--num-proc", "3"], ["-n3"], ["--nprocs=3"]])
def test_number_of_ranks_spellings(count):
    out = launch(count + [sys.executable, "-c", SHOW_ENV, "COMMRT_WORLD_SIZE", "HOROVOD_SIZE"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {r: ["3", "3"] for r in range(3)}


def test_hosts_without_n_give_the_sum_of_slots():
    out = launch(["-H", "localhost:2,127.0.0.1:1", sys.executable, "-c", SHOW_ENV,
                  "COMMRT_WORLD_SIZE", "COMMRT_HOST_ID", "COMMRT_LOCAL_WORLD_SIZE"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {0: ["3", "localhost", "2"], 1: ["3", "localhost", "2"],
                          2: ["3", "127.0.0.1", "1"]}


def test_the_command_line_of_the_issue_now_runs():
    """`-H localhost:2 -n 2` once answered 'the following arguments are required'."""
    out = launch(["-H", "localhost:2", "-n", "2", "--no-python", "true"])
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("text", ["localhost slots=2\n", "# horovodrun's\nlocalhost\nlocalhost\n",
                                  "localhost:2\n"])
def test_hostfile_forms_without_n(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    out = launch(["--hostfile", str(path), sys.executable, "-c", SHOW_ENV, "COMMRT_WORLD_SIZE"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {0: ["2"], 1: ["2"]}


def test_torchrun_nproc_per_node_and_standalone():
    out = launch(["--standalone", "--nproc-per-node", "3", sys.executable, "-c", SHOW_ENV,
                  "WORLD_SIZE", "LOCAL_WORLD_SIZE"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {r: ["3", "3"] for r in range(3)}
    out = launch(["--nproc_per_node=2", "-H", "h1,h2", "--ssh-cmd", FAKE_SSH, "--bind",
                  "127.0.0.1", sys.executable, "-c", SHOW_ENV, "COMMRT_HOST_ID",
                  "COMMRT_WORLD_SIZE"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {0: ["h1", "4"], 1: ["h1", "4"], 2: ["h2", "4"], 3: ["h2", "4"]}


@pytest.mark.parametrize("args, message", [
    (["-X", "x.py"], "unknown option -X"),
    (["-n", "2", "--nprocz", "2", "x.py"], "unknown option --nprocz"),
    (["-n", "2", "-mv", "x"], "unknown option -mv"),
    (["--standalone", "-H", "elsewhere:2", "x.py"], "--standalone runs on this host only"),
    (["-n", "2", "nosuch-command-xyz", "a"], "'nosuch-command-xyz' is neither a .py file "
                                             "nor a command on PATH"),
    (["-n", "1", "-m", "--no-python", "x"], "-m and --no-python do not go together"),
    (["-n", "1", "-p", "22", "--ssh-cmd", "ip netns exec", "true"], "need ssh"),
    (["-n", "1", "--ssh-identity-file", "/nonexistent/key", "true"], "no such file"),
    (["-n", "1", "-x", "COMMRT_TEST_UNSET_VARIABLE", "true"], "is not set"),
    (["-n", "1", "--max-restarts", "-1", "true"], "expected a count"),
    (["-n", "1", "--start-timeout", "0", "true"], "positive number of seconds"),
    (["-n", "1", "--tag-output", "--no-prefix", "true"], "do not go together"),
])
def test_usage_errors_name_what_is_wrong(args, message):
    out = launch(args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr


def test_split_command_line():
    parser = cli.build_parser()
    split = cli.split_command_line
    assert split(parser, ["-np", "2", "python", "-n", "5"]) == (["-np", "2"], ["python", "-n", "5"])
    assert split(parser, ["-n4", "--env=A=1", "-m", "pkg.mod", "--x"]) == (
        ["-n4", "--env=A=1", "-m"], ["pkg.mod", "--x"])
    assert split(parser, ["-H", "a:1", "--", "-weird-name"]) == (["-H", "a:1"], ["-weird-name"])
    assert split(parser, ["--check-build"]) == (["--check-build"], [])


# -- PROGRAM -------------------------------------------------------------------------

def test_program_resolution_order(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _executable(bindir / "python", '#!/bin/sh\necho "python on PATH:" "$@"\n')
    script = tmp_path / "prog.py"
    script.write_text("import sys; print('interpreter', sys.executable, sys.argv[1:])\n")
    env = clean_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    # a command: `python prog.py` runs the python found on PATH, as mpirun would
    out = launch(["-n", "2", "python", str(script), "a"], env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {r: ["python", "on", "PATH:", str(script), "a"] for r in range(2)}
    # a .py file: run with the launcher's own Python
    out = launch(["-n", "2", "prog.py", "a"], env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {r: ["interpreter", sys.executable, "['a']"] for r in range(2)}
    # an executable with a path, and bash -c
    tool = _executable(tmp_path / "tool", '#!/bin/sh\necho tool "$COMMRT_RANK"\n')
    out = launch(["-n", "2", tool], env=env)
    assert _rows(out) == {0: ["tool", "0"], 1: ["tool", "1"]}, out.stderr
    out = launch(["-n", "2", "bash", "-c", 'echo "bash $HOROVOD_RANK of $HOROVOD_SIZE"'], env=env)
    assert _rows(out) == {0: ["bash", "0", "of", "2"], 1: ["bash", "1", "of", "2"]}, out.stderr


def test_pytest_as_program(tmp_path):
    test = tmp_path / "test_rank.py"
    test.write_text("import os\ndef test_rank():\n    assert int(os.environ['COMMRT_RANK']) < 2\n")
    out = launch(["-n", "2", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                 cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sum("1 passed" in line for line in out.stdout.splitlines()) == 2


# -- what ranks get -------------------------------------------------------------------

def test_horovod_variables_with_uneven_hosts():
    keys = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
            "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME"]
    out = launch(["-H", "h1:2,h2:1", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1",
                  sys.executable, "-c", SHOW_ENV] + keys)
    assert out.returncode == 0, out.stderr
    # the cross communicator groups the ranks of one local rank: h1 and h2 have a
    # local rank 0, only h1 a local rank 1
    assert _rows(out) == {0: ["0", "3", "0", "2", "0", "2", "h1"],
                          1: ["1", "3", "1", "2", "0", "1", "h1"],
                          2: ["2", "3", "0", "1", "1", "2", "h2"]}


def test_network_interface_and_x_reach_the_ranks():
    out = launch(["-n", "2", "--network-interface", "lo,eth", "-x", "FROM_SHELL", "-x", "SET=v",
                  sys.executable, "-c", SHOW_ENV, "COMMRT_IFNAME", "FROM_SHELL", "SET"],
                 env=clean_env(FROM_SHELL="shell"))
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {r: ["lo,eth", "shell", "v"] for r in range(2)}


def test_ssh_port_and_identity_file(tmp_path):
    """-p and --ssh-identity-file reach ssh (a stand-in on PATH that records its
    arguments, then runs the command here)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    _executable(bindir / "ssh", f"""#!/bin/sh
echo "$@" >> {calls}
while [ "${{1#-}}" != "$1" ]; do shift 2; done   # options, each with its value
shift                                             # the host
exec "$@"
""")
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    env = clean_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    out = launch(["-np", "2", "-H", "h1,h2", "-p", "2222", "--ssh-identity-file", str(key),
                  "--bind", "127.0.0.1", sys.executable, "-c", SHOW_ENV, "COMMRT_HOST_ID"],
                 env=env)
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {0: ["h1"], 1: ["h2"]}
    lines = sorted(calls.read_text().splitlines())
    assert [line.split()[:5] for line in lines] == [
        ["-p", "2222", "-i", str(key), "h1"], ["-p", "2222", "-i", str(key), "h2"]]


# -- output -----------------------------------------------------------------------------

PRINTER = "import sys; print('out'); print('err', file=sys.stderr)"


def test_tag_and_timestamp_output():
    out = launch(["-n", "2", "--tag-output", sys.executable, "-c", PRINTER])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["[1,0]<stdout>:out", "[1,1]<stdout>:out"]
    assert sorted(out.stderr.splitlines()) == ["[1,0]<stderr>:err", "[1,1]<stderr>:err"]
    out = launch(["-n", "2", "--timestamp-output", "--tag-output", sys.executable, "-c", PRINTER])
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} "
    assert all(re.fullmatch(stamp + r"\[1,[01]\]<stdout>:out", line)
               for line in out.stdout.splitlines()), out.stdout
    out = launch(["-n", "1", "--timestamp-output", sys.executable, "-c", PRINTER])
    assert re.fullmatch(stamp + r"\[0\] out\n", out.stdout), out.stdout


@pytest.mark.parametrize("nocopy", [False, True])
def test_output_filename(tmp_path, nocopy):
    where = tmp_path / "out"
    arg = str(where) + (":nocopy" if nocopy else "")
    out = launch(["-n", "2", "--output-filename", arg, sys.executable, "-c", PRINTER])
    assert out.returncode == 0, out.stderr
    for r in range(2):
        assert (where / "1" / f"rank.{r}" / "stdout").read_text() == "out\n"
        assert (where / "1" / f"rank.{r}" / "stderr").read_text() == "err\n"
    assert sorted(out.stdout.splitlines()) == ([] if nocopy else ["[0] out", "[1] out"])


# -- restarts and the start timeout ---------------------------------------------------------

def test_max_restarts_restarts_the_whole_job(script, tmp_path):
    """Rank 1 fails in the first two attempts; the third runs a real commrt job
    (a fresh store and secret) to its end."""
    prog = script("""
        count = os.environ["TORCHELASTIC_RESTART_COUNT"]
        assert count == os.environ["COMMRT_RESTART_COUNT"]
        print("attempt", count, os.environ["TORCHELASTIC_MAX_RESTARTS"])
        if RANK == 1 and int(count) < 2:
            sys.exit(3)
        import commrt
        comm = commrt.init()
        comm.barrier()
        print("done", count)
        comm.close()
        """)
    logs = tmp_path / "logs"
    out = launch(["-n", "2", "--max-restarts", "2", "--log-dir", str(logs), prog],
                 env=clean_env(COMMRT_TIMEOUT="30"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("exited with code 3") == 2
    assert "restart 1 of 2" in out.stderr and "restart 2 of 2" in out.stderr
    assert sorted(line for line in out.stdout.splitlines() if "done" in line) == [
        "[0] done 2", "[1] done 2"]
    assert (logs / "rank.1.log").read_text().splitlines() == [
        "attempt 0 2", "attempt 1 2", "attempt 2 2", "done 2"]


def test_max_restarts_gives_up_with_the_failure(script):
    prog = script("""
        print("attempt", os.environ["COMMRT_RESTART_COUNT"])
        sys.exit(5 if RANK == 0 else 0)
        """)
    out = launch(["-n", "2", "--max-restarts", "1", prog])
    assert out.returncode == 5
    assert sorted(line for line in out.stdout.splitlines() if line.startswith("[0]")) == [
        "[0] attempt 0", "[0] attempt 1"]
    assert "restart 1 of 1" in out.stderr and "restart 2" not in out.stderr


def test_no_restart_without_failure_or_on_timeout(script):
    prog = script("""
        print("attempt", os.environ["COMMRT_RESTART_COUNT"])
        time.sleep(30)
        """)
    out = launch(["-n", "1", "--max-restarts", "3", "--timeout", "1", prog])
    assert out.returncode == 124
    assert out.stdout.splitlines() == ["[0] attempt 0"]


def test_start_timeout_names_the_rank_that_never_started(script):
    prog = script("""
        record_pid()
        if RANK == 1:
            time.sleep(60)          # never reaches commrt.init()
        import commrt
        commrt.init()
        """)
    out = launch(["-n", "2", "--start-timeout", "3", prog], env=clean_env(COMMRT_TIMEOUT="60"))
    assert out.returncode == 124, out.stderr
    assert "rank(s) 1 did not reach the store within --start-timeout 3 s" in out.stderr


def test_start_timeout_passes_a_job_that_starts(script):
    prog = script("""
        import commrt
        comm = commrt.init()
        comm.barrier()
        time.sleep(2)               # running past the start timeout is fine
        comm.close()
        print("ok")
        """)
    out = launch(["-n", "2", "--start-timeout", "1.5", prog], env=clean_env(COMMRT_TIMEOUT="30"),
                 timeout=90)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["[0] ok", "[1] ok"]


# -- --check-build ------------------------------------------------------------------------

def test_check_build_prints_and_exits():
    out = launch(["--check-build"])
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for heading in ("Available Frameworks:", "Available Controllers:",
                    "Available Tensor Operations:"):
        assert heading in text
    assert "    [X] Gloo" in text and "    [ ] NCCL" in text and "    [ ] MPI" in text
    assert "[X] compiled transport core" in text
    found = importlib.util.find_spec
    framework = found("torch") is not None and found("commrt.horovod") is not None
    assert f"    [{'X' if framework else ' '}] PyTorch" in text


# -- mpirun's usual flags ---------------------------------------------------------------

def test_mpirun_flags_with_their_effect_there():
    out = launch(["-np", "2", "--allow-run-as-root", "--oversubscribe", "-bind-to", "none",
                  "-map-by", "slot", "-x", "A=1", sys.executable, "-c", SHOW_ENV, "A"])
    assert out.returncode == 0, out.stderr
    assert _rows(out) == {0: ["1"], 1: ["1"]}
    out = launch(["-np", "2", "--bind-to", "socket", "true"])
    assert out.returncode == 2 and "invalid choice: 'socket'" in out.stderr


SHOW_CORES = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"


def _cores_of(out):
    return {k: [int(c) for c in v[0].split(",")] for k, v in _rows(out).items()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding two ranks needs two cores")
@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote shim"])
def test_bind_to_core_gives_each_rank_its_own_block_of_cores(remote):
    """Each rank of a host gets cores // ranks of the launcher's cores, blocks in
    local-rank order, none shared; unbound (the default) each has them all."""
    mine = sorted(os.sched_getaffinity(0))
    # two "hosts" reached through the fake ssh: every rank starts through the remote
    # shim (launcher/remote.py), which binds it on its host
    hosts = ["-H", "h1:2,h2:2", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1"] if remote else []
    n = 4 if remote else 2
    out = launch(["-np", str(n), *hosts, "--bind-to", "core", sys.executable, "-c", SHOW_CORES])
    assert out.returncode == 0, out.stderr
    width = len(mine) // 2
    blocks = _cores_of(out)
    for k in range(n):
        assert blocks[k] == mine[(k % 2) * width:(k % 2 + 1) * width], (k, blocks)
    out = launch(["-np", "2", sys.executable, "-c", SHOW_CORES])
    assert out.returncode == 0, out.stderr
    assert _cores_of(out) == {0: mine, 1: mine}


def test_bind_to_core_refuses_more_ranks_than_cores():
    n = len(os.sched_getaffinity(0)) + 1
    out = launch(["-np", str(n), "--bind-to", "core", "true"])
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert f"--bind-to core: {n} ranks on this host but {n - 1} cores" in out.stderr
    assert "--bind-to none" in out.stderr
    # a remote host's shim refuses its own ranks, and the job fails
    out = launch(["-np", str(n), "-H", f"h1:{n}", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1",
                  "--bind-to", "core", "true"])
    assert out.returncode != 0
    assert f"commrt.launcher.remote: --bind-to core: {n} ranks on this host" in out.stderr
    out = launch(["-np", "2", "--elastic", "--min-np", "1", "--host-discovery-script", "true",
                  "--bind-to", "core", "true"])
    assert out.returncode == 2 and "leave it out with --elastic" in out.stderr


def test_network_interface_that_is_not_here_stops_a_multi_host_job():
    out = launch(["-np", "2", "-H", "h1,h2", "--ssh-cmd", FAKE_SSH,
                  "--network-interface", "nosuchif0", "true"])
    assert out.returncode == 1
    assert "--network-interface: COMMRT_IFNAME='nosuchif0': no interface" in out.stderr


# a 4 MiB tensor's mapping: whether the kernel may put it on huge pages
TENSOR_PAGES = """
import torch
t = torch.ones(1 << 20)
at = t.data_ptr()
lines = open("/proc/self/smaps").read().splitlines()
inside = False
for line in lines:
    head = line.split()
    if head and "-" in head[0] and len(head) >= 5:
        lo, hi = (int(x, 16) for x in head[0].split("-"))
        inside = lo <= at < hi
    elif inside and line.startswith("THPeligible:"):
        print(head[1])
"""


@pytest.mark.parametrize("remote", [False, True])
def test_pytorch_tensors_on_huge_pages_unless_the_user_says_otherwise(remote, thp_mode):
    """Every rank gets THP_MEM_ALLOC_ENABLE=1 (PyTorch's allocator then advises
    huge pages for tensors of 2 MiB or more: the kernel's single-copy reads run
    ~3x faster over them); a value the user set is kept, also across ssh."""
    pytest.importorskip("torch")
    where = (["-H", "h1,h2", "--ssh-cmd", FAKE_SSH, "--bind", "127.0.0.1"] if remote
             else ["-n", "2"])
    env = clean_env()
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    shown = launch(where + [sys.executable, "-c", SHOW_ENV, "THP_MEM_ALLOC_ENABLE"], env=env)
    assert shown.returncode == 0, shown.stderr
    assert _rows(shown) == {0: ["1"], 1: ["1"]}
    kept = launch(where + [sys.executable, "-c", SHOW_ENV, "THP_MEM_ALLOC_ENABLE"],
                  env=clean_env(THP_MEM_ALLOC_ENABLE="0"))
    assert _rows(kept) == {0: ["0"], 1: ["0"]}
    # and PyTorch acts on it: the tensor's mapping is advised (THP "madvise"
    # makes only advised mappings eligible; "always" makes every one)
    for value, want in ((None, thp_mode != "never"), ("0", thp_mode == "always")):
        run_env = dict(env) if value is None else clean_env(THP_MEM_ALLOC_ENABLE=value)
        out = launch(where + [sys.executable, "-c", TENSOR_PAGES], env=run_env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert _rows(out) == {0: [str(int(want))], 1: [str(int(want))]}
