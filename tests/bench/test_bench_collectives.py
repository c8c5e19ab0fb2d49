"""python -m commrt.bench collectives: every collective measured and checked in one
launch, and the report's ratio columns (tiny sizes: a smoke run, not a benchmark)."""
import json
import os
import types

import numpy as np
import pytest

from commrt.bench import _coll, _peers, allreduce, collectives
from commrt.transport.buffers import HUGE_MIN


@pytest.mark.timeout(300)
def test_every_collective_runs_checked_in_one_launch():
    spec = {"kinds": list(_coll.KINDS), "sizes": [8, 4096], "target_s": 0.001, "slices": 1,
            "algos": {k: ["auto"] for k in _coll.KINDS}}
    res = _peers.run_commrt(3, spec, "shm", 120)
    got = {(row["kind"], row["bytes"]) for row in res["rows"]}
    want = {(k, s) for k in _coll.KINDS for s in ([0] if k == "barrier" else [8, 4096])}
    assert got == want
    assert all(row["time_s"] > 0 for row in res["rows"])


def _v_spec(sizes=(8, 65536)):
    return {"kinds": list(_coll.VKINDS), "sizes": list(sizes), "target_s": 0.001, "slices": 1,
            "algos": {k: ["default"] for k in _coll.VKINDS}}


def test_variable_size_counts_differ_on_every_rank():
    for n in (2, 3, 4):
        c = _coll.v_counts("all_gatherv", 4096, n)
        assert len(set(c)) == n and sum(c) <= 1024, c
        m = _coll.v_counts("all_to_allv", 4096, n)
        assert len({tuple(row) for row in m}) == n, m        # no two ranks send alike
        assert all(len({m[s][d] for s in range(n)}) == n for d in range(n)), m


@pytest.mark.timeout(300)
def test_variable_size_collectives_run_checked_in_one_launch():
    """--kinds v: all_gatherv, gatherv, scatterv and all_to_allv with counts that
    differ on every rank, each call's result checked (_coll._check raises on a
    wrong one), every fixed algorithm too."""
    from commrt.collectives import ALGORITHMS

    spec = dict(_v_spec(), algos={k: list(ALGORITHMS[k]) + ["auto"] for k in _coll.VKINDS})
    res = _peers.run_commrt(3, spec, "shm", 120)
    got = {(row["kind"], row["algo"], row["bytes"]) for row in res["rows"]}
    want = {(k, a, s) for k in _coll.VKINDS for a in list(ALGORITHMS[k]) + ["auto"]
            for s in (8, 65536)}
    assert got == want
    assert all(row["time_s"] > 0 for row in res["rows"])
    assert collectives.parse_args(["--kinds", "v,all_reduce"]).kinds == [*_coll.VKINDS,
                                                                         "all_reduce"]


HAVE_MPI = _peers.has_module("mpi4py") and bool(__import__("shutil").which("mpirun"))


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py or OpenMPI's mpirun is not installed")
def test_variable_size_collectives_of_openmpi_run_checked():
    """OpenMPI's Allgatherv, Gatherv, Scatterv and Alltoallv as the bench calls
    them, each result checked as commrt's are (_coll._check raises)."""
    res = _peers.run_mpi(3, _peers.PEERS["ompi"], _v_spec(), 120, "ompi")
    assert {(row["kind"], row["bytes"]) for row in res["rows"]} == {
        (k, s) for k in _coll.VKINDS for s in (8, 65536)}


@pytest.mark.timeout(300)
@pytest.mark.skipif(not _peers.has_module("torch"), reason="torch is not installed")
def test_variable_size_collectives_of_gloo_run_checked():
    """Gloo's all_to_all_single with split sizes, checked; its gathers and
    scatters take blocks of one size only, so they give no rows."""
    res = _peers.run_gloo(3, _v_spec(), 120)
    assert {(row["kind"], row["bytes"]) for row in res["rows"]} == {
        ("all_to_allv", 8), ("all_to_allv", 65536)}


@pytest.mark.timeout(300)
def test_auto_rows_name_the_algorithm_the_cost_model_chose():
    from commrt.collectives import ALGORITHMS

    spec = {"kinds": ["all_gather", "reduce", "gather"], "sizes": [8, 65536],
            "target_s": 0.001, "slices": 1,
            "algos": {"all_gather": ["direct", "auto"], "reduce": ["auto"], "gather": ["auto"]}}
    res = _peers.run_commrt(3, spec, "shm", 120)
    auto = {(row["kind"], row["bytes"]): row.get("chose") for row in res["rows"]
            if row["algo"] == "auto"}
    for kind in ("all_gather", "reduce"):
        for size in (8, 65536):
            assert auto[(kind, size)] in ALGORITHMS[kind], (kind, size, auto)
    # one algorithm: nothing is chosen (cost.choose keeps no memo)
    assert auto[("gather", 8)] is None


@pytest.mark.timeout(300)
def test_fresh_inputs_run_checked_in_one_launch():
    spec = {"kinds": ["all_to_all", "barrier", "all_reduce"], "sizes": [4096],
            "target_s": 0.001, "slices": 1, "fresh": True,
            "algos": {k: ["auto"] for k in _coll.KINDS}}
    res = _peers.run_commrt(2, spec, "shm", 120)
    assert {(row["kind"], row["bytes"]) for row in res["rows"]} == {
        ("all_to_all", 4096), ("barrier", 0), ("all_reduce", 4096)}
    assert all(row["time_s"] > 0 for row in res["rows"])


def test_fresh_inputs_write_every_call_and_leave_the_writes_out(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(_coll.time, "perf_counter", lambda: clock[0])

    class Buf:
        writes = []

        def fill(self, v):
            self.writes.append(v)
            clock[0] += 5.0           # writing the input: not the collective's time

    class Ops:
        calls = 0

        def run(self, kind, algo, out, buf):
            assert len(buf.writes) == self.calls + 1      # written before each call
            self.calls += 1
            clock[0] += 1.0

    ops, buf = Ops(), Buf()
    assert _coll._timed_fresh(ops, "all_to_all", "auto", None, buf, 10, 0.0) == 10.0
    assert ops.calls == 10 and buf.writes == [i & 7 for i in range(10)]


def test_report_ratios_take_the_better_openmpi():
    args = types.SimpleNamespace(kinds=["broadcast", "barrier"], sizes=[8], rounds=3,
                                 transport="shm")
    data = {2: {"broadcast": {("commrt", "auto"): {8: [1e-6, 2e-6, 3e-6]},
                              ("ompi", "default"): {8: [4e-6] * 3},
                              ("ompi-nocma", "default"): {8: [3e-6] * 3},
                              ("gloo", "default"): {8: [20e-6] * 3}},
                "barrier": {("commrt", "auto"): {0: [1e-6] * 3},
                            ("ompi", "default"): {0: [2e-6] * 3}}}}
    text = collectives.report(args, data)
    line = next(ln for ln in text.splitlines() if ln.startswith("8 B"))
    assert line.split()[-2:] == ["1.50", "10.00"], line      # 3.0 / 2.0, 20 / 2
    assert "barrier, N = 2" in text and "busbw" not in text.split("barrier, N = 2")[1]
    md = collectives.report(args, data, markdown=True)
    assert "| size | auto | gloo | ompi | ompi-nocma | vs MPI | vs Gloo |" in md


def test_auto_best_takes_the_chosen_algorithms_own_column():
    args = types.SimpleNamespace(kinds=["reduce"], sizes=[8, 64], rounds=3, transport="shm")
    data = {4: {"reduce": {("commrt", "binomial"): {8: [1e-6] * 3, 64: [2e-6] * 3},
                           ("commrt", "ring"): {8: [4e-6] * 3, 64: [1e-6] * 3},
                           ("commrt", "auto"): {8: [2e-6] * 3, 64: [2e-6] * 3}}}}
    choices = {4: {"reduce": {8: ["binomial"] * 3, 64: ["binomial", "binomial", "ring"]}}}
    times = collectives.report(args, data, choices=choices).split("busbw")[0]
    row = {ln.split()[0] + ln.split()[1]: ln.split() for ln in times.splitlines()
           if ln[:1].isdigit()}
    assert row["8B"][-2:] == ["1.00", "binomial"]      # not the auto column's 2.00
    assert row["64B"][-2:] == ["2.00", "binomial"]     # the rounds' most common choice
    # not known: the auto column's own time
    no_choice = collectives.report(args, data).split("busbw")[0].splitlines()
    assert [ln.split()[-1] for ln in no_choice if ln.startswith("8 B")] == ["2.00"]


def test_busbw_factors_are_nccl_tests():
    f = collectives.busbw_factor
    assert f("all_reduce", 4) == 1.5 and f("broadcast", 4) == 1.0 and f("reduce", 4) == 1.0
    assert all(f(k, 4) == 0.75 for k in ("all_gather", "gather", "reduce_scatter", "scatter",
                                           "all_to_all"))
    assert f("barrier", 4) == 0.0


def test_allreduce_is_collectives_with_one_kind_and_every_algorithm():
    to = allreduce.collectives_argv
    assert to([]) == ["--kinds", "all_reduce", "--algos", "all"]
    assert to(["--kind", "broadcast", "--peers"]) == ["--kinds", "broadcast", "--peers",
                                                      "--algos", "all"]
    assert to(["--kind=gather", "--algos", "auto"]) == ["--kinds=gather", "--algos", "auto"]
    assert to([], kind="all_gather")[:2] == ["--kinds", "all_gather"]
    args = collectives.parse_args(to(["--kind", "reduce", "--nranks", "2", "--sizes", "8"]))
    assert args.kinds == ["reduce"] and args.algos == "all" and args.nranks == [2]


@pytest.mark.timeout(300)
def test_counts_give_cpu_and_switches_per_call():
    spec = {"kinds": ["all_reduce", "barrier"], "sizes": [8], "target_s": 0.001, "slices": 2,
            "algos": {"all_reduce": ["auto"], "barrier": ["auto"]}, "counts": True}
    res = _peers.run_commrt(2, spec, "shm", 120)
    for row in res["rows"]:
        c = row["counts"]
        assert set(c) == set(_coll.COUNTS)
        assert all(v >= 0 for v in c.values()), c
        # each call runs Python and the chain: some CPU per call, far below a second
        assert 0 < c["usr_us"] + c["sys_us"] < 1e6, c
    spec.pop("counts")
    assert all("counts" not in row for row in _peers.run_commrt(2, spec, "shm", 120)["rows"])


def test_counts_report_takes_medians_per_system():
    args = types.SimpleNamespace(kinds=["all_reduce"], sizes=[8], rounds=3, transport="shm")
    c = [{"usr_us": u, "sys_us": 1.0, "vcs": 0.0, "ivcs": 1.0} for u in (1.0, 2.0, 9.0)]
    counts = {4: {"all_reduce": {("commrt", "auto"): {8: c},
                                 ("ompi", "default"): {8: [dict(x, usr_us=0.5) for x in c]}}}}
    md = collectives.report_counts(args, counts, markdown=True)
    assert "| system | size | user µs | sys µs | slept | switched |" in md
    assert "| commrt | 8 B | 2.00 | 1.00 | 0.00 | 1.00 |" in md, md
    assert "| ompi | 8 B | 0.50 | 1.00 | 0.00 | 1.00 |" in md, md
    text = collectives.report_counts(args, counts)
    assert text.index("commrt") < text.index("ompi")
    args2 = collectives.parse_args(["--counts", "--nranks", "4"])
    assert args2.counts and not collectives.parse_args([]).counts


def test_wire_gives_an_interfaces_bytes_per_call():
    """Over TCP on loopback both ranks' bytes pass lo: a 1 MiB ring all-reduce of
    two ranks sends 1 MiB from each, so at least 2 MiB a call each way (other
    traffic on lo only adds)."""
    lo = "/sys/class/net/lo/statistics"     # Linux, as the transport itself needs
    spec = {"kind": "all_reduce", "sizes": [1 << 20], "target_s": 0.01, "slices": 2,
            "algos": ["ring"], "wire": lo}
    row, = _peers.run_commrt(2, spec, "tcp", 120)["rows"]
    assert row["wire"]["tx"] >= 2 * 2**20 and row["wire"]["rx"] >= 2 * 2**20, row
    spec.pop("wire")
    assert "wire" not in _peers.run_commrt(2, spec, "tcp", 120)["rows"][0]


def test_busy_loops_spin_for_the_block_and_are_gone_after():
    """--busy K: K processes burning CPU while the systems are measured, none after."""
    import time

    def spinners():
        """Our children running the busy loop (others may run one too)."""
        found = []
        for p in os.listdir("/proc"):
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if ppid == os.getpid() and b"while True: pass" in f.read():
                        found.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
        return found

    with collectives.busy_loops(2):
        deadline = time.monotonic() + 10      # a child shows its command line once it ran exec
        while len(spinning := spinners()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(spinning) == 2, spinning
        t0 = time.monotonic()
        with open(f"/proc/{spinning[0]}/stat") as f:
            cpu0 = sum(int(x) for x in f.read().split()[13:15])
        while time.monotonic() - t0 < 0.5:
            pass
        with open(f"/proc/{spinning[0]}/stat") as f:
            assert sum(int(x) for x in f.read().split()[13:15]) > cpu0     # it runs
    for pid in spinning:
        assert not os.path.exists(f"/proc/{pid}"), pid      # killed and reaped
    assert collectives.parse_args(["--busy", "1"]).busy == 1


def test_plots_go_into_a_folder_made_for_them(tmp_path):
    """--plot-dir may name a folder that does not exist yet: the tables of a long
    run must not end in FileNotFoundError (it did, 2026-12-07)."""
    import json
    import os
    import types

    root = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "data")
    with open(os.path.join(root, "collectives-2026-12-07-c.json")) as f:
        saved = json.load(f)       # as --json writes it: "system/algorithm", sizes as
        # text, and what auto chose per round ("chose/auto", not a time)
    data = {int(n): {kind: {tuple(key.split("/")): {int(k): t for k, t in by.items()}
                            for key, by in per.items() if not key.startswith("chose/")}
                     for kind, per in kinds.items()}
            for n, kinds in saved.items()}
    args = types.SimpleNamespace(kinds=["all_reduce", "barrier"], transport="shm",
                                 sizes=[8, 65536, 1 << 20, 16 << 20, 64 << 20])
    out = tmp_path / "not" / "yet"
    paths = collectives.plot(args, data, str(out))
    assert sorted(os.path.basename(p) for p in paths) == ["collectives-all_reduce.png",
                                                          "collectives-barrier.png"]
    assert all(os.path.getsize(p) > 1000 for p in paths)


def _recording_systems(monkeypatch):
    """Stand-ins for the launches that record what each measured, in order (the
    real launches are the tests above); each returns one row per kind asked."""
    calls = []

    def launch(name):
        def job(spec, *_):
            calls.append((name, tuple(spec["kinds"])))
            return {"rows": [{"kind": k, "algo": spec["algos"][k][0], "bytes": 8,
                              "time_s": float(len(calls))} for k in spec["kinds"]]}
        return job

    monkeypatch.setattr(_peers, "run_commrt", lambda n, spec, *a: launch("commrt")(spec))
    monkeypatch.setattr(_peers, "mpi_jobs", lambda n, timeout, log: [
        (name, launch(name)) for name in _peers.PEERS])
    monkeypatch.setattr(_peers, "run_gloo", lambda n, spec, *a: launch("gloo")(spec))
    monkeypatch.setattr(_peers, "has_module", lambda mod: True)
    return calls


def test_each_collective_interleaves_the_systems_the_first_turning(monkeypatch):
    calls = _recording_systems(monkeypatch)
    args = collectives.parse_args(["--kinds", "broadcast,reduce", "--nranks", "2",
                                   "--sizes", "8", "--rounds", "2", "--peers"])
    data = collectives.collect(args, lambda msg: None)
    systems = ["commrt", "ompi", "ompi-nocma", "gloo"]
    assert calls == ([(s, ("broadcast",)) for s in systems] + [(s, ("reduce",)) for s in systems]
                     + [(s, ("broadcast",)) for s in systems[1:] + systems[:1]]
                     + [(s, ("reduce",)) for s in systems[1:] + systems[:1]])
    # every launch's rows filed under its system, one time per round
    assert data[2]["reduce"][("commrt", "auto")][8] == [5.0, 16.0]
    assert data[2]["broadcast"][("gloo", "default")][8] == [4.0, 11.0]


def test_interleave_run_measures_every_collective_in_one_launch(monkeypatch):
    calls = _recording_systems(monkeypatch)
    args = collectives.parse_args(["--kinds", "broadcast,reduce", "--nranks", "2",
                                   "--sizes", "8", "--rounds", "2", "--interleave", "run"])
    collectives.collect(args, lambda msg: None)
    assert calls == [("commrt", ("broadcast", "reduce"))] * 2


def test_fast_state_runs_a_round_again_where_the_state_changed_under_it(monkeypatch, tmp_path):
    """--fast-state: each round of a collective (every system's launch) waits for
    the fast state, and runs again where the probe after it found it changed;
    only the last try's rows are filed, and the probes go into the JSON."""
    from commrt.bench import hoststate

    calls = _recording_systems(monkeypatch)
    # broadcast: fast -> slow (again), then fast -> fast; reduce: slow, fast -> fast
    said = iter(["fast", "slow", "fast", "fast", "slow", "fast", "fast"])
    monkeypatch.setattr(hoststate, "now", lambda: {"state": next(said)})
    monkeypatch.setattr(hoststate.time, "sleep", lambda s: None)
    out = tmp_path / "run.json"
    args = collectives.parse_args(["--kinds", "broadcast,reduce", "--nranks", "2", "--sizes",
                                   "8", "--rounds", "1", "--fast-state", "--json", str(out)])
    states, logged = [], []
    data = collectives.collect(args, logged.append, None, {}, states)
    assert calls == [("commrt", ("broadcast",))] * 2 + [("commrt", ("reduce",))]
    assert data[2]["broadcast"][("commrt", "auto")][8] == [2.0]     # the second try's
    assert [(s["kinds"], s["tries"], hoststate.steady(s)) for s in states] == \
        [(["broadcast"], 2, True), (["reduce"], 1, True)]
    assert any("fast -> slow" in m for m in logged)
    assert json.loads(out.read_text())["host"][0]["tries"] == 2
    assert collectives.state_line(states) == (
        "(host state: 2 of 2 rounds of a collective fast at both ends; "
        "1 run again after the state changed under them)")


def test_without_fast_state_nothing_is_probed(monkeypatch):
    from commrt.bench import hoststate

    _recording_systems(monkeypatch)
    monkeypatch.setattr(hoststate, "now", lambda: pytest.fail("probed"))
    args = collectives.parse_args(["--kinds", "reduce", "--nranks", "2", "--sizes", "8",
                                   "--rounds", "1"])
    states = []
    collectives.collect(args, lambda m: None, None, {}, states)
    assert states == []


@pytest.mark.parametrize("kind", ["all_gather", "all_to_all", "all_reduce", "scatterv",
                                  "all_to_allv"])
def test_benchmark_buffers_start_at_the_asked_alignment(kind):
    """Every system's buffers start 64-byte aligned by default (PyTorch's
    placement), so two ranks' buffers are mutually aligned for the kernel's
    single-copy reads; align 0 leaves NumPy's placement."""
    for align in (64, 4096):
        out, buf = _coll._buffers(kind, 1 << 20, 4, 1, align)
        for a in (out, buf):
            if a is not None:
                assert a.ctypes.data % align == 0 and a.dtype == np.float32
                assert a.flags.c_contiguous and a.flags.writeable and not a.any()
    assert _coll._buffers(kind, 1 << 20, 4, 1)[1].ctypes.data % _coll.ALIGN == 0
    plain = _coll._buffers(kind, 1 << 20, 4, 1, 0)[1]
    assert plain.base is None            # NumPy's own array, not a view into a padded one
    args = collectives.parse_args(["--kinds", kind, "--buffer-align", "0"])
    assert args.buffer_align == 0
    assert collectives.parse_args(["--kinds", kind]).buffer_align == 64
    with pytest.raises(SystemExit):
        collectives.parse_args(["--kinds", kind, "--buffer-align", "-64"])


def test_the_aligned_buffers_go_through_a_real_collective_checked():
    """A launch with the default alignment checks every result as before (the
    views into padded allocations are what the collectives receive)."""
    res = _peers.run_commrt(2, {"kinds": ["all_gather", "all_to_all"], "sizes": [1 << 20],
                                "algos": {"all_gather": ["auto"], "all_to_all": ["auto"]},
                                "target_s": 0.01, "slices": 1, "align": 64}, "shm", 120)
    assert {row["kind"] for row in res["rows"]} == {"all_gather", "all_to_all"}


@pytest.mark.parametrize("kind", ["all_gather", "all_reduce", "all_to_allv"])
def test_large_buffers_sit_on_the_asked_pages(kind, thp_mode, pages_under):
    """From 2 MiB on, every system's buffers come from a mapping of their own on
    huge pages by default (small ones with --buffer-pages small), so the
    kernel's single-copy reads do not depend on what the process freed before;
    still aligned, zeroed and contiguous, and smaller buffers as before."""
    nbytes = 8 << 20
    for pages in ("huge", "small"):
        out, buf = _coll._buffers(kind, nbytes, 2, 0, 64, pages)
        big = out if out is not None and out.nbytes >= buf.nbytes else buf
        assert big.nbytes >= HUGE_MIN and not big.any()
        big[:] = 1.0                                   # fault every page in
        start, end, huge_kb, eligible = pages_under(big)
        assert big.ctypes.data % (2 << 20) == 0       # a huge page's boundary
        assert end - start >= big.nbytes               # its own mapping
        if pages == "small":
            assert huge_kb == 0 and eligible == "0"
        elif thp_mode != "never":
            # advised (under THP "madvise" only an advised mapping is eligible);
            # whether the kernel found free huge pages is its business
            assert eligible == "1"
    small = _coll._buffers(kind, 1 << 16, 2, 0, 64, "huge")[1]
    assert small.ctypes.data % 64 == 0 and small.nbytes < HUGE_MIN
    args = collectives.parse_args(["--kinds", kind])
    assert args.buffer_pages == "huge"
    assert collectives.parse_args(["--kinds", kind, "--buffer-pages", "small"]).buffer_pages == \
        "small"
    with pytest.raises(SystemExit):
        collectives.parse_args(["--kinds", kind, "--buffer-pages", "tiny"])


def test_the_asked_pages_go_through_a_real_collective_checked():
    """Buffers on mappings of their own carry a checked collective (the worker
    checks every result) for both page policies."""
    for pages in ("huge", "small"):
        res = _peers.run_commrt(2, {"kinds": ["all_reduce"], "sizes": [4 << 20],
                                    "algos": {"all_reduce": ["auto"]}, "target_s": 0.01,
                                    "slices": 1, "align": 64, "pages": pages}, "shm", 120)
        assert [row["kind"] for row in res["rows"]] == ["all_reduce"]
