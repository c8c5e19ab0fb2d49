"""python -m commrt.bench hosts: a failed OpenMPI round (mpirun across namespaces
crashes now and then) is a gap in the table, not the end of the run, and the ratios
still pair the rounds taken side by side."""
import types

from commrt.bench import hosts


def _rows(algo_times):
    return {"rows": [{"algo": a, "bytes": 1024, "time_s": t} for a, t in algo_times]}


def test_failed_openmpi_round_is_a_gap_and_ratios_pair_rounds():
    data = {}
    # round 1: both ran; round 2: OpenMPI failed; round 3: both ran
    hosts.record(data, "1gbit", "commrt", _rows([("ring", 1.0), ("hierarchical", 2.0)]), [1024])
    hosts.record(data, "1gbit", "ompi", _rows([("default", 2.0)]), [1024])
    hosts.record(data, "1gbit", "commrt", _rows([("ring", 100.0), ("hierarchical", 200.0)]),
                 [1024])
    hosts.record(data, "1gbit", "ompi", None, [1024])
    hosts.record(data, "1gbit", "commrt", _rows([("ring", 3.0), ("hierarchical", 6.0)]), [1024])
    hosts.record(data, "1gbit", "ompi", _rows([("default", 6.0)]), [1024])
    assert data[("1gbit", "ompi", 1024)] == [2.0, None, 6.0]
    assert hosts.failed_rounds(data, "1gbit") == 1
    # ompi/best pairs round 1 (2/1) and round 3 (6/3): both 2.0, whatever round 2 held
    assert hosts._ratio_cell(data, "1gbit", 1024, "ompi", "ring") == "2.00 [2.00-2.00]"
    args = types.SimpleNamespace(hosts=2, ranks_per_host=2, rates="1gbit")
    text = hosts.report(args, data)
    assert "OpenMPI failed in 1 round(s) at 1gbit" in text
    assert "2.00 [2.00-2.00]" in text


def test_no_gap_note_when_openmpi_finished_every_round():
    data = {}
    hosts.record(data, "10gbit", "commrt", _rows([("ring", 1.0), ("hierarchical", 1.0)]), [1024])
    args = types.SimpleNamespace(hosts=2, ranks_per_host=2, rates="10gbit")
    assert "failed" not in hosts.report(args, data)
    assert hosts.failed_rounds(data, "10gbit") == 0


def test_only_an_openmpi_failure_becomes_a_gap():
    import pytest

    from commrt.bench import _launch

    def crash(*_):
        raise _launch.RunFailed("mpirun across hosts: orted SIGSEGV\ntail of its output")

    args = types.SimpleNamespace(ranks_per_host=2, timeout=1, mpi_retries=0)
    logged = []
    assert hosts._one_run("ompi", crash, None, args, {}, logged.append, "1gbit: round 2") is None
    assert logged == ["  1gbit: round 2: OpenMPI failed, recorded as a gap: "
                      "mpirun across hosts: orted SIGSEGV"]
    with pytest.raises(_launch.RunFailed):     # commrt's own failure ends the run
        hosts._one_run("commrt", crash, None, args, {}, logged.append, "1gbit: round 2")


def test_a_failed_openmpi_job_is_run_again_before_it_is_a_gap():
    from commrt.bench import _launch

    calls = []

    def flaky(*_):
        calls.append(1)
        if len(calls) < 3:
            raise _launch.RunFailed("mpirun across hosts: failed to TCP connect")
        return {"rows": []}

    args = types.SimpleNamespace(ranks_per_host=2, timeout=1, mpi_retries=2)
    logged = []
    assert hosts._one_run("ompi", flaky, None, args, {}, logged.append, "1gbit: round 1") == \
        {"rows": []}
    assert len(calls) == 3
    assert logged == [f"  1gbit: round 1: OpenMPI failed, trying again ({k} of 3): "
                      "mpirun across hosts: failed to TCP connect" for k in (1, 2)]
    calls.clear()
    logged.clear()
    args.mpi_retries = 1          # both tries fail (the third would pass): a gap
    assert hosts._one_run("ompi", flaky, None, args, {}, logged.append, "1gbit: round 1") is None
    assert len(calls) == 2
    assert logged[-1] == ("  1gbit: round 1: OpenMPI failed, recorded as a gap: "
                          "mpirun across hosts: failed to TCP connect")


def test_wire_bytes_are_reported_per_algorithm_and_size():
    data = {}
    rows = {"rows": [{"algo": "ring", "bytes": 1 << 20, "time_s": 1.0,
                      "wire": {"tx": 1.5 * 2**20, "rx": 1.5 * 2**20}},
                     {"algo": "hierarchical", "bytes": 1 << 20, "time_s": 1.0,
                      "wire": {"tx": 2**20, "rx": 2**20}}]}
    hosts.record(data, "1gbit", "commrt", rows, [1 << 20])
    args = types.SimpleNamespace(hosts=2, ranks_per_host=2, rates="1gbit")
    text = hosts.report(args, data)
    assert "bytes on the busiest host's link per call at 1gbit" in text
    assert "1.50 / 1.50 MiB" in text and "1.00 / 1.00 MiB" in text
    assert hosts._spec(hosts.parse_args(["--wire"]))["wire"] == \
        "/sys/class/net/cmrt0/statistics"
    assert "wire" not in hosts._spec(hosts.parse_args([]))


def test_what_auto_ran_is_reported_per_size_over_rounds():
    data = {}
    for took in ("ring", "ring", "hierarchical"):
        hosts.record(data, "10gbit", "commrt",
                     {"rows": [{"algo": "auto", "bytes": 65536, "time_s": 1.0},
                               {"algo": "ring", "bytes": 65536, "time_s": 1.0}],
                      "choices": {"65536": took}}, [65536])
    args = types.SimpleNamespace(hosts=2, ranks_per_host=2, rates="10gbit")
    text = hosts.report(args, data)
    assert "auto ran at 10gbit: 64 KiB ring x2, hierarchical x1" in text, text
    assert hosts._tally(["ring", "ring"]) == "ring"
