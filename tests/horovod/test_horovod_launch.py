"""Horovod jobs under the real launcher: the issue's snippet, a dead peer, an elastic
job that loses a worker (ElasticSampler's exactly-once contract, counted)."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent


def launch(*args, timeout=150):
    proc = subprocess.run([sys.executable, "-m", "commrt.launcher", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


@pytest.mark.timeout(200)
def test_the_issue_snippet_trains_under_commrt_launch_np_2():
    proc, out = launch("-np", "2", "python", HERE / "snippet_train.py")
    assert proc.returncode == 0, out
    lines = re.findall(r"rank (\d) of 2: loss ([\d.]+) -> ([\d.]+); weights equal on all "
                       r"ranks: (\w+)", out)
    assert sorted(r for r, *_ in lines) == ["0", "1"], out
    for _, first, last, same in lines:
        assert float(last) < float(first) and same == "True", out


@pytest.mark.timeout(200)
def test_a_dead_peer_raises_horovod_internal_error_on_every_survivor_within_2_s(tmp_path):
    proc, out = launch("-np", "3", HERE / "dead_peer.py", tmp_path)
    delays = [float(d) for d in re.findall(r"raised HorovodInternalError ([\d.]+) s after", out)]
    assert len(delays) == 2, out
    assert max(delays) < 2.0, out


# --ssh-cmd for a pretend host: drop the host name, run the command here
FAKE_SSH = "sh -c 'shift; exec \"$@\"' fake-ssh"


# the job's own limit (launch's timeout) is the deadline; pytest's default 120 s would
# cut a loaded host's restart (every worker imports torch again) short of it
@pytest.mark.timeout(300)
def test_elastic_job_survives_a_killed_worker_and_processes_each_sample_once(tmp_path):
    """Two slots here, one on a pretend host reached through --ssh-cmd (its worker runs
    under commrt.launcher.remote and talks TCP); rank 1 dies by SIGKILL mid-epoch."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho elastic-pretend-host:1\n")
    script.chmod(0o755)
    result = tmp_path / "result.json"
    proc, out = launch("-np", "3", "--min-np", "2", "--max-np", "3", "--bind", "127.0.0.1",
                       "--ssh-cmd", FAKE_SSH, "--host-discovery-script", script,
                       HERE / "elastic_train.py", result, "kill", timeout=240)
    assert proc.returncode == 0, out
    assert "exited with code 137" in out, out          # rank 1 really was SIGKILLed
    assert "elastic-pretend-host:0" in out, out
    data = json.loads(result.read_text())
    assert data["generation"] >= 1 and data["size"] == 3, data
    assert data["resets"] and data["resets"][-1] == 3, data   # reset callbacks ran
    for epoch, counts in enumerate(data["counts"]):
        assert counts == [1.0] * len(counts), (epoch, counts)


@pytest.mark.timeout(300)
def test_elastic_job_grows_when_discovery_reports_a_new_slot(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    result = tmp_path / "result.json"
    proc, out = launch("-np", "2", "--min-np", "2", "--max-np", "3",
                       "--host-discovery-script", script, HERE / "elastic_train.py", result,
                       "grow", hosts, timeout=240)
    assert proc.returncode == 0, out
    data = json.loads(result.read_text())
    assert data["generation"] == 1 and data["size"] == 3, (data, out)
    assert data["resets"] == [3], data
    for epoch, counts in enumerate(data["counts"]):
        assert counts == [1.0] * len(counts), (epoch, counts)


SHOWS_SECRET = """
import os
from commrt.rendezvous import auth
print("secret vars:", sorted(k for k in os.environ if k.startswith("COMMRT_SECRET")))
print("secret read:", len(auth.load_secret()), "bytes")
"""


def test_elastic_driver_hands_the_secret_through_a_descriptor_and_leaves_no_file(tmp_path):
    """Workers inherit the secret in a memfd (COMMRT_SECRET_FD) like commrt-launch's
    ranks: no secret file in TMPDIR, neither during the job nor after it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(0o755)
    prog = tmp_path / "shows_secret.py"
    prog.write_text(SHOWS_SECRET + f"print('tmp holds:', os.listdir({str(tmp)!r}))\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COMMRT_")}
    env.update(TMPDIR=str(tmp), COMMRT_SECRET_FILE=str(tmp_path / "stale"))
    proc = subprocess.run([sys.executable, "-m", "commrt.launcher", "-np", "1", "--min-np", "1",
                           "--max-np", "1", "--host-discovery-script", str(script),
                           sys.executable, str(prog)],
                          capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "secret vars: ['COMMRT_SECRET_FD']" in out, out
    assert "secret read: 32 bytes" in out, out
    assert "tmp holds: []" in out, out
    assert list(tmp.iterdir()) == [], out
