"""The RLA math against closed forms, hand counts and short fits."""

from __future__ import annotations

import pytest
import torch

from rlawm import core
from rlawm.baselines import RegressionWorldModel, RLARegressor, TokenFlowWorldModel, persistence

L, C, A, H = 16, 12, 2, 4


def tokens(batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, L, C, generator=g)


def test_encoder_input_is_the_residual_and_zero_for_a_static_scene():
    x_t, x_next = tokens(seed=0), tokens(seed=1)
    assert torch.equal(core.encoder_input(x_t, x_next, "sub"), x_next - x_t)
    assert torch.count_nonzero(core.encoder_input(x_t, x_t, "sub")) == 0
    concat = core.encoder_input(x_t, x_next, "concat")
    assert concat.shape == (4, L, 2 * C) and torch.equal(concat[..., C:], x_next)
    with pytest.raises(ValueError, match="differ"):
        core.encoder_input(x_t, x_next[:, :-1], "sub")
    with pytest.raises(ValueError, match="unknown residual mode"):
        core.encoder_input(x_t, x_next, "append")


def test_static_scene_gives_one_latent_whatever_the_frame():
    """The encoder sees only the residual: every static pair maps to the same z."""
    model = core.RLAAutoencoder(C, L, width=16, depth=1, heads=2, latent_tokens=2, latent_dim=3)
    a, b = tokens(seed=0), tokens(seed=5)
    z_a, _ = model.encode(a, a)
    z_b, _ = model.encode(b, b)
    torch.testing.assert_close(z_a, z_b)
    concat = core.RLAAutoencoder(C, L, width=16, depth=1, heads=2, mode="concat")
    assert not torch.allclose(concat.encode(a, a)[0], concat.encode(b, b)[0])


def test_reconstruction_loss_is_weighted_l1_plus_mse():
    prediction, target = torch.tensor([1.0, -2.0]), torch.tensor([0.0, 0.0])
    # L1 mean 1.5, MSE mean 2.5
    assert core.rla_reconstruction_loss(prediction, target, 2.0, 3.0).item() == pytest.approx(10.5)


def test_vector_quantize_picks_the_nearest_code_with_a_straight_through_gradient():
    codebook = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    z = torch.tensor([[[1.0, 1.0], [9.0, 8.0]]], requires_grad=True)
    quantised, loss = core.vector_quantize(z, codebook, beta=0.5)
    assert torch.equal(quantised.detach(), torch.tensor([[[0.0, 0.0], [10.0, 10.0]]]))
    # |sg(z) - e|^2 + beta |z - sg(e)|^2 with mean over 4 entries of (1, 1, 1, 4)
    assert loss.item() == pytest.approx(1.75 + 0.5 * 1.75)
    quantised.sum().backward()
    assert torch.equal(z.grad, torch.ones_like(z))


def test_vector_quantize_on_more_tokens_than_channels_and_its_default_beta():
    codebook = torch.tensor([[0.0, 0.0, 0.0], [6.0, 6.0, 6.0]])
    z = torch.tensor([[[1.0, 1.0, 1.0], [5.0, 5.0, 5.0]]]).repeat(1, 2, 1)  # [1, 4 tokens, 3]
    quantised, loss = core.vector_quantize(z, codebook)
    assert torch.equal(quantised[0, :, 0], torch.tensor([0.0, 6.0, 0.0, 6.0]))
    assert loss.item() == pytest.approx(1.0 + 0.25 * 1.0)  # every entry is 1 from its code


def test_interpolant_and_target_match_the_rectified_flow_closed_form():
    z, noise = torch.full((2, 3, 4), 2.0), torch.full((2, 3, 4), -2.0)
    tau = torch.tensor([0.25, 1.0])
    z_tau = core.flow_interpolant(z, noise, tau)
    assert torch.allclose(z_tau[0], torch.full((3, 4), 0.75 * -2.0 + 0.25 * 2.0))
    assert torch.allclose(z_tau[1], z[1])
    assert torch.equal(core.flow_target(z, noise), z - noise)
    assert core.flow_matching_loss(z - noise, z, noise).item() == 0.0
    assert core.flow_matching_loss(z - noise + 1.0, z, noise).item() == pytest.approx(1.0)


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_euler_lands_on_the_point_the_exact_velocity_points_to(steps):
    """For a point mass at z*, v(z, tau) = (z* - z) / (1 - tau); Euler with tau_k = k/K is exact."""
    target = torch.tensor([[3.0, -1.0]])
    noise = torch.tensor([[0.5, 0.5]])
    sample = core.euler_sample(lambda z, tau: (target - z) / (1 - tau[:, None]), noise, steps)
    torch.testing.assert_close(sample, target)


def test_euler_integrates_a_constant_field_and_counts_its_steps():
    calls = []

    def field(z, tau):
        calls.append(tau[0].item())
        return torch.ones_like(z) * 2.0

    out = core.euler_sample(field, torch.zeros(1, 2), 4)
    assert torch.allclose(out, torch.full((1, 2), 2.0))
    assert calls == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="at least one step"):
        core.euler_sample(field, torch.zeros(1, 2), 0)


def test_euler_gives_the_field_tau_in_the_latent_dtype():
    seen = []

    def field(z, tau):
        seen.append(tau.dtype)
        return torch.ones_like(z)

    core.euler_sample(field, torch.zeros(1, 2, dtype=torch.float64), 2)
    assert seen == [torch.float64, torch.float64]


def test_energy_distance_matches_a_hand_count():
    x = torch.tensor([[0.0], [2.0]])
    y = torch.tensor([[1.0]])
    # 2 * mean(|0-1|, |2-1|) - mean(0, 2, 2, 0) - 0 = 2 - 1 = 1
    assert core.energy_distance(x, y).item() == pytest.approx(1.0)
    assert core.energy_distance(x, x).item() == pytest.approx(0.0)
    far = core.energy_distance(x, x + 10.0).item()
    assert far > core.energy_distance(x, x + 1.0).item() > 0


def test_collapse_ratio_matches_a_hand_count():
    truth = torch.tensor([[0.0, 0.0], [2.0, 4.0]])  # variances 1 and 4 -> spread sqrt(2.5)
    collapsed = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    assert core.spread(truth).item() == pytest.approx(2.5**0.5)
    assert core.collapse_ratio(collapsed, truth).item() == 0.0
    assert core.collapse_ratio(truth + 7.0, truth).item() == pytest.approx(1.0)
    assert core.collapse_ratio(2 * truth, truth).item() == pytest.approx(2.0)
    small = truth / 100  # a truth spread below 1 is divided by as it is
    assert core.collapse_ratio(truth, small).item() == pytest.approx(100.0)


def test_untrained_decoder_copies_the_frame_and_gradients_reach_every_part():
    model = core.RLAAutoencoder(C, L, width=16, depth=1, heads=2, latent_tokens=2, latent_dim=3)
    x_t, x_next = tokens(seed=0), tokens(seed=1)
    z, _ = model.encode(x_t, x_next)
    assert torch.equal(model.decode(x_t, z), x_t)
    model.loss(x_t, x_next).backward()
    assert model.decoder.out[1].weight.grad.abs().sum() > 0
    # the first step moves only the zero head; one step later the encoder gets gradients too
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.zero_grad()
    model.loss(x_t, x_next).backward()
    assert model.encoder.project.weight.grad.abs().sum() > 0


def test_the_decoder_uses_the_latent_after_a_short_fit():
    """True z beats z = 0 (and copying x_t) once the autoencoder has fitted a few steps."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x_t = torch.randn(32, L, C, generator=g)
    motion = torch.randn(32, 1, C, generator=g)  # a per-item shift: only the residual tells it
    x_next = x_t + motion
    model = core.RLAAutoencoder(C, L, width=32, depth=1, heads=2, latent_tokens=2, latent_dim=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimizer.zero_grad()
        model.loss(x_t, x_next).backward()
        optimizer.step()
    with torch.no_grad():
        z, _ = model.encode(x_t, x_next)
        true_error = (model.decode(x_t, z) - x_next).abs().mean()
        zero_error = (model.decode(x_t, torch.zeros_like(z)) - x_next).abs().mean()
        copy_error = (x_t - x_next).abs().mean()
    assert true_error < 0.5 * zero_error and true_error < 0.5 * copy_error


def world_model():
    return core.RLAWorldModel(C, L, A, latent_tokens=2, latent_dim=3, width=16, heads=2)


def test_world_model_sampling_is_seeded_and_actions_change_the_condition():
    torch.manual_seed(0)
    model = world_model()
    for p in model.parameters():  # leave the zero init so the output depends on its inputs
        torch.nn.init.normal_(p, std=0.2)
    x_t = tokens(batch=2)
    actions = torch.randn(2, H, A)
    first = model.sample(x_t, actions, steps=3, generator=torch.Generator().manual_seed(1))
    again = model.sample(x_t, actions, steps=3, generator=torch.Generator().manual_seed(1))
    other = model.sample(x_t, actions, steps=3, generator=torch.Generator().manual_seed(2))
    assert first.shape == (2, 2, 3) and torch.equal(first, again) and not torch.equal(first, other)
    moved = model.sample(x_t, -actions, steps=3, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(first, moved)
    # the loss draws both its noise and its tau from the seeded generator (exact resume)
    z = torch.randn(2, 2, 3)
    loss = [
        model.loss(x_t, actions, z, generator=torch.Generator().manual_seed(seed)).item()
        for seed in (5, 5, 6)
    ]
    torch.manual_seed(123)  # the global generator must not matter
    again = model.loss(x_t, actions, z, generator=torch.Generator().manual_seed(5)).item()
    assert loss[0] == loss[1] == again and loss[0] != loss[2]


def test_world_model_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    model = world_model()
    x_t, actions = tokens(batch=8), torch.randn(8, H, A)
    z = torch.randn(8, 2, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(60):
        optimizer.zero_grad()
        loss = model.loss(x_t, actions, z, generator=torch.Generator().manual_seed(step % 4))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10


def test_rollout_feeds_each_prediction_back():
    chunks = torch.ones(2, 3, H, A)
    out = core.rollout(
        lambda x, a: x + a.sum(dim=(1, 2))[:, None, None], torch.zeros(2, L, C), chunks
    )
    assert out.shape == (2, 3, L, C)
    assert torch.equal(out[:, :, 0, 0], torch.tensor([[8.0, 16.0, 24.0], [8.0, 16.0, 24.0]]))


def test_baselines_have_the_shapes_and_behaviour_of_their_kind():
    x_t, actions = tokens(batch=3), torch.randn(3, H, A)
    assert torch.equal(persistence(x_t, actions), x_t)
    regression = RegressionWorldModel(C, L, A, width=16, depth=1, heads=2)
    assert regression(x_t, actions).shape == x_t.shape
    flow = TokenFlowWorldModel(C, L, A, width=16, depth=1, heads=2)
    sample = flow.sample(x_t, actions, steps=2, generator=torch.Generator().manual_seed(0))
    # zero-init velocity head: before training the sample is x_t plus the seeded noise itself
    noise = torch.randn(x_t.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample, x_t + noise)
    assert flow.loss(x_t, actions, x_t + 1.0, torch.Generator().manual_seed(0)).item() > 0
    regressor = RLARegressor(C, L, A, latent_tokens=2, latent_dim=3, width=16, depth=1, heads=2)
    assert regressor(x_t, actions).shape == (3, 2, 3)


def test_pooled_collapse_ratio_matches_a_hand_count_and_drops_unimodal_groups():
    truth = torch.tensor([[[0.0], [2.0]], [[5.0], [5.0]]])  # spreads 1 and 0
    predictions = torch.tensor([[[1.0], [2.0]], [[0.0], [4.0]]])  # spreads 0.5 and 2
    ratio, kept = core.pooled_collapse_ratio(predictions, truth, min_truth_spread=0.5)
    assert kept.tolist() == [True, False] and ratio.item() == pytest.approx(0.5)
    ratio, kept = core.pooled_collapse_ratio(predictions, truth)
    assert kept.all() and ratio.item() == pytest.approx((0.5 + 2.0) / 2 / 0.5)
    with pytest.raises(ValueError, match="spread by"):
        core.pooled_collapse_ratio(predictions, truth, min_truth_spread=3.0)


def test_flow_training_and_sampling_recover_a_known_conditional_mixture():
    """Eq. 5's loss and Eq. 6's sampler together: a 1-D latent whose law given the action is
    known (two modes at 2s - 1 and 2s + 1 for the action's sign s, sd 0.1) is learnt and then
    sampled back: both modes of each condition, their balance, mean and spread."""
    torch.manual_seed(0)
    model = core.RLAWorldModel(C, L, A, latent_tokens=1, latent_dim=1, width=32, heads=2)
    x_t = torch.zeros(1, L, C)
    data = torch.Generator().manual_seed(1)

    def draw(batch: int):
        sign = torch.randint(2, (batch,), generator=data) * 2.0 - 1.0
        actions = sign[:, None, None].expand(batch, H, A).contiguous()
        mode = torch.randint(2, (batch,), generator=data) * 2.0 - 1.0
        z = 2 * sign + mode + 0.1 * torch.randn(batch, generator=data)
        return actions, z[:, None, None]

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    noise = torch.Generator().manual_seed(2)
    for _ in range(500):
        actions, z = draw(128)
        loss = model.loss(x_t.expand(128, -1, -1), actions, z, generator=noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for sign in (-1.0, 1.0):
            actions = torch.full((400, H, A), sign)
            samples = model.sample(
                x_t.expand(400, -1, -1), actions, 50, torch.Generator().manual_seed(3)
            ).flatten()
            upper = (samples > 2 * sign).float().mean()
            assert 0.35 < upper < 0.65, (sign, upper)  # both modes, balanced
            assert abs(samples.mean() - 2 * sign) < 0.25
            assert 0.8 < samples.std() < 1.2  # the truth's sd is about 1.005
            # mass near the two modes: 0.745 here; one Gaussian of the same mean and sd (a
            # flow that lost the modes) puts 0.48 there
            near = ((samples - (2 * sign + 1)).abs() < 0.5) | (
                (samples - (2 * sign - 1)).abs() < 0.5
            )
            assert near.float().mean() > 0.65


def test_autoencoder_parts_compose_as_eqs_1_to_3_by_value():
    """The decoder is x_t + out(blocks([project(x_t) + position ; project_latent(z)])[:L]); the
    loss is L1 + MSE (weights 1 by default) of the decoded frame plus the VQ term, with the
    latent snapped to the codebook when one exists."""
    torch.manual_seed(0)
    ae = core.RLAAutoencoder(C, L, width=16, depth=1, heads=2, latent_tokens=2, latent_dim=3,
                             codebook_size=5)  # fmt: skip
    for p in ae.parameters():  # off the zero-initialised output, so every part shows
        torch.nn.init.normal_(p, std=0.3)
    x_t, x_next = tokens(batch=3, seed=1), tokens(batch=3, seed=2)
    with torch.no_grad():
        raw = ae.encoder(core.encoder_input(x_t, x_next, "sub"))
        z, vq = ae.encode(x_t, x_next)
        want_z, want_vq = core.vector_quantize(raw, ae.codebook)
        torch.testing.assert_close(z, want_z)
        torch.testing.assert_close(vq, want_vq)
        # every latent vector is a codebook row
        assert ((z.reshape(-1, 1, 3) - ae.codebook[None]).abs().sum(-1).min(-1).values < 1e-6).all()
        d = ae.decoder
        hidden = torch.cat([d.project(x_t) + d.position, d.project_latent(z)], dim=1)
        want = x_t + d.out(d.blocks(hidden)[:, :L])
        decoded = ae.decode(x_t, z)
        torch.testing.assert_close(decoded, want)
        error = decoded - x_next
        recon = error.abs().mean() + error.pow(2).mean()
        torch.testing.assert_close(core.rla_reconstruction_loss(decoded, x_next), recon)
        torch.testing.assert_close(ae.loss(x_t, x_next), recon + vq)
        assert vq > 0
        weighted = ae.loss(x_t, x_next, l1_weight=2.0, mse_weight=3.0)
        torch.testing.assert_close(weighted, 2 * error.abs().mean() + 3 * error.pow(2).mean() + vq)


def test_world_model_samples_with_ten_euler_steps_by_default():
    torch.manual_seed(0)
    model = world_model()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x_t, actions = tokens(batch=2), torch.randn(2, H, A)
    default = model.sample(x_t, actions, generator=torch.Generator().manual_seed(1))
    ten = model.sample(x_t, actions, 10, torch.Generator().manual_seed(1))
    eleven = model.sample(x_t, actions, 11, torch.Generator().manual_seed(1))
    torch.testing.assert_close(default, ten)
    assert not torch.allclose(default, eleven)
