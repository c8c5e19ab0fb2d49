"""Timeline: spans per rank as Chrome-trace JSON, the launcher's merge, the picture."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from commrt.parallel import timeline
from commrt.testing import World

import mp_ranks


@pytest.fixture
def fresh_timeline():
    timeline.stop(save_file=False)
    yield
    timeline.stop(save_file=False)


def _check_trace(data):
    assert isinstance(data["traceEvents"], list)
    for e in data["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["cat"], str)
    return [e for e in data["traceEvents"] if e["ph"] == "X"]


def test_disabled_spans_cost_next_to_nothing(fresh_timeline, monkeypatch):
    monkeypatch.delenv("COMMRT_TIMELINE", raising=False)
    assert not timeline.enabled()
    assert timeline.span("x") is timeline.span("y", "wait")       # one shared no-op
    # (what a disabled span costs is a benchmark's question, not a test's)
    with timeline.span("forward", "compute"):
        pass
    timeline.record("r", "wait", 0, 10)       # no-ops
    timeline.instant("i")
    assert timeline.get() is None and not timeline.enabled()


def test_spans_nest_and_save_as_chrome_trace(fresh_timeline, tmp_path):
    path = tmp_path / "t.json"
    tl = timeline.start(str(path), rank=3)
    with timeline.span("backward 0", "compute", micro_batch=0):
        with timeline.span("recv grad", "wait"):
            time.sleep(0.001)
    t0 = timeline.now_ns()
    timeline.record("all-reduce wait", "wait", t0, t0 + 2000, bytes=64)
    timeline.instant("epoch 1")
    assert tl is timeline.get() and timeline.enabled()
    assert timeline.stop() == str(path)
    spans = _check_trace(json.loads(path.read_text()))
    assert [s["name"] for s in spans] == ["recv grad", "backward 0", "all-reduce wait"]
    outer, inner = spans[1], spans[0]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert inner["dur"] >= 1000 and spans[2]["dur"] == 2.0 and spans[2]["args"] == {"bytes": 64}
    assert {s["pid"] for s in spans} == {3}
    assert outer["args"] == {"micro_batch": 0}


def test_knob_enables_with_rank_in_the_path(fresh_timeline, tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_TIMELINE", str(tmp_path / "run.{rank}.json"))
    monkeypatch.setenv("COMMRT_RANK", "5")
    monkeypatch.setattr(timeline, "_checked", False)
    with timeline.span("x"):
        pass
    assert timeline.get().path == str(tmp_path / "run.5.json")


def test_pipeline_ranks_write_spans_that_merge_and_draw(tmp_path):
    pattern = str(tmp_path / "part.{rank}.json")
    with World(2, transport="shm", env={"OPENBLAS_NUM_THREADS": "1"}, timeout=120) as w:
        paths = w.run(mp_ranks.pipeline_with_timeline, pattern, timeout=100)
    assert paths == [pattern.format(rank=r) for r in range(2)]
    merged = tmp_path / "run.json"
    from commrt import timeline as cli

    assert cli.main(["merge", str(merged)] + paths) == 0
    spans = _check_trace(json.loads(merged.read_text()))
    assert min(s["ts"] for s in spans) == 0.0
    by_rank = {}
    for s in spans:
        by_rank.setdefault(s["pid"], set()).add(s["cat"])
    assert set(by_rank) == {0, 1}
    assert {"compute", "wait", "comm", "optimizer"} <= by_rank[0] | by_rank[1]
    assert "compute" in by_rank[0] and "compute" in by_rank[1]
    png = tmp_path / "run.png"
    out = subprocess.run([sys.executable, "-m", "commrt.timeline", str(merged), "--png", str(png)],
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rank" in out.stdout and "compute" in out.stdout


def test_launcher_timeline_merges_every_rank(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""\
        import numpy as np
        import commrt
        from commrt import nn
        from commrt.parallel import model_parallel as mp
        comm = commrt.init()
        if comm.rank == 0:
            x = nn.Tensor(np.ones((4, 3)), requires_grad=True)
            mp.send_forward(x * 2.0, comm, 1).backward()
        else:
            nn.functions.sum(mp.recv_forward(comm, 0) * 3.0).backward()
        mp.wait_sends()
        comm.close()
        """))
    out = tmp_path / "run.json"
    res = subprocess.run([sys.executable, "-m", "commrt.launcher.cli", "-n", "2", "--timeline",
                          str(out), str(prog)], capture_output=True, text=True, timeout=110,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    spans = _check_trace(json.loads(out.read_text()))
    assert {s["pid"] for s in spans} == {0, 1}
    assert any(s["cat"] == "wait" for s in spans)
    assert "timeline: " in res.stderr and "2 rank(s)" in res.stderr
    assert not [n for n in os.listdir(tmp_path) if ".rank" in n]      # parts removed
