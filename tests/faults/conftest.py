"""Fixtures of the fault campaign (docs/reliability.md, "Fault campaign").

COMMRT_FAULT_SEED fixes every random choice of a run (world size, culprit,
collective stream, fault point); unset, each run draws a fresh seed and
prints it, so a failure can be replayed exactly.
"""
import json
import os
import random
import statistics
import zlib

import pytest
from harness import SEED, host_leftovers


def pytest_report_header(config):
    return f"commrt fault campaign: COMMRT_FAULT_SEED={SEED}"


@pytest.fixture
def rng(request):
    """A Random seeded by (COMMRT_FAULT_SEED, this test's id): the test's own draws."""
    return random.Random(SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def seed(rng):
    return rng.randrange(1 << 30)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A TMPDIR of this test's own for the launcher and its ranks, which must be
    empty after the job; and no new commrt name in /dev/shm or /tmp."""
    d = tmp_path / "tmpdir"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    shm_before = {p for p in host_leftovers() if p.startswith("/dev/shm")}
    yield d
    left = sorted(os.listdir(d))
    assert not left, f"left in the job's TMPDIR: {left}"
    shm_after = {p for p in host_leftovers() if p.startswith("/dev/shm")}
    assert shm_after <= shm_before, f"left in /dev/shm: {sorted(shm_after - shm_before)}"


def pytest_runtest_makereport(item, call):
    """Say the seed next to every failure of this directory's tests."""
    if call.excinfo is not None and call.when == "call":
        item.add_report_section("call", "seed", f"COMMRT_FAULT_SEED={SEED} reproduces this run")


# -- the campaign's figures -------------------------------------------------------
# Each fault test records what its closing note needs (detection times, memory
# under a flood, soak counts); the end of the run prints them as a table, with
# or without -s, and writes them to campaign-figures.json in pytest's basetemp.
FIGURES = []


@pytest.fixture
def figure():
    """figure(kind, **values): one figure of this run (kind: sigkill, sigstop,
    link cut, slow, flood, soak)."""
    def add(kind, **values):
        FIGURES.append({"kind": kind, **values})
    return add


def _seconds(values):
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f} s"


def _line(kind, rows):
    if kind in ("sigkill", "sigstop", "link cut"):
        times = [t for r in rows for t in r["detected"].values()]
        if not times:
            return f"{kind}: {len(rows)} jobs, no detection recorded"
        worlds = sorted({r["n"] for r in rows})
        return (f"{kind}: {len(rows)} jobs (N in {worlds}), {len(times)} survivors: detection "
                f"min / median / max {_seconds(times)}")
    if kind == "slow":
        return "; ".join(f"slow {r['transport']} N={r['n']}: rank slept {r['slept']:g} s "
                         f"inside a collective, blamed: {r['blamed'] or 'nobody'}" for r in rows)
    if kind == "flood":
        mib = 1 << 20
        return "; ".join(f"flood {r['transport']} {r['count']} x {r['nbytes']} B: held "
                         f"{r['held_peak'] / mib:.1f} MiB at most, RSS over baseline "
                         f"peak {r['peak_over'] / mib:.1f} MiB, while draining "
                         f"{r['drain_over'] / mib:.1f} MiB, after {r['after_over'] / mib:.1f} MiB "
                         f"(bound {r['bound'] / mib:.0f} MiB)" for r in rows)
    if kind == "soak":
        total = sum(r["ops"] for r in rows)
        parts = ", ".join(f"{r['transport']} N={r['n']} {r['ops']}" for r in rows)
        return f"soak: {total} collectives checked against NumPy ({parts})"
    return f"{kind}: {rows}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not FIGURES:
        return
    tr = terminalreporter
    tr.section(f"commrt fault campaign figures (COMMRT_FAULT_SEED={SEED})")
    kinds = []
    for f in FIGURES:
        if f["kind"] not in kinds:
            kinds.append(f["kind"])
    for kind in kinds:
        tr.write_line(_line(kind, [f for f in FIGURES if f["kind"] == kind]))
    try:
        path = os.path.join(str(config._tmp_path_factory.getbasetemp()), "campaign-figures.json")
        with open(path, "w") as out:
            json.dump({"seed": SEED, "figures": FIGURES}, out, indent=1)
        tr.write_line(f"(all figures: {path})")
    except (AttributeError, OSError) as exc:
        tr.write_line(f"(figures not written: {exc})")
