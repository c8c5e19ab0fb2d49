"""``python -m commrt.bench layers`` runs both arms and prints every layer of the step."""
import pytest

from commrt.bench import layers


@pytest.mark.timeout(300)
def test_layers_benchmark_prints_every_layer(capsys):
    assert layers.main(["--rounds", "1", "--steps", "2", "--env", "COMMRT_CONV_CHUNK_BYTES=64K"]) == 0
    out = capsys.readouterr().out
    for name in ("00 Conv2d forward", "00 Conv2d backward", "02 MaxPool2d backward",
                 "03 Conv2d backward", "12 CrossEntropy forward", "step "):
        assert name in out, out
    assert "step alone/both per round: " in out


def test_report_orders_layers_and_ratios():
    alone = {"01 ReLU forward": 1e-3, "00 Conv2d forward": 2e-3, "step": 4e-3}
    both = {"01 ReLU forward": 2e-3, "00 Conv2d forward": 2e-3, "step": 5e-3}
    lines = layers.report([(alone, both)]).splitlines()
    assert [ln.split()[0] for ln in lines[1:4]] == ["00", "01", "step"]      # call order, step last
    assert lines[2].split()[-1] == "0.500" and lines[3].split()[-1] == "0.800"
    assert lines[-1] == "step alone/both per round: 0.800"
