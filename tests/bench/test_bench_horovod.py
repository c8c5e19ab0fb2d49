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
    # the coordinator's counts per step: every one of tiny's 148 gradients reduced once a
    # step, and no full negotiation once the response cache is warm (the closing
    # barrier's one, not cached, is half a negotiation a step over 2 steps)
    counts = {ln.split()[2]: ln.split()[3:] for ln in out.stdout.splitlines()
              if ln.startswith("tiny") and ln.split()[2] in ("fusion", "fusion+c2")}
    assert sorted(counts) == ["fusion", "fusion+c2"], out.stdout
    for mode, (rounds, negotiations, reduces, tensors) in counts.items():
        assert float(tensors) == 148.0 and float(negotiations) <= 0.5, (mode, out.stdout)
        assert 1 <= float(reduces) <= 148 and float(rounds) >= 1, (mode, out.stdout)
    assert all("per_step" in data[k] for k in ("tiny/2/fusion", "tiny/2/fusion+c2")), data


def test_bench_horovod_names_a_malformed_variant():
    out = subprocess.run([sys.executable, "-m", "commrt.bench", "horovod", "--variant",
                          "HOROVOD_CYCLE_TIME=2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--variant wants LABEL:K=V" in out.stderr, out.stderr


def test_bench_horovod_blocks_runs_every_mode_in_one_job(tmp_path):
    """--blocks: the modes take turns inside one job; the ratio columns are the jobs'
    own ratios, median [min-max]."""
    out = subprocess.run([sys.executable, "-m", "commrt.bench", "horovod", "--sizes", "2",
                          "--rounds", "1", "--steps", "2", "--warmup", "1", "--batch", "4",
                          "--models", "tiny", "--modes", "fusion,nofusion,ddp", "--blocks", "2",
                          "--variant", "c2:HOROVOD_CYCLE_TIME=2",
                          "--json", str(tmp_path / "b.json")], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 blocks of 2 steps per mode in one job" in out.stdout, out.stdout
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("tiny"))
    cells = row.split()
    assert all(float(c) > 0 for c in cells[2:6]), row     # fusion, nofusion, ddp, fusion+c2
    ratio = r"\d+\.\d\d \[\d+\.\d\d-\d+\.\d\d\]"
    assert re.fullmatch(f"{ratio} {ratio}", " ".join(cells[6:])), row
    data = json.loads((tmp_path / "b.json").read_text())
    assert sorted(data) == ["tiny/2/ddp", "tiny/2/fusion", "tiny/2/fusion+c2",
                            "tiny/2/nofusion"], data
    # each Horovod mode's counts come from its own blocks: fusion off reduces every
    # one of tiny's 148 gradients alone, fusion packs them
    reduces = {ln.split()[2]: float(ln.split()[5]) for ln in out.stdout.splitlines()
               if ln.startswith("tiny") and len(ln.split()) == 7}
    assert reduces["nofusion"] == 148.0 and reduces["fusion"] < 148.0, out.stdout
