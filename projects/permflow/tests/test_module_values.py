"""The default training path by value (issue 50): what ``configs/default.yaml`` trains and
samples, against hand computations that use core.py for nothing.

The default is PermFlow with the nearest-target coupling, t = u^2, the row-softmax endpoint
trained by cross-entropy, and an Euler sampler with the projector and a Hungarian decode. Each
test redraws the module's random numbers from the same seed and recomputes Eq. (4)-(9) with
plain tensor algebra and scipy's assignment solver."""

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment


def centring(n: int) -> torch.Tensor:
    return torch.eye(n) - torch.full((n, n), 1.0 / n)


def one_hot_targets(batch) -> torch.Tensor:
    n = batch["optima"].shape[-1]
    return torch.eye(n)[batch["optima"].long()]  # [B, K, n, n]: row i has a 1 at perm[i]


def nearest_valid(x0: torch.Tensor, targets: torch.Tensor, num_valid: torch.Tensor):
    """Eq. (5) by a loop: the valid target with the largest <x0, P>."""
    chosen = []
    for b in range(len(x0)):
        scores = [float((x0[b] * targets[b, k]).sum()) for k in range(int(num_valid[b]))]
        chosen.append(int(np.argmax(scores)))
    return targets[torch.arange(len(x0)), torch.tensor(chosen)], chosen


def with_two_valid_orders(batch):
    """The batch with two valid targets per sequence (its first optimum and that order with
    its first two ranks swapped), so that the coupling's choice matters."""
    first = batch["optima"][:, 0]
    swapped = first.clone()
    swapped[:, [0, 1]] = first[:, [1, 0]]
    return {
        **batch,
        "optima": torch.stack([first, swapped], dim=1),
        "num_valid": torch.full_like(batch["num_valid"], 2),
    }


def test_training_loss_is_eq_4_to_7_by_hand(default_model_and_batch):
    model, batch = default_model_and_batch
    batch = with_two_valid_orders(batch)
    n, sigma = model.hparams.n, model.hparams.sigma
    b = len(batch["num_valid"])
    torch.manual_seed(11)
    loss = model.training_loss(batch)

    torch.manual_seed(11)  # the module draws G for x0 first, then u for t
    h = centring(n)
    x0 = 1.0 / n + h @ (sigma * torch.randn(b, n, n)) @ h  # Eq. (4)
    t = torch.rand(b) ** 2  # t = u^2
    x1, chosen = nearest_valid(x0, one_hot_targets(batch), batch["num_valid"])
    assert 0 < sum(chosen) < b  # both targets occur: a coupling that ignores x0 would differ
    x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * x1  # Eq. (6)
    with torch.no_grad():
        logits = model.net(model.net.encode_items(batch["condition"]), x_t, t)
    expected = -(x1 * torch.log_softmax(logits, dim=-1)).sum() / (b * n)  # Eq. (7), softmax form
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize(
    "prediction, coupling, project",
    [
        ("endpoint", "nearest", True),
        ("endpoint", "nearest", False),
        ("velocity", "nearest", True),
        ("velocity", "nearest", False),
        ("endpoint_softmax", "independent", True),
    ],
)
def test_training_loss_of_the_other_objectives_by_hand(
    default_model_and_batch, prediction, coupling, project
):
    """The labelled alternatives to the default objective, through the same module and network
    (their net is the default's: only the loss differs): the linear endpoint with its projected
    squared error, the velocity form of Eq. (7), each with and without the projector, and the
    independent coupling (a valid order drawn uniformly, after x0 and t)."""
    model, batch = default_model_and_batch
    batch = with_two_valid_orders(batch)
    hp = model.hparams
    saved = (hp.prediction, hp.coupling, hp.project)
    hp.prediction, hp.coupling, hp.project = prediction, coupling, project
    try:
        n, sigma = hp.n, hp.sigma
        b = len(batch["num_valid"])
        torch.manual_seed(11)
        loss = model.training_loss(batch)

        torch.manual_seed(11)  # G for x0, u for t, then (independent coupling) u for the order
        h = centring(n)
        x0 = 1.0 / n + h @ (sigma * torch.randn(b, n, n)) @ h  # Eq. (4)
        t = torch.rand(b) ** 2
        targets = one_hot_targets(batch)
        if coupling == "nearest":
            x1, _ = nearest_valid(x0, targets, batch["num_valid"])
        else:
            chosen = (torch.rand(b) * 2).long()  # two valid orders per sequence
            assert 0 < int(chosen.sum()) < b
            x1 = targets[torch.arange(b), chosen]
        x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * x1
        with torch.no_grad():
            output = model.net(model.net.encode_items(batch["condition"]), x_t, t)

        def projected(v):
            return h @ v @ h if project else v

        if prediction == "endpoint":
            expected = projected(output - x1).pow(2).mean()
        elif prediction == "velocity":
            expected = (projected(output) - (x1 - x0)).pow(2).mean()
        else:
            expected = -(x1 * torch.log_softmax(output, dim=-1)).sum() / (b * n)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    finally:
        hp.prediction, hp.coupling, hp.project = saved


@pytest.mark.parametrize(
    "method, loss_kind", [("sinkhorn", "mse"), ("sinkhorn", "ce"), ("gumbel_sinkhorn", "mse")]
)
def test_training_loss_of_the_sinkhorn_baselines_by_hand(
    default_model_and_batch, method, loss_kind
):
    """The baselines' training step: one valid order drawn uniformly as the label, Sinkhorn
    normalisation of the network's logits / tau (Gumbel-Sinkhorn: of (logits + s g) / tau, with
    the noise scale s = gumbel_noise and tau at its start value outside a fit), and the MSE or
    cross-entropy to the label."""
    from permflow.model import PermutationModel

    _, batch = default_model_and_batch
    batch = with_two_valid_orders(batch)
    torch.manual_seed(0)
    model = PermutationModel(
        method=method, width=16, image_dim=16, channels=(4, 8), sinkhorn_tau=0.7,
        sinkhorn_iters=5, sinkhorn_loss=loss_kind, gumbel_noise=0.5,
    )  # fmt: skip
    n, b, tau = model.hparams.n, len(batch["num_valid"]), 0.7
    torch.manual_seed(5)
    loss = model.training_loss(batch)

    torch.manual_seed(5)  # u for the label first, then (Gumbel) the noise
    chosen = (torch.rand(b) * 2).long()
    assert 0 < int(chosen.sum()) < b
    label = one_hot_targets(batch)[torch.arange(b), chosen]
    with torch.no_grad():
        logits = model.net(model.net.encode_items(batch["condition"]))
    if method == "gumbel_sinkhorn":
        u = torch.rand(b, n, n)
        logits = logits - 0.5 * torch.log(-torch.log(u + 1e-10) + 1e-10)  # gumbel_noise 0.5
    log_s = logits / tau
    for _ in range(5):
        log_s = log_s - torch.logsumexp(log_s, dim=-1, keepdim=True)
        log_s = log_s - torch.logsumexp(log_s, dim=-2, keepdim=True)
    if loss_kind == "mse":
        expected = (log_s.exp() - label).pow(2).mean()
    else:
        expected = -(label * log_s).sum() / (b * n)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("sampling", ["early", "uniform", "logit_normal"])
def test_draw_training_noise_draws_t_by_the_named_law(default_model_and_batch, sampling):
    """t = u^2 (default), t = u, or t = sigmoid(z) with z standard normal (drawn after u), from
    the global generator right after the base's G."""
    model, _ = default_model_and_batch
    hp = model.hparams
    saved = hp.time_sampling
    hp.time_sampling = sampling
    try:
        torch.manual_seed(3)
        x0, t = model.draw_training_noise(64)
        torch.manual_seed(3)
        h = centring(hp.n)
        expected_x0 = 1.0 / hp.n + h @ (hp.sigma * torch.randn(64, hp.n, hp.n)) @ h
        u = torch.rand(64)
        expected = {"early": u**2, "uniform": u, "logit_normal": torch.sigmoid(torch.randn(64))}
        torch.testing.assert_close(x0, expected_x0)
        torch.testing.assert_close(t, expected[sampling])
    finally:
        hp.time_sampling = saved


def test_the_base_has_the_law_of_eq_4():
    """x0 = J/n + sigma H G H: mean J/n, entry variance sigma^2 ((n-1)/n)^2, and the covariance
    of two entries of one row -sigma^2 (n-1)/n^2 (H is a symmetric idempotent, H_00 = 1 - 1/n,
    H_01 = -1/n)."""
    from permflow import core

    n, sigma = 5, 0.45
    x0 = core.sample_base(200_000, n, sigma, torch.Generator().manual_seed(0)).double()
    centred = x0 - 1.0 / n
    assert centred.mean().abs() < 2e-3
    variance = centred[:, 0, 0].var().item()
    assert variance == pytest.approx(sigma**2 * ((n - 1) / n) ** 2, rel=0.02)
    covariance = (centred[:, 0, 0] * centred[:, 0, 1]).mean().item()
    assert covariance == pytest.approx(-(sigma**2) * (n - 1) / n**2, rel=0.03)


@pytest.mark.parametrize("temperature", [None, 0.25])
def test_sample_permutations_is_euler_on_the_softmax_endpoint_then_hungarian(
    default_model_and_batch, temperature
):
    """The default sampler (``temperature`` None: the default config's 1.0) and the sharpened
    endpoint softmax(logits / 0.25) (issue 50's option against the chain's drift)."""
    model, batch = default_model_and_batch
    n, sigma, steps, m = model.hparams.n, model.hparams.sigma, model.hparams.steps, 3
    b = len(batch["num_valid"])
    perms, stats = model.sample_permutations(
        batch, m, torch.Generator().manual_seed(4), temperature=temperature
    )

    h = centring(n)
    x = (
        1.0 / n
        + h @ (sigma * torch.randn(b * m, n, n, generator=torch.Generator().manual_seed(4))) @ h
    )
    x_start = x.clone()
    with torch.no_grad():
        feats = model.net.encode_items(batch["condition"]).repeat_interleave(m, dim=0)
        for k in range(steps):  # Eq. (8), Euler, the field projected onto T_n
            t = torch.full((b * m,), k / steps)
            endpoint = (model.net(feats, x, t) / (temperature or 1.0)).softmax(dim=-1)
            velocity = (endpoint - x) / (1 - t).view(-1, 1, 1)
            x = x + (h @ velocity @ h) / steps
    expected = np.stack(
        [linear_sum_assignment(matrix.numpy(), maximize=True)[1] for matrix in x]
    )  # Eq. (9)
    np.testing.assert_array_equal(perms, expected.reshape(b, m, n))
    if temperature is not None:  # the option acts: the same draws decode differently
        default, _ = model.sample_permutations(batch, m, torch.Generator().manual_seed(4))
        assert (default != perms).any()
    sums = torch.cat([x.sum(-1), x.sum(-2)], dim=-1)
    violation = (sums - 1).abs().amax(-1).view(b, m).amax(1)
    np.testing.assert_allclose(stats["violation"], violation.numpy(), atol=1e-6)
    targets = one_hot_targets(batch).repeat_interleave(m, dim=0)
    _, nearest = nearest_valid(x_start, targets, batch["num_valid"].repeat_interleave(m))
    np.testing.assert_array_equal(stats["nearest"], np.array(nearest).reshape(b, m))


def test_one_hot_targets_are_the_rows_permutation_matrices():
    """The hand computations' target matrices: row i of P has its 1 in column perm[i]."""
    perms = torch.tensor([list(p) for p in itertools.permutations(range(3))])
    for perm, matrix in zip(perms, torch.eye(3)[perms], strict=True):
        assert all(matrix[i, int(perm[i])] == 1 and matrix[i].sum() == 1 for i in range(3))


def test_coupling_shares_count_invalid_samples_as_zero_or_leave_them_out():
    """One ambiguous input, 4 samples: order A (assigned A), order B (assigned A), an invalid
    sample, order B (assigned B). Among all samples 2/4 follow the coupling; among the 3 valid
    ones 2/3. A field that ignores x0 but is valid half the time scores 0.25 and 0.5."""
    from permflow.evaluate import permutation_metrics

    order_a, order_b, invalid = [0, 1, 2], [1, 0, 2], [2, 2, 2]
    metrics = permutation_metrics(
        samples=np.array([[order_a, order_b, invalid, order_b]]),
        optima=np.array([[order_a, order_b]]),
        num_valid=np.array([2]),
        nearest=np.array([[0, 0, 1, 1]]),
    )
    assert metrics["coupling"].tolist() == [0.5]
    assert metrics["coupling_valid"].tolist() == pytest.approx([2 / 3])
    assert metrics["valid_rate"].tolist() == [0.75]


class StubEndpointNet(torch.nn.Module):
    """An endpoint field that returns ``scale`` times the one-hot matrix ``pick(x_t)``."""

    def __init__(self, pick, scale: float = 20.0):
        super().__init__()
        self.pick, self.scale = pick, scale

    def encode_items(self, condition):
        return condition

    def forward(self, features, x, t):
        return self.scale * self.pick(x)


def test_early_fit_scores_the_endpoint_cross_entropy_and_the_coupled_decode(
    default_model_and_batch,
):
    from permflow.evaluate import early_fit

    model, batch = default_model_and_batch
    n = model.hparams.n
    unambiguous = {**batch, "num_valid": torch.ones_like(batch["num_valid"])}
    targets = one_hot_targets(unambiguous)[:, 0]  # [B, n, n]
    real_net = model.net
    try:
        # the right endpoint at every x_t: cross-entropy log(1 + (n-1) e^-20) per row (0 in
        # float32), decoded
        model.net = StubEndpointNet(lambda x: targets)
        fit = early_fit(model, [unambiguous], draws=2)
        assert fit["cross_entropy_all"] == pytest.approx(0.0, abs=1e-6)
        assert fit["decodes_to_coupled_all"] == 1.0
        assert fit["decodes_to_coupled_unambiguous"] == 1.0
        assert "cross_entropy_ambiguous" not in fit
        # uniform logits: cross-entropy log n exactly
        model.net = StubEndpointNet(lambda x: torch.zeros_like(x))
        assert early_fit(model, [unambiguous])["cross_entropy_all"] == pytest.approx(np.log(n))
        # each row's target one column over (a derangement): every decode is wrong, and the
        # target's logit is 20 below the top one in every row (20 + log(1 + (n-1) e^-20))
        model.net = StubEndpointNet(lambda x: targets.roll(1, dims=-1))
        wrong = early_fit(model, [unambiguous])
        assert wrong["decodes_to_coupled_all"] == 0.0
        assert wrong["cross_entropy_all"] == pytest.approx(20.0, abs=1e-5)
        # two valid orders: a field that returns the valid order nearest to x_t decodes to the
        # coupled one (nearest to x0) when t is so small that x_t is x0 to rounding; one that
        # always returns the first order is right only where the coupling chose it
        ambiguous = with_two_valid_orders(batch)
        both = one_hot_targets(ambiguous)  # [B, 2, n, n]

        def nearest_order(x):
            return nearest_valid(x, both, ambiguous["num_valid"])[0]

        model.net = StubEndpointNet(nearest_order)
        routed = early_fit(model, [ambiguous], t_max=1e-9, draws=4)
        assert routed["decodes_to_coupled_ambiguous"] == 1.0
        model.net = StubEndpointNet(lambda x: both[:, 0])
        first = early_fit(model, [ambiguous], t_max=1e-9, draws=4)
        assert 0.0 < first["decodes_to_coupled_ambiguous"] < 1.0
    finally:
        model.net = real_net
