"""A run resumed from a checkpoint continues the same loss curve."""
import numpy as np
import pytest

from commrt import nn, optim
from commrt.data import DataLoader, SyntheticImages
from commrt.nn import functions as F


def setup(seed=0):
    nn.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    opt = optim.Adam(model.parameters(), lr=0.01)
    sched = optim.StepLR(opt, step_size=1, gamma=0.7)
    loader = DataLoader(SyntheticImages(48, shape=(1, 8, 8), num_classes=3, seed=1), 16,
                        shuffle=True, seed=5)
    return model, opt, sched, loader


def run_epochs(model, opt, sched, loader, epochs):
    losses = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(nn.Tensor(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        sched.step()
    return losses


def test_resumed_run_continues_the_same_loss_curve(tmp_path):
    straight = run_epochs(*setup(), range(4))
    model, opt, sched, loader = setup()
    first = run_epochs(model, opt, sched, loader, range(2))
    path = tmp_path / "ckpt.npz"
    nn.save_checkpoint(path, model, opt, sched, epoch=2)
    model2, opt2, sched2, loader2 = setup(seed=99)               # different initial weights
    meta = nn.load_checkpoint(path, model2, opt2, sched2)
    assert meta == {"epoch": 2}
    second = run_epochs(model2, opt2, sched2, loader2, range(meta["epoch"], 4))
    np.testing.assert_allclose(first + second, straight, rtol=1e-6)
    assert sched2.get_last_lr() == pytest.approx([0.01 * 0.7 ** 4])


def test_sgd_momentum_state_round_trips(tmp_path):
    nn.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(nn.Tensor(np.ones((1, 3), np.float32))).sum().backward()
    opt.step()
    nn.save_checkpoint(tmp_path / "c.npz", model, opt)
    opt2 = optim.SGD(nn.Linear(3, 2).parameters(), lr=0.5, momentum=0.9)
    with pytest.raises(KeyError, match="no optimizer state"):
        nn.save_checkpoint(tmp_path / "m.npz", model)
        nn.load_checkpoint(tmp_path / "m.npz", model, opt2)
    nn.load_checkpoint(tmp_path / "c.npz", nn.Linear(3, 2), opt2)
    assert opt2.param_groups[0]["lr"] == 0.1
    bufs = [s["momentum_buffer"] for s in opt2.state.values()]
    np.testing.assert_array_equal(bufs[0], opt.state[model.weight]["momentum_buffer"])
