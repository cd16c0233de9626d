"""Every attack stays in its budget and [0, 1], lowers a trained model's accuracy, and its random
start is seeded; bad input is a clear error."""

import pytest
import torch
import torch.nn.functional as F

from lrrf.attacks import Budget, make_attack, perturbation_norm
from lrrf.data import LrrfDataModule
from lrrf.networks import build_network

BUDGETS = {"linf": 0.2, "l2": 0.8, "l1": 2.5, "fgsm": 0.2}


@pytest.fixture(scope="module")
def trained():
    """A small CNN trained clean on the digits for a few epochs (about a second)."""
    torch.manual_seed(0)
    data = LrrfDataModule(seed=0)
    data.setup("fit")
    net = build_network("small_cnn", 1, 8, 10, 16, 64, [0.3], [0.38])
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    x, y = data.train_set.tensors
    for _ in range(15):
        for i in range(0, len(y), 64):
            opt.zero_grad()
            F.cross_entropy(net(x[i : i + 64]), y[i : i + 64]).backward()
            opt.step()
    net.eval()
    xt, yt = (t[:200] for t in data.test_set.tensors)
    return net, xt, yt


@pytest.mark.parametrize("name", ["linf", "l2", "l1", "fgsm", "square"])
def test_attack_stays_in_budget_and_box_and_lowers_accuracy(trained, name):
    net, x, y = trained
    eps = BUDGETS.get(name, 0.2)
    attack = make_attack(name, Budget(eps, steps=50 if name == "square" else 10))
    x_adv = attack(net, x, y, seed=0)
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    norm = perturbation_norm(name, x, x_adv)
    assert (norm <= eps * (1 + 1e-4) + 1e-6).all(), norm.max()
    with torch.no_grad():
        clean = (net(x).argmax(1) == y).float().mean()
        robust = (net(x_adv).argmax(1) == y).float().mean()
    assert clean > 0.9
    assert robust < clean - 0.1, (clean, robust)
    assert not net.training  # the mode it was given


@pytest.mark.parametrize("name", ["linf", "l2", "l1"])
def test_random_starts_are_seeded(trained, name):
    net, x, y = trained
    attack = make_attack(name, Budget(BUDGETS[name], steps=1))
    a, b = attack(net, x, y, seed=5), attack(net, x, y, seed=5)
    c = attack(net, x, y, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_attack_restores_training_mode_and_batchnorm_statistics(trained):
    net, x, y = trained
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    make_attack("linf", Budget(0.2, steps=3))(net, x, y, seed=0)
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    net.eval()


def test_bad_attack_inputs_are_clear_errors(trained):
    net, x, y = trained
    with pytest.raises(ValueError, match="unknown attack"):
        make_attack("pgd_l7", Budget(0.1))
    with pytest.raises(ValueError, match="must be positive"):
        make_attack("l2", Budget(0.0))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        make_attack("linf", Budget(0.1))(net, x * 255, y)
