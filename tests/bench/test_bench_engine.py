"""``python -m commrt.bench engine`` runs and prints its table."""
from commrt.bench import engine


def test_engine_benchmark_prints_a_table(capsys):
    assert engine.main(["--rounds", "2", "--iters", "1", "--threads", "1", "--pause", "0"]) == 0
    out = capsys.readouterr().out
    assert "| LeNet train step, batch 64, 1x28x28 |" in out and "| Conv2d fwd+bwd" in out
    assert "per-round ratio" in out


def test_table_ratios():
    text = engine.table({"w": {"ours": [2.0, 4.0, 6.0], "torch": [1.0, 1.0, 3.0]}})
    assert "| w | 4000.00 (2000.00-6000.00) | 1000.00 (1000.00-3000.00) | 4.00x | 2.00x |" in text
    assert "n/a" in engine.table({"w": {"ours": [1.0]}})
