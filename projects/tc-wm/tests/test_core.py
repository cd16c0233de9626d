"""Value tests of TC-WM's math (tcwm.core)."""

import math

import pytest
import torch

from tcwm.core import (
    LinearProjection,
    ObservationEncoder,
    Predictor,
    StatePredictor,
    aligned_summary,
    cem_plan,
    critic_logits,
    dynamics_loss,
    info_nce,
    inverse_dynamics_loss,
    latent_cost,
    pca_directions,
    reconstruction_loss,
    temporal_smoothness,
    vc_regularizer,
)


@pytest.mark.parametrize("mode", ["learned", "random", "pca"])
def test_the_projection_is_exactly_linear_per_patch(mode):
    torch.manual_seed(0)
    projection = LinearProjection(12, 5, mode)
    x, y = torch.randn(3, 7, 12), torch.randn(3, 7, 12)
    combined = projection(2.0 * x - 3.0 * y)
    torch.testing.assert_close(combined, 2.0 * projection(x) - 3.0 * projection(y))
    torch.testing.assert_close(projection(torch.zeros(1, 12)), torch.zeros(1, 5))  # no bias
    # per patch: a token's latent does not depend on the other tokens
    moved = x.clone()
    moved[:, 1] += 5.0
    torch.testing.assert_close(projection(moved)[:, 0], projection(x)[:, 0])
    assert projection.weight.requires_grad == (mode == "learned")


def test_the_random_projection_has_orthonormal_rows():
    projection = LinearProjection(20, 6, "random")
    torch.testing.assert_close(
        projection.weight @ projection.weight.T, torch.eye(6), atol=1e-5, rtol=0
    )


def test_pca_projection_spans_the_top_principal_directions():
    torch.manual_seed(0)
    basis = torch.linalg.qr(torch.randn(10, 10))[0]
    scales = torch.tensor([8.0, 4.0, 2.0] + [0.1] * 7)
    data = (torch.randn(5000, 10) * scales) @ basis.T + 4.0  # the offset must not matter
    directions = pca_directions(data, 3)
    # the rows span the first three columns of the basis (up to sign)
    overlap = (directions @ basis[:, :3]).abs()
    torch.testing.assert_close(overlap, torch.eye(3), atol=0.03, rtol=0)
    projection = LinearProjection(10, 3, "pca")
    projection.set_pca(data)
    torch.testing.assert_close(projection.weight, directions)


def test_the_latent_must_be_smaller_than_the_embedding():
    with pytest.raises(ValueError, match="smaller"):
        LinearProjection(4, 8)


def test_aligned_summary_averages_the_first_channels_over_patches():
    z = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    torch.testing.assert_close(aligned_summary(z, 2), z[:, :, :2].mean(1))
    with pytest.raises(ValueError, match="aligned_dims"):
        aligned_summary(z, 5)


def test_info_nce_matches_a_hand_count():
    u = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    v = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    t = 0.5
    for critic in ("neg_sq_dist", "dot"):
        scores = [
            [
                -sum((a - b) ** 2 for a, b in zip(ui, vj, strict=True)) / t
                if critic == "neg_sq_dist"
                else sum(a * b for a, b in zip(ui, vj, strict=True)) / t
                for vj in v.tolist()
            ]
            for ui in u.tolist()
        ]
        rows = [-(s[i] - math.log(sum(math.exp(x) for x in s))) for i, s in enumerate(scores)]
        columns = [
            -(scores[i][i] - math.log(sum(math.exp(scores[j][i]) for j in range(3))))
            for i in range(3)
        ]
        expected = 0.5 * (sum(rows) / 3 + sum(columns) / 3)
        assert info_nce(u, v, t, critic).item() == pytest.approx(expected, rel=1e-5)
        torch.testing.assert_close(critic_logits(u, v, t, critic), torch.tensor(scores))


def test_info_nce_is_lowest_when_pairs_match():
    torch.manual_seed(0)
    v = torch.randn(16, 3)
    matched = info_nce(v.clone(), v, 0.1)
    shuffled = info_nce(v[torch.randperm(16)], v, 0.1)
    assert matched < 0.5 < shuffled


def test_reconstruction_and_dynamics_losses_by_value():
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 4.0]])
    assert reconstruction_loss(a, b).item() == pytest.approx((1 + 4) / 2)
    assert dynamics_loss(a, b).item() == pytest.approx(2.5)


def test_the_dynamics_target_is_stopped_only_when_asked():
    target = torch.tensor([1.0, 2.0], requires_grad=True)
    prediction = torch.zeros(2, requires_grad=True)
    dynamics_loss(prediction, target, stop_gradient=True).backward()
    assert target.grad is None and prediction.grad is not None
    dynamics_loss(prediction, target, stop_gradient=False).backward()
    torch.testing.assert_close(target.grad, torch.tensor([1.0, 2.0]))  # d/dt mean (p - t)^2 = t


def test_vc_regularizer_by_value():
    z = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # each column: variance 2, std sqrt(2 + eps)
    variance, covariance = vc_regularizer(z, eps=0.0)
    assert variance.item() == pytest.approx(0.0)  # std above 1: no penalty
    assert covariance.item() == pytest.approx(2 * 2.0**2 / 2)  # off-diagonal cov 2, twice, / d
    shrunk, _ = vc_regularizer(0.1 * z, eps=0.0)
    assert shrunk.item() == pytest.approx(1 - 0.1 * math.sqrt(2))


def test_temporal_smoothness_by_value():
    z = torch.tensor([[[0.0, 0.0], [1.0, 2.0], [1.0, 2.0]]])  # [B=1, T=3, d=2]
    assert temporal_smoothness(z).item() == pytest.approx((1 + 4 + 0) / 2)  # mean over 2 steps


def test_inverse_dynamics_loss_reads_both_frames():
    head = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))  # a = z_next[0] - z_t[0]
    z_t, z_next = torch.tensor([[1.0, 5.0]]), torch.tensor([[3.0, -5.0]])
    assert inverse_dynamics_loss(head, z_t, z_next, torch.tensor([[2.0]])).item() == 0.0
    assert inverse_dynamics_loss(head, z_t, z_next, torch.tensor([[0.0]])).item() == 4.0


def test_the_observation_encoder_reads_the_whole_frame():
    torch.manual_seed(0)
    encoder = ObservationEncoder(n_tokens=3, embed_dim=4, latent_dim=5)
    tokens = torch.randn(2, 7, 3, 4)
    z = encoder(tokens)
    assert z.shape == (2, 7, 1, 5)
    moved = tokens.clone()
    moved[..., 2, :] += 1.0  # the last patch only
    assert not torch.allclose(encoder(moved), z)


def test_cem_finds_the_minimum_of_a_quadratic():
    target = torch.tensor([[0.3, -0.6], [0.8, 0.1], [-0.2, 0.5]])
    plan = cem_plan(
        lambda a: (a - target).pow(2).flatten(1).sum(1),
        action_dim=2,
        horizon=3,
        samples=256,
        iterations=10,
        elites=32,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(plan, target, atol=0.05, rtol=0)


def test_cem_keeps_actions_in_bounds():
    plan = cem_plan(lambda a: -a.sum((1, 2)), 2, 4, generator=torch.Generator().manual_seed(0))
    assert plan.max() <= 1.0 and plan.min() > 0.9  # pushed to the upper bound, not beyond


def test_latent_cost_full_aligned_and_weighted_by_value():
    goal = torch.zeros(2, 3)  # P=2 tokens, d=3 channels
    latent = torch.tensor([[[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]]])
    assert latent_cost(latent, goal).item() == pytest.approx((1 + 4 + 9) / 6)
    # aligned: the patch mean of channel 0 is 2, of channel 1 is 0 -> 4
    assert latent_cost(latent, goal, aligned_dims=2).item() == pytest.approx(4.0)
    # plus 0.5 times the mean square of the context channel (2^2 + 0) / 2
    assert latent_cost(latent, goal, 2, context_weight=0.5).item() == pytest.approx(4.0 + 1.0)


def test_the_predictor_is_a_residual_on_the_last_frame():
    torch.manual_seed(0)
    predictor = Predictor(dim=6, n_tokens=3, action_dim=2, history=2, width=16, layers=1)
    torch.nn.init.zeros_(predictor.out.weight)
    torch.nn.init.zeros_(predictor.out.bias)
    hist = torch.randn(4, 2, 3, 6)
    nxt, proprio = predictor(hist, torch.randn(4, 2))
    torch.testing.assert_close(nxt, hist[:, -1])
    assert proprio is None
    with pytest.raises(ValueError, match="history"):
        predictor(hist[:, :1], torch.randn(4, 2))


def test_the_predictor_uses_the_action_and_the_proprio_token():
    torch.manual_seed(0)
    predictor = Predictor(
        dim=4, n_tokens=2, action_dim=2, history=1, width=16, layers=1, proprio_dim=3
    )
    hist, proprio = torch.randn(5, 1, 2, 4), torch.randn(5, 1, 3)
    first, p1 = predictor(hist, torch.zeros(5, 2), proprio)
    second, p2 = predictor(hist, torch.ones(5, 2), proprio)
    assert not torch.allclose(first, second) and not torch.allclose(p1, p2)
    assert p1.shape == (5, 3)


def test_the_state_predictor_is_a_residual():
    predictor = StatePredictor(4, 2, history=2)
    torch.nn.init.zeros_(predictor.net[-1].weight)
    torch.nn.init.zeros_(predictor.net[-1].bias)
    s = torch.randn(3, 2, 4)
    torch.testing.assert_close(predictor(s, torch.randn(3, 2)), s[:, -1])
