"""Fixtures of the fault campaign (docs/reliability.md, "Fault campaign").

COMMRT_FAULT_SEED fixes every random choice of a run (world size, culprit,
collective stream, fault point); unset, each run draws a fresh seed and
prints it, so a failure can be replayed exactly.
"""
import os
import random
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
