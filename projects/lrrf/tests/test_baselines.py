"""Value tests of the baselines' terms (baselines.py) against hand computations."""

import math

import pytest
import torch
import torch.nn.functional as F

from lrrf import baselines, core


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def test_distillation_kl_matches_a_hand_computation_at_two_temperatures():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[2 * math.log(3.0), 0.0]])
    # T = 2: teacher softmax(log 3, 0) = (3/4, 1/4), student (1/2, 1/2); times T^2 = 4
    assert core.distillation_kl(student, teacher, temperature=2.0).item() == pytest.approx(
        4 * kl([0.75, 0.25], [0.5, 0.5]), rel=1e-5
    )
    # T = 1: teacher softmax(2 log 3, 0) = (9/10, 1/10)
    assert core.distillation_kl(student, teacher, temperature=1.0).item() == pytest.approx(
        kl([0.9, 0.1], [0.5, 0.5]), rel=1e-5
    )
    # batch mean, not sum: two copies of the same pair give the same value
    assert core.distillation_kl(student.repeat(2, 1), teacher.repeat(2, 1), 2.0).item() == (
        pytest.approx(4 * kl([0.75, 0.25], [0.5, 0.5]), rel=1e-5)
    )
    # the teacher is a target: no gradient flows into it
    teacher.requires_grad_(True)
    core.distillation_kl(student.requires_grad_(True), teacher, 2.0).backward()
    assert teacher.grad is None and student.grad.abs().sum() > 0


def test_lwf_is_distillation_at_temperature_two():
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 4), torch.randn(5, 4)
    assert baselines.lwf_loss(student, teacher).item() == pytest.approx(
        core.distillation_kl(student, teacher, temperature=2.0).item()
    )
    assert baselines.lwf_loss(student, teacher).item() != pytest.approx(
        core.distillation_kl(student, teacher, temperature=1.0).item()
    )


def test_derpp_matches_a_hand_computation():
    logits_a = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    stored = torch.tensor([[0.0, 2.0], [2.0, -1.0]])  # squared errors 1, 0, 4, 0 -> mean 1.25
    logits_b = torch.tensor([[math.log(3.0), 0.0]])  # CE with label 0: -log(3/4)
    labels_b = torch.tensor([0])
    got = baselines.derpp_loss(logits_a, stored, logits_b, labels_b, alpha=0.3, beta=2.0)
    assert got.item() == pytest.approx(0.3 * 1.25 + 2.0 * -math.log(0.75), rel=1e-5)


def test_ewc_penalty_weights_each_parameter_by_its_fisher():
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 3.0]]))
        net.bias.fill_(2.0)
    anchors = {"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([0.0])}
    fisher = {"weight": torch.tensor([[2.0, 0.5]]), "bias": torch.tensor([3.0])}
    # 1/2 (2 * 1 + 0.5 * 4 + 3 * 4)
    assert baselines.ewc_loss(net, anchors, fisher).item() == pytest.approx(0.5 * 16.0)
    # a parameter without a Fisher entry adds nothing
    del fisher["bias"]
    assert baselines.ewc_loss(net, anchors, fisher).item() == pytest.approx(0.5 * 4.0)


def test_empirical_fisher_is_the_mean_squared_gradient_over_batches():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])
    net.train()
    running = net[1].running_mean.clone()
    expected = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    net.eval()
    for start in (0, 4):  # batches of 4: [0, 4) and [4, 6)
        grads = torch.autograd.grad(
            F.cross_entropy(net(x[start : start + 4]), y[start : start + 4]), net.parameters()
        )
        for (n, _), g in zip(net.named_parameters(), grads, strict=True):
            expected[n] += g.pow(2) / 2
    net.train()
    fisher = baselines.empirical_fisher(net, x, y, batch=4)
    assert fisher.keys() == expected.keys()
    for n in expected:
        torch.testing.assert_close(fisher[n], expected[n])
    assert net.training  # its mode is restored, batch-norm statistics untouched, no grads left
    assert torch.equal(net[1].running_mean, running)
    assert all(p.grad is None for p in net.parameters())


def test_air_loss_matches_its_definition_step_by_step():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    old = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x_adv = torch.rand(5, 1, 2, 2) * 0.2 + 0.8  # near 1: the clip to [0, 1] binds
    logits, logits_adv = torch.randn(5, 3), torch.randn(5, 3)
    torch.manual_seed(7)
    got = baselines.air_loss(net, old, x_adv, logits, logits_adv, noise=0.3)
    torch.manual_seed(7)
    isotropic = (x_adv + 0.3 * torch.randn_like(x_adv)).clamp(0, 1)
    lam = torch.rand(5, 1, 1, 1)
    mixed = lam * x_adv + (1 - lam) * x_adv[torch.randperm(5)]
    pseudo = torch.cat([isotropic, mixed])
    with torch.no_grad():
        teacher = old(pseudo)
    expected = core.distillation_kl(net(pseudo), teacher, temperature=2.0)
    expected = expected + core.distillation_kl(logits_adv, logits, temperature=1.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    # the same model and the same clean/adversarial predictions: nothing to align
    assert baselines.air_loss(net, net, x_adv, logits, logits, noise=0.3).item() == (
        pytest.approx(0.0, abs=1e-6)
    )


def test_air_isotropic_replay_is_clipped_at_both_ends_of_the_box():
    """The test above clips at 1 only; here half the adversarial examples sit near 0."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    old = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x_adv = torch.cat([torch.rand(3, 1, 2, 2) * 0.1, torch.rand(3, 1, 2, 2) * 0.1 + 0.9])
    logits, logits_adv = torch.randn(6, 3), torch.randn(6, 3)
    torch.manual_seed(3)
    got = baselines.air_loss(net, old, x_adv, logits, logits_adv, noise=0.5)
    torch.manual_seed(3)
    isotropic = (x_adv + 0.5 * torch.randn_like(x_adv)).clamp(0, 1)
    assert isotropic.min() == 0 and isotropic.max() == 1  # both ends bind
    lam = torch.rand(6, 1, 1, 1)
    pseudo = torch.cat([isotropic, lam * x_adv + (1 - lam) * x_adv[torch.randperm(6)]])
    with torch.no_grad():
        teacher = old(pseudo)
    expected = core.distillation_kl(net(pseudo), teacher, temperature=2.0)
    expected = expected + core.distillation_kl(logits_adv, logits, temperature=1.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
