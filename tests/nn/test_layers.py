"""Modules: registration, modes, state, layer gradients, BatchNorm, init."""
import numpy as np
import pytest

from commrt import nn
from commrt.nn import functions as F
from commrt.nn import init
from commrt.nn.gradcheck import check_grad

rng = np.random.default_rng(11)


def x64(*shape):
    return nn.Tensor(rng.standard_normal(shape), requires_grad=True)


def test_parameters_are_registered_in_assignment_order():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.BatchNorm1d(3))
            self.head = nn.Linear(3, 1, bias=False)
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias", "head.weight"]
    assert [n for n, _ in net.named_buffers()] == ["body.2.running_mean", "body.2.running_var"]
    assert net.num_parameters() == 6 + 3 + 3 + 3 + 3
    net.head = None                                     # reassigning unregisters
    assert "head.weight" not in dict(net.named_parameters())


def test_train_eval_reaches_every_module_and_zero_grad_clears():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    net(nn.Tensor(np.ones((1, 2), np.float32))).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all((p.grad == 0).all() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_state_dict_round_trip_copies_values():
    nn.manual_seed(1)
    a = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    nn.manual_seed(2)
    b = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    a[1].running_mean[:] = 3.0
    state = a.state_dict()
    state["0.weight"][...] = 0.5                    # a copy: the model is untouched
    assert not (a[0].weight.data == 0.5).all()
    b.load_state_dict(a.state_dict())
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    np.testing.assert_array_equal(b[1].running_mean, 3.0)


@pytest.mark.parametrize("make,shape", [
    (lambda: nn.Linear(3, 2, dtype=np.float64), (4, 3)),
    (lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1, dilation=1, dtype=np.float64), (2, 2, 5, 5)),
    (lambda: nn.Conv2d(1, 2, (2, 3), padding=(1, 0), dilation=(2, 1), dtype=np.float64), (1, 1, 4, 5)),
    (lambda: nn.BatchNorm1d(3, dtype=np.float64), (5, 3)),
    (lambda: nn.BatchNorm1d(2, dtype=np.float64), (3, 2, 4)),
    (lambda: nn.BatchNorm2d(2, dtype=np.float64), (3, 2, 2, 3)),
    (lambda: nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), nn.Tanh()), (2, 1, 4, 4)),
    (lambda: nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Sigmoid()), (1, 2, 3, 3)),
    (lambda: nn.ResidualBlock(2, 3, stride=2, dtype=np.float64), (2, 2, 4, 4)),
    (lambda: nn.ResidualBlock(2, 2, dtype=np.float64), (2, 2, 3, 3)),
])
def test_layer_gradients_for_input_and_parameters(make, shape):
    nn.manual_seed(0)
    layer = make()
    x = x64(*shape)
    check_grad(lambda: layer(x), [x] + layer.parameters(), atol=1e-5, rtol=1e-4)


def test_batchnorm_eval_gradients():
    bn = nn.BatchNorm2d(2, dtype=np.float64)
    bn.running_mean[:] = [0.5, -1.0]
    bn.running_var[:] = [2.0, 0.5]
    bn.eval()
    x = x64(2, 2, 2, 2)
    check_grad(lambda: bn(x), [x] + bn.parameters())


def test_batchnorm_train_normalises_and_tracks_running_statistics():
    bn = nn.BatchNorm2d(3, momentum=0.1, dtype=np.float64)
    bn.weight.data[:] = [1.0, 2.0, 3.0]
    bn.bias.data[:] = [0.0, 1.0, -1.0]
    x = rng.standard_normal((8, 3, 4, 4)) * 3 + 5
    y = bn(nn.Tensor(x)).data
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
    want = want * bn.weight.data[:, None, None] + bn.bias.data[:, None, None]
    np.testing.assert_allclose(y, want, atol=1e-10)
    n = 8 * 4 * 4
    np.testing.assert_allclose(bn.running_mean, 0.1 * mean)
    np.testing.assert_allclose(bn.running_var, 0.9 + 0.1 * var * n / (n - 1))
    bn.eval()
    z = bn(nn.Tensor(x)).data
    want = (x - bn.running_mean[:, None, None]) / np.sqrt(bn.running_var[:, None, None] + 1e-5)
    np.testing.assert_allclose(z, want * bn.weight.data[:, None, None] + bn.bias.data[:, None, None])


def test_batchnorm_matches_pytorch_over_steps():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.BatchNorm1d(4, dtype=np.float64), torch.nn.BatchNorm1d(4).double()
    for _ in range(3):
        x = rng.standard_normal((6, 4))
        np.testing.assert_allclose(ours(nn.Tensor(x)).data,
                                   theirs(torch.tensor(x)).detach().numpy(), atol=1e-10)
    np.testing.assert_allclose(ours.running_var, theirs.running_var.numpy(), atol=1e-12)


def test_dropout_layer_follows_mode():
    drop = nn.Dropout(0.5)
    x = nn.Tensor(np.ones((50, 50), np.float32))
    assert (drop(x).data == 0).any()
    drop.eval()
    assert drop(x) is x


def test_init_statistics():
    nn.manual_seed(3)
    w = nn.Parameter(np.empty((256, 128, 3, 3), np.float32))
    fan_in = 128 * 9
    assert np.std(init.kaiming_normal_(w).data) == pytest.approx(np.sqrt(2 / fan_in), rel=0.02)
    assert np.abs(init.kaiming_uniform_(w).data).max() <= np.sqrt(6 / fan_in) + 1e-6
    bound = np.sqrt(6 / (fan_in + 256 * 9))
    assert np.std(init.xavier_uniform_(w).data) == pytest.approx(bound / np.sqrt(3), rel=0.02)
    assert np.std(init.xavier_normal_(w).data) == pytest.approx(np.sqrt(2 / (fan_in + 256 * 9)), rel=0.02)
    with pytest.raises(ValueError, match="nonlinearity"):
        init.kaiming_normal_(w, nonlinearity="swish")


def test_models_produce_logits_and_all_parameters_get_gradients():
    nn.manual_seed(0)
    for model, shape in [(nn.LeNet(), (2, 1, 28, 28)),
                         (nn.LeNet(image_size=8, kernel_size=3, padding=(1, 1)), (3, 1, 8, 8)),
                         (nn.ResNet(in_channels=3, width=4, blocks=(1, 1)), (2, 3, 8, 8))]:
        out = model(nn.Tensor(rng.standard_normal(shape).astype(np.float32)))
        assert out.shape == (shape[0], 10) and out.dtype == np.float32
        F.cross_entropy(out, np.zeros(shape[0], np.int64)).backward()
        assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    with pytest.raises(ValueError, match="too small"):
        nn.LeNet(image_size=8)


def test_repr_lists_the_layers():
    text = repr(nn.LeNet())
    assert "Conv2d(1, 6, kernel_size=(5, 5)" in text and "Linear(84, 10" in text
