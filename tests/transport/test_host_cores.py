"""Whether a host's ranks are oversubscribed is judged on the cores their affinity
masks hold together (connect.host_cpus), not on one rank's mask: a launcher
that pins each rank to a core of its own (mpirun's default at 2 ranks, srun
--cpu-bind=cores) leaves every mask one core wide, and those ranks, which do
not share a core, must not yield and sleep as if they did."""
import os
import subprocess
import sys

import pytest

from commrt.transport.connect import cpu_list, host_cpus, parse_cpu_list

PROG = """
import os, sys
rank = int(os.environ["COMMRT_RANK"])
cores = sorted(os.sched_getaffinity(0))
if sys.argv[1] == "own":
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
elif sys.argv[1] == "same":
    os.sched_setaffinity(0, {cores[0]})
import commrt
from commrt.collectives import cost
comm = commrt.init(timeout=30)
print("RANK", rank, comm._coll._engine.oversubscribed, cost._cores(), flush=True)
comm.close()
"""


def _launch(tmp_path, mode, n=2):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    res = subprocess.run([sys.executable, "-m", "commrt.launcher", "-n", str(n), str(prog), mode],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = sorted(ln.split("RANK", 1)[1].split() for ln in res.stdout.splitlines()
                   if "RANK " in ln)     # (the launcher prefixes each line with its rank)
    assert len(lines) == n, res.stdout
    return [(over == "True", int(cores)) for _, over, cores in lines]


@pytest.mark.timeout(150)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin ranks apart")
def test_ranks_pinned_each_to_its_own_core_are_not_oversubscribed(tmp_path):
    assert _launch(tmp_path, "own") == [(False, 2), (False, 2)]


@pytest.mark.timeout(150)
def test_ranks_pinned_to_one_core_are(tmp_path):
    assert _launch(tmp_path, "same") == [(True, 1), (True, 1)]


@pytest.mark.timeout(150)
def test_unpinned_ranks_count_the_cores_they_may_use(tmp_path):
    cores = len(os.sched_getaffinity(0))
    n = cores + 1
    assert _launch(tmp_path, "none", n) == [(True, cores)] * n


def test_cpu_lists_round_trip():
    for cpus in ({0}, {0, 1, 2, 3}, {0, 1, 2, 3, 8, 10, 11}, {5, 7, 9}, set()):
        assert parse_cpu_list(cpu_list(cpus)) == cpus
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    for bad in ("a", "3-1", "-2", "1-2-3"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_host_cpus_is_the_union_of_this_hosts_ranks():
    addrs = {0: {"host": "a", "cpus": "0"}, 1: {"host": "a", "cpus": "1"},
             2: {"host": "b", "cpus": "2-7"}, 3: {"host": "a"},          # no mask: ours
             4: {"host": "a", "cpus": "garbage"}}                       # unreadable: ours
    assert host_cpus(addrs, "a", {0}) == {0, 1}
    assert host_cpus(addrs, "b", {2}) == set(range(2, 8))
