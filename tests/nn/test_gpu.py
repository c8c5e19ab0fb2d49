"""The training engine on a GPU (CuPy arrays): a LeNet and a ResNet with
BatchNorm compute the same loss, gradients and updates on the device as on
the host.  Runs where a CUDA GPU is (skipped, with the reason, elsewhere)."""
import numpy as np
import pytest

from commrt import nn, optim
from commrt.nn import functions as F
from commrt.nn.backend import to_device
from commrt.testing import no_cuda_gpu

pytestmark = [pytest.mark.skipif(no_cuda_gpu() is not None, reason=str(no_cuda_gpu())),
              pytest.mark.timeout(300)]


def _models():
    nn.manual_seed(3)
    lenet = nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(4, 8),
                     kernel_size=3, padding=(1, 1), hidden=(16,), dtype=np.float64)
    nn.manual_seed(4)
    resnet = nn.ResNet(in_channels=3, num_classes=10, width=4, blocks=(1, 1), dtype=np.float64)
    return [("lenet", lenet, (6, 1, 8, 8)), ("resnet", resnet, (6, 3, 8, 8))]


def _train(model, x, y, device, steps=3):
    """Losses, last gradients and final parameters (host copies) after ``steps``
    SGD steps on ``device``, and the array types the device held them in."""
    model = model.to(device)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, kinds = [], set()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(nn.Tensor(to_device(x, device))), to_device(y, device))
        loss.backward()
        grads = [to_device(p.grad, "cpu").copy() for p in model.parameters()]
        kinds |= {type(p.grad).__module__.split(".")[0] for p in model.parameters()}
        opt.step()
        losses.append(float(loss.numpy()))
    kinds |= {type(p.data).__module__.split(".")[0] for p in model.parameters()}
    kinds |= {p.device for p in model.parameters()}
    return losses, grads, [to_device(p.data, "cpu").copy() for p in model.parameters()], kinds


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_a_model_trains_the_same_on_the_gpu(which):
    rng = np.random.default_rng(0)
    for name, model, shape in _models():
        if name != which:
            continue
        x, y = rng.standard_normal(shape), rng.integers(0, 10, shape[0])
        state = model.state_dict()
        cpu_losses, cpu_grads, cpu_params, cpu_kinds = _train(model, x, y, "cpu")
        model.load_state_dict(state)
        gpu_losses, gpu_grads, gpu_params, gpu_kinds = _train(model, x, y, "cuda")
        assert cpu_kinds == {"numpy", "cpu"} and gpu_kinds == {"cupy", "cuda:0"}, gpu_kinds
        np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-9)
        for i, (g, c) in enumerate(zip(gpu_grads, cpu_grads)):
            np.testing.assert_allclose(g, c, rtol=1e-7, atol=1e-10, err_msg=f"{name} gradient {i}")
        for i, (p, c) in enumerate(zip(gpu_params, cpu_params)):
            np.testing.assert_allclose(p, c, rtol=1e-7, atol=1e-10, err_msg=f"{name} parameter {i}")
        assert cpu_losses[-1] < cpu_losses[0]
