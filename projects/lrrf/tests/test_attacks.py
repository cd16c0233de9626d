"""Every attack stays in its budget and [0, 1], lowers a trained model's accuracy, and its random
start is seeded; bad input is a clear error."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchattacks

from lrrf import attacks
from lrrf.attacks import Budget, _torchattack, make_attack, perturbation_norm
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


@pytest.fixture(scope="module")
def untrained():
    """The same CNN (with batch norm) untrained and 32 random images: for the tests that need
    any model, not a good one (the mutation lane runs these, not the one that trains)."""
    torch.manual_seed(0)
    net = build_network("small_cnn", 1, 8, 10, 16, 64, [0.3], [0.38]).eval()
    return net, torch.rand(32, 1, 8, 8), torch.arange(32) % 10


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
def test_random_starts_are_seeded(untrained, name):
    net, x, y = untrained
    attack = make_attack(name, Budget(BUDGETS[name], steps=1))
    a, b = attack(net, x, y, seed=5), attack(net, x, y, seed=5)
    c = attack(net, x, y, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_attack_restores_training_mode_and_batchnorm_statistics(untrained):
    net, x, y = untrained
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    make_attack("linf", Budget(0.2, steps=3))(net, x, y, seed=0)
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    net.eval()


def test_bad_attack_inputs_are_clear_errors(untrained):
    net, x, y = untrained
    with pytest.raises(ValueError, match="unknown attack"):
        make_attack("pgd_l7", Budget(0.1))
    with pytest.raises(ValueError, match="must be positive"):
        make_attack("l2", Budget(0.0))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        make_attack("linf", Budget(0.1))(net, x * 255, y)


def two_class_linear(v: torch.Tensor) -> torch.nn.Module:
    """Logits (0, v . x): for label 0 the input gradient of the cross-entropy is p1 * v."""
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(v.numel(), 2, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.stack([torch.zeros_like(v), v]))
    return net.eval()


def test_sparse_l1_pgd_matches_a_hand_computation():
    """Top-2 of 6 coordinates a step of L1 length 0.5; the third step finds coordinates 1 and 3
    at the box, moves 0 and 5 instead, and is projected back onto the L1 ball of radius 1."""
    net = two_class_linear(torch.tensor([0.5, -3.0, 0.2, 2.0, 0.1, -1.0]))
    x, y = torch.full((1, 1, 2, 3), 0.5), torch.tensor([0])
    budget = dict(eps=1.0, step_fraction=0.5, sparsity=2 / 6, random_start=False)
    expected = {
        1: [0.5, 0.25, 0.5, 0.75, 0.5, 0.5],
        2: [0.5, 0.0, 0.5, 1.0, 0.5, 0.5],  # on the sphere and at the box
        3: [0.625, 0.125, 0.5, 0.875, 0.5, 0.375],  # |delta| (0.25, .5, .5, .25) - 0.125
    }
    for steps, want in expected.items():
        x_adv = make_attack("l1", Budget(steps=steps, **budget))(net, x, y)
        torch.testing.assert_close(x_adv.flatten(), torch.tensor(want))
    # a step longer than the radius is projected back onto the ball
    x_adv = make_attack("l1", Budget(1.0, 1, 3.0, 2 / 6, False))(net, x, y)
    torch.testing.assert_close(x_adv.flatten(), torch.tensor([0.5, 0.0, 0.5, 1.0, 0.5, 0.5]))


def test_sparse_l1_random_start_stays_in_the_box_and_the_ball():
    net = two_class_linear(torch.zeros(64))  # zero gradient: only the start moves x
    x, y = torch.rand(20, 1, 8, 8), torch.zeros(20, dtype=torch.long)
    x_adv = make_attack("l1", Budget(2.5, steps=1))(net, x, y, seed=0)
    delta = (x_adv - x).flatten(1)
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert (delta.abs().sum(1) <= 2.5 + 1e-5).all() and (delta.abs().sum(1) > 0).all()


def test_perturbation_norm_uses_the_attack_norm():
    x = torch.zeros(1, 1, 1, 3)
    x_adv = torch.tensor([[[[0.3, -0.4, 0.0]]]])
    for name, value in {"linf": 0.4, "fgsm": 0.4, "square": 0.4, "l2": 0.5, "l1": 0.7}.items():
        assert perturbation_norm(name, x, x_adv).item() == pytest.approx(value)


def test_torchattacks_get_the_budget():
    net = two_class_linear(torch.ones(4))
    budget = Budget(0.3, steps=7, step_fraction=0.5)
    for name, cls in (("linf", torchattacks.PGD), ("l2", torchattacks.PGDL2)):
        attack = _torchattack(name, net, budget, 10)
        assert isinstance(attack, cls) and attack.random_start
        assert (attack.eps, attack.alpha, attack.steps) == (0.3, 0.15, 7)
    assert _torchattack("fgsm", net, budget, 10).eps == 0.3
    square = _torchattack("square", net, budget, 10)
    assert (square.eps, square.n_queries, square.n_restarts, square.seed) == (0.3, 7, 1, 0)
    assert square.norm == "Linf"
    auto = _torchattack("autoattack", net, budget, 100)
    assert (auto.norm, auto.eps, auto.n_classes, auto.seed) == ("Linf", 0.3, 100, 0)
    assert not _torchattack("linf", net, Budget(0.3, random_start=False), 10).random_start
    built = make_attack("autoattack", budget, num_classes=100)
    assert built.name == "autoattack" and built.budget == budget


def test_budget_bounds_are_clear_errors_and_the_global_generator_is_untouched():
    for bad in (Budget(0.1, steps=0), Budget(0.1, sparsity=0.0), Budget(0.1, sparsity=1.5),
                Budget(0.1, step_fraction=0.0)):  # fmt: skip
        with pytest.raises(ValueError, match="steps must be"):
            make_attack("l1", bad)
    attack = make_attack("l1", Budget(0.5, steps=1, sparsity=1.0))  # sparsity 1 is allowed
    net = two_class_linear(torch.ones(4))
    x, y = torch.full((2, 1, 2, 2), 0.5), torch.zeros(2, dtype=torch.long)
    state = torch.get_rng_state()
    attack(net, x, y, seed=3)
    assert torch.equal(state, torch.get_rng_state())
    inside = torch.zeros(2, 1, 2, 2)
    inside[0, 0, 0, 0] = 1.0  # the box bounds themselves are valid inputs
    attack(net, inside, y)


# ---------------------------------------------------------------- value tests for the survivors
# of the mutation lane (README, "Mutation lane").


def test_inputs_just_above_one_are_rejected_with_the_full_message(untrained):
    net, x, y = untrained
    with pytest.raises(ValueError) as error:
        make_attack("linf", Budget(0.1))(net, torch.full_like(x, 0.5) + 0.6 * (x > 0.5), y)
    assert str(error.value).endswith(
        "): normalisation is a layer of the model; pass raw pixel intensities scaled to [0, 1]"
    )
    assert "max 1.1" in str(error.value)


def test_unknown_attack_lists_the_attacks_and_num_classes_reaches_the_attack(monkeypatch):
    with pytest.raises(ValueError) as error:
        make_attack("pgd_l7", Budget(0.1))
    assert str(error.value).endswith("choose from linf, l2, l1, fgsm, square, autoattack")
    seen = []

    def spy(name, model, budget, num_classes):
        seen.append(num_classes)
        return lambda x, y: x

    monkeypatch.setattr(attacks, "_torchattack", spy)
    net = two_class_linear(torch.ones(4))
    x, y = torch.full((2, 1, 2, 2), 0.5), torch.zeros(2, dtype=torch.long)
    make_attack("autoattack", Budget(0.1))(net, x, y)
    make_attack("autoattack", Budget(0.1), num_classes=100)(net, x, y)
    assert seen == [10, 100]  # the default is the digits' (and CIFAR-10's) 10 classes


def test_torchattacks_get_the_model_the_class_and_the_start_flag():
    net = two_class_linear(torch.ones(4))
    budget = Budget(0.3, steps=7, step_fraction=0.5, random_start=False)
    classes = {"linf": torchattacks.PGD, "l2": torchattacks.PGDL2, "fgsm": torchattacks.FGSM,
               "square": torchattacks.Square, "autoattack": torchattacks.AutoAttack}  # fmt: skip
    for name, cls in classes.items():
        attack = _torchattack(name, net, budget, 10)
        assert type(attack) is cls and attack.model is net, name
    assert not _torchattack("l2", net, budget, 10).random_start


def test_perturbation_norm_is_per_item_of_the_difference():
    x = torch.tensor([[[[0.5, 0.5, 0.0]]], [[[0.2, 0.0, 0.0]]]])
    x_adv = x + torch.tensor([[[[0.3, -0.4, 0.0]]], [[[0.0, 0.1, 0.0]]]])
    for name, value in {"linf": [0.4, 0.1], "l2": [0.5, 0.1], "l1": [0.7, 0.1]}.items():
        torch.testing.assert_close(perturbation_norm(name, x, x_adv), torch.tensor(value))


def test_sparse_l1_step_skips_coordinates_at_the_box_and_clips_the_step():
    """One step, no random start, small gradients (|grad| < 1): coordinate 0 sits at 1 with a
    positive gradient (blocked), coordinate 1 at 0 with a positive gradient (free to move up).
    The top 4 of the free coordinates (1, 2, 3, 4) move by step / 4 = 0.25 (step = 0.5 * 2);
    coordinates 2 and 3 overshoot the box and are clipped to it."""
    net = two_class_linear(torch.tensor([0.3, 0.2, 0.15, -0.12, 0.05, 0.01]))
    x, y = torch.tensor([[[[1.0, 0.0, 0.9], [0.1, 0.5, 0.5]]]]), torch.tensor([0])
    budget = Budget(eps=2.0, steps=1, step_fraction=0.5, sparsity=4 / 6, random_start=False)
    x_adv = make_attack("l1", budget)(net, x, y)
    torch.testing.assert_close(x_adv.flatten(), torch.tensor([1.0, 0.25, 1.0, 0.0, 0.75, 0.5]))


def sparse_l1_pgd_reference(v, x, eps, steps, step_fraction, sparsity, seed, project):
    """The sparse L1 PGD against two_class_linear(v) with label 0, written plainly per item:
    the input gradient is sigmoid(v . x') v; the start is noise / ||noise||_1 * eps * U(0, 1)
    per item, clipped to the box; ``project`` is the sort-based L1 projection (conftest)."""
    torch.manual_seed(seed)
    flat = x.flatten(1)
    noise = torch.randn_like(flat).numpy()
    lengths = eps * torch.rand(len(flat), 1, dtype=x.dtype).numpy()
    flat, v = flat.numpy(), v.numpy()
    k = max(1, round(sparsity * flat.shape[1]))
    out = []
    for xi, ni, li in zip(flat, noise, lengths, strict=True):
        delta = np.clip(xi + ni / np.abs(ni).sum() * li, 0, 1) - xi
        for _ in range(steps):
            grad = v / (1 + np.exp(-(v @ (xi + delta))))
            point = xi + delta
            grad[((point >= 1) & (grad > 0)) | ((point <= 0) & (grad < 0))] = 0
            top = np.argsort(-np.abs(grad), kind="stable")[:k]
            direction = np.zeros_like(grad)
            direction[top] = np.sign(grad[top]) / k
            delta = project(delta + step_fraction * eps * direction, eps)
            delta = np.clip(xi + delta, 0, 1) - xi
        out.append(xi + delta)
    return torch.from_numpy(np.stack(out)).view_as(x)


def test_sparse_l1_pgd_with_a_random_start_matches_a_plain_reference(reference_l1_projection):
    """float64 throughout (the start's draws follow the input's dtype), four coordinates per
    item, inputs near both ends of the box (noise of L1 norm below 1: the next test)."""
    torch.manual_seed(0)
    v = torch.tensor([0.8, -0.5, 0.3, -0.05], dtype=torch.float64)
    net = two_class_linear(v).double()
    x = torch.cat([torch.rand(8, 1, 2, 2) * 0.15, torch.rand(8, 1, 2, 2) * 0.15 + 0.85]).double()
    y = torch.zeros(16, dtype=torch.long)
    budget = Budget(eps=0.6, steps=3, step_fraction=0.5, sparsity=0.5)
    x_adv = make_attack("l1", budget)(net, x, y, seed=11)
    want = sparse_l1_pgd_reference(v, x, 0.6, 3, 0.5, 0.5, 11, reference_l1_projection)
    torch.testing.assert_close(x_adv, want, rtol=0, atol=1e-12)


def test_sparse_l1_random_start_has_the_drawn_l1_length_even_for_short_noise():
    """One coordinate per item and a flat model (zero gradient, so the start is the result): the
    start is noise / ||noise||_1 * eps * U(0, 1), of L1 length exactly the uniform draw, also
    where |noise| < 1 (the normalising guard must not bind there)."""
    net = two_class_linear(torch.zeros(1))
    x, y = torch.full((64, 1, 1, 1), 0.5), torch.zeros(64, dtype=torch.long)
    x_adv = make_attack("l1", Budget(eps=0.4, steps=1, sparsity=1.0))(net, x, y, seed=3)
    torch.manual_seed(3)
    noise = torch.randn(64, 1)
    length = 0.4 * torch.rand(64, 1)
    assert (noise.abs() < 1).sum() > 10  # the case this test is about occurs
    torch.testing.assert_close((x_adv - x).flatten(1), noise.sign() * length)
