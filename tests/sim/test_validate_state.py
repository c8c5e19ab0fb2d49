"""The host's state around a piece of measurement (bench/hoststate.py
in_fast_state), and the validation's rounds: calibrated and measured in the
fast state where they can be, run again when the state changed under them,
and counted only where their probes both said fast (sim/validate.py)."""
import json

import pytest

from commrt.bench import hoststate
from commrt.sim import validate

pytestmark = pytest.mark.timeout(120)

# a two-rank calibration as validate.calibrate saves it (the figures' size only)
PARAMS = {"alpha": 8e-6, "beta": 2e-10, "gamma": 1e-10, "gamma_mem": 3e-10, "segment": 1 << 18,
          "cores": 2, "beta_at": [[8192, 5e-10], [1 << 20, 2e-10]]}


def _probe(state):
    return {"stream_1MiB_us": 40.0 if state == "fast" else 460.0, "state": state}


def _scripted(monkeypatch, states):
    """host_state() answers the given states in turn; time.sleep does not sleep."""

    left = list(states)
    monkeypatch.setattr(hoststate, "now", lambda: _probe(left.pop(0)))
    monkeypatch.setattr(hoststate.time, "sleep", lambda s: None)
    return left


def test_a_round_waits_for_the_fast_state_before_it_runs(monkeypatch):
    left = _scripted(monkeypatch, ["slow", "slow", "fast", "fast"])
    runs = []
    got, probes = hoststate.in_fast_state(lambda: runs.append(1) or "cells", wait=60)
    assert got == "cells" and runs == [1] and not left
    assert probes["before"]["state"] == probes["after"]["state"] == "fast"
    assert probes["tries"] == 1


def test_a_round_the_state_changed_under_runs_again(monkeypatch):
    left = _scripted(monkeypatch, ["fast", "slow", "fast", "fast"])
    runs, said = [], []
    got, probes = hoststate.in_fast_state(lambda: len(runs.append(1) or runs), said.append,
                                         wait=60)
    assert got == 2 and probes["tries"] == 2 and not left
    assert said and "fast -> slow" in said[0]


def test_a_host_that_stays_slow_gives_up_after_its_tries(monkeypatch):

    _scripted(monkeypatch, ["slow"] * 20)
    clock = iter(range(0, 10000, 50))           # every look at the clock: 50 s later
    monkeypatch.setattr(hoststate.time, "monotonic", lambda: next(clock))
    runs = []
    got, probes = hoststate.in_fast_state(lambda: runs.append(1), lambda s: None, wait=60,
                                         tries=2)
    assert len(runs) == 2 and probes["tries"] == 2
    assert not hoststate.steady(probes) and not validate.is_steady({"host": probes})


def test_wait_zero_runs_at_once_whatever_the_state(monkeypatch):
    left = _scripted(monkeypatch, ["slow", "slow", "fast"])
    got, probes = hoststate.in_fast_state(lambda: "x", wait=0)
    assert got == "x" and probes["tries"] == 1 and left == ["fast"]
    assert probes["before"]["state"] == "slow"


def test_the_real_probe_brackets_a_round():
    got, probes = hoststate.in_fast_state(lambda: 7, wait=0)
    assert got == 7
    for side in ("before", "after"):
        assert probes[side]["state"] in ("fast", "slow")
        assert probes[side]["stream_1MiB_us"] > 0 and probes[side]["copy_1MiB_us"] > 0


def _cells():
    return {(2, "ring", 65536): {"measured": [1.0, 1.0, 1.0], "simulated": [1.0, 9.0, 8.0]},
            (4, "ring", 65536): {"measured": [1.0], "simulated": [1.1]}}


def _host(before, after):
    return {"host": {"before": _probe(before), "after": _probe(after), "tries": 1}}


def test_only_rounds_fast_at_both_ends_count():
    # (4, 0) was saved before the probes existed: it counts
    params = {(2, 0): _host("fast", "fast"), (2, 1): _host("fast", "slow"),
              (2, 2): _host("slow", "slow"), (4, 0): {}}
    kept, good, total = validate.steady(_cells(), params)
    assert (good, total) == (2, 4)
    assert kept == {(2, "ring", 65536): {"measured": [1.0], "simulated": [1.0]},
                    (4, "ring", 65536): {"measured": [1.0], "simulated": [1.1]}}
    assert validate.within(kept) == (2, 2)
    assert validate.within(_cells()) == (1, 2)       # the slow rounds decide N = 2's median
    lines = validate.summary_lines(_cells(), params)
    assert lines[0] == "within 25%: 2 of 2 cells (rounds in the fast state at both ends: 2 of 4)"
    assert lines[1] == "all rounds, the host's state aside: 1 of 2 cells"
    assert validate.summary_lines(_cells(), {}) == ["within 25%: 1 of 2 cells"]
    only_slow = {(2, r): _host("slow", "slow") for r in range(3)}
    assert (2, "ring", 65536) not in validate.steady(_cells(), only_slow)[0]


def test_replay_numbers_the_rounds_of_several_files_in_turn(tmp_path):
    """Two saved runs of one round each: the second file's round is round 1 of
    the replayed cells, and its probes say so."""
    files = []
    for i, state in enumerate(("fast", "slow")):
        saved = {"cells": {"2|ring|65536": {"measured": [1e-4], "simulated": [0]}},
                 "params": {"2|0": dict(PARAMS, **_host("fast", state))}}
        path = tmp_path / f"v{i}.json"
        path.write_text(json.dumps(saved))
        files.append(str(path))
    params = {}
    data = validate.replay(files, params=params)
    assert sorted(params) == [(2, 0), (2, 1)]
    assert params[(2, 1)]["host"]["after"]["state"] == "slow"
    kept, good, total = validate.steady(data, params)
    assert (good, total) == (1, 2) and kept[(2, "ring", 65536)]["measured"] == [1e-4]
