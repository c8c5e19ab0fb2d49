"""The digits example reaches the accuracy it promises, and its pieces import."""
import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trains_to_at_least_97_percent(capsys):
    example = load_example()
    accuracy = example.main(["--no-progress"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert accuracy >= 0.97, line
    assert "test accuracy" in line and "images/s" in line and "test loss" in line


def test_pieces_are_reusable():
    example = load_example()
    model = example.build_model(seed=1)
    train, test = example.load_data(batch_size=64)
    loss, accuracy = example.evaluate(model, test)
    assert 0 <= accuracy <= 0.3 and loss > 1.5          # untrained: near chance
    images = next(iter(train))[0]
    import numpy as np
    shifted = example.augment(images, np.random.default_rng(0))
    assert shifted.shape == images.shape and not np.array_equal(shifted, images)
