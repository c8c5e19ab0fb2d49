"""python -m commrt.bench horovod end to end at a tiny size: commrt.horovod and DDP
train and report a throughput (the figures themselves come from a quiet machine;
fusion off and fp16 differ from fusion only by an environment variable and the
compression, tested in tests/horovod)."""
import json
import re
import subprocess
import sys


def test_bench_horovod_runs_every_mode_and_prints_the_ratios(tmp_path):
    out = subprocess.run([sys.executable, "-m", "commrt.bench", "horovod", "--sizes", "2",
                          "--rounds", "1", "--steps", "2", "--warmup", "1", "--batch", "4",
                          "--models", "tiny", "--modes", "fusion,ddp", "--variant", "c2:HOROVOD_CYCLE_TIME=2",
                          "--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("tiny"))
    cells = row.split()
    assert cells[1] == "2", row
    figures = [float(c) for c in cells[2:5]]          # fusion, ddp, fusion+c2: images/s
    assert all(f > 0 for f in figures), row
    assert re.fullmatch(r"\d+\.\d\d", cells[5]) and cells[6] == "n/a", row   # fusion/ddp
    data = json.loads((tmp_path / "b.json").read_text())
    assert sorted(data) == ["tiny/2/ddp", "tiny/2/fusion", "tiny/2/fusion+c2"], data
    assert "round 1/1 done" in out.stderr, out.stderr


def test_bench_horovod_names_a_malformed_variant():
    out = subprocess.run([sys.executable, "-m", "commrt.bench", "horovod", "--variant",
                          "HOROVOD_CYCLE_TIME=2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--variant wants LABEL:K=V" in out.stderr, out.stderr
