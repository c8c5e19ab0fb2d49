"""Optimizers against their update rules (and PyTorch when installed);
learning-rate schedules; optimizer state."""
import math

import numpy as np
import pytest

from commrt import nn, optim

rng = np.random.default_rng(3)
GRADS = [rng.standard_normal((3, 2)) for _ in range(4)]
START = rng.standard_normal((3, 2))


def run(opt_class, **kw):
    p = nn.Parameter(START.copy())
    opt = opt_class([p], **kw)
    for g in GRADS:
        p.grad = g.copy()
        opt.step()
    return p.data


def reference_sgd(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    w, buf = START.copy(), None
    for g in GRADS:
        d = g + weight_decay * w
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        w = w - lr * d
    return w


def reference_adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    w, m, v = START.copy(), 0.0, 0.0
    for t, g in enumerate(GRADS, 1):
        if decoupled:
            w = w * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        mhat, vhat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        w = w - lr * mhat / (np.sqrt(vhat) + eps)
    return w


SGD_CASES = [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
             dict(lr=0.1, momentum=0.5, dampening=0.3, weight_decay=0.01),
             dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_matches_update_rule(kw):
    np.testing.assert_allclose(run(optim.SGD, **kw), reference_sgd(**kw), rtol=1e-12)


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.1, betas=(0.8, 0.99), weight_decay=0.1)])
def test_adam_and_adamw_match_update_rules(kw):
    np.testing.assert_allclose(run(optim.Adam, **kw), reference_adam(**kw), rtol=1e-12)
    wd = dict(kw, weight_decay=kw.get("weight_decay", 0.01))
    np.testing.assert_allclose(run(optim.AdamW, **wd), reference_adam(**wd, decoupled=True),
                               rtol=1e-12)


@pytest.mark.parametrize("name,kw", [("SGD", SGD_CASES[2]), ("SGD", SGD_CASES[3]),
                                     ("Adam", dict(lr=0.01, weight_decay=0.1)),
                                     ("AdamW", dict(lr=0.01, weight_decay=0.1))])
def test_matches_pytorch(name, kw):
    torch = pytest.importorskip("torch")
    tp = torch.tensor(START.copy(), requires_grad=True)
    topt = getattr(torch.optim, name)([tp], **kw)
    for g in GRADS:
        tp.grad = torch.tensor(g)
        topt.step()
    np.testing.assert_allclose(run(getattr(optim, name), **kw), tp.detach().numpy(), rtol=1e-10)


def test_parameters_without_gradient_are_skipped_and_groups_have_own_options():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    a.grad = np.ones(2)
    opt.step()
    np.testing.assert_allclose(a.data, 0.9)
    np.testing.assert_allclose(b.data, 1.0)
    b.grad = np.ones(2)
    opt.step()
    np.testing.assert_allclose(b.data, 0.0)


def test_option_errors():
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="unknown options"):
        optim.Adam([p], momentum=0.9)
    with pytest.raises(ValueError, match="learning rate"):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError, match="two groups"):
        optim.SGD([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="does not require grad"):
        optim.SGD([nn.Tensor(np.ones(2))])


def test_state_dict_round_trip_continues_identically():
    def make():
        p = nn.Parameter(START.copy())
        return p, optim.Adam([p], lr=0.1)
    p1, o1 = make()
    for g in GRADS[:2]:
        p1.grad = g
        o1.step()
    p2, o2 = make()
    p2.data[...] = p1.data
    o2.load_state_dict(o1.state_dict())
    for g in GRADS[2:]:
        for p, o in ((p1, o1), (p2, o2)):
            p.grad = g
            o.step()
    np.testing.assert_array_equal(p1.data, p2.data)


def test_step_lr():
    opt = optim.SGD([nn.Parameter(np.ones(1))], lr=1.0)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25]


def test_cosine_with_warmup_and_resume():
    opt = optim.SGD([nn.Parameter(np.ones(1))], lr=1.0)
    sched = optim.CosineAnnealingLR(opt, T_max=10, eta_min=0.1, warmup=2)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(12):
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs[:2] == [0.5, 1.0]
    assert lrs[2] == pytest.approx(1.0) and lrs[10] == pytest.approx(0.1) and lrs[12] == pytest.approx(0.1)
    assert lrs[6] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    other = optim.CosineAnnealingLR(optim.SGD([nn.Parameter(np.ones(1))], lr=1.0), 10, 0.1, 2)
    other.load_state_dict({"last_epoch": 6, "base_lrs": [1.0]})
    assert other.get_last_lr()[0] == pytest.approx(lrs[6])


def test_cosine_matches_pytorch_without_warmup():
    torch = pytest.importorskip("torch")
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=7, eta_min=0.01)
    opt = optim.SGD([nn.Parameter(np.ones(1))], lr=0.5)
    sched = optim.CosineAnnealingLR(opt, T_max=7, eta_min=0.01)
    for _ in range(7):
        assert opt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"])
        topt.step()
        tsched.step()
        sched.step()


def test_scalar_parameter_state_round_trips():
    p = nn.Parameter(np.array(2.0))
    opt = optim.Adam([p], lr=0.1)
    p.grad = np.array(1.0)
    opt.step()
    state = opt.state_dict()
    q = nn.Parameter(p.data.copy())
    opt2 = optim.Adam([q], lr=0.1)
    opt2.load_state_dict(state)
    assert isinstance(opt2.state[q]["exp_avg"], np.ndarray) and opt2.state[q]["step"] == 1
    for param, o in ((p, opt), (q, opt2)):
        param.grad = np.array(-0.5)
        o.step()
    assert p.data == q.data
