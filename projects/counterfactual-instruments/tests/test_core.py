import math

import pytest
import torch
import torch.nn.functional as F

from counterfactual_instruments.core import (
    Decoder,
    Encoder,
    FiLMBlock,
    FlowDecoder,
    chi2_loss,
    chi2_per_pixel,
    euler_sample,
    flow_matching_pair,
    info_nce,
)


def test_chi2_matches_the_inverse_variance_formula_by_hand():
    prediction = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # [1, 1, 2, 2]
    target = torch.tensor([[[[0.0, 0.0], [1.0, 1.0]]]])
    ivar = torch.tensor([[[[1.0, 0.5], [2.0, 4.0]]]])
    # (1*1 + 0.5*4 + 2*4 + 4*9) / 4 pixels
    assert chi2_per_pixel(prediction, target, ivar).item() == pytest.approx((1 + 2 + 8 + 36) / 4)
    mask = torch.tensor([[[[1.0, 1.0], [0.0, 1.0]]]])
    # the masked pixel neither counts in the sum nor in the pixel count
    assert chi2_per_pixel(prediction, target, ivar, mask).item() == pytest.approx((1 + 2 + 36) / 3)


def test_masked_pixels_weigh_zero_whatever_they_hold():
    prediction, target = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    ivar = torch.rand(3, 2, 4, 4) + 0.5
    mask = torch.ones_like(target)
    mask[:, :, 0] = 0
    wild = target.clone()
    wild[:, :, 0] = 1e6
    torch.testing.assert_close(
        chi2_per_pixel(prediction, wild, ivar, mask), chi2_per_pixel(prediction, target, ivar, mask)
    )
    empty = torch.zeros_like(target)
    assert torch.equal(chi2_per_pixel(prediction, target, ivar, empty), torch.zeros(3))
    assert (
        chi2_loss(prediction, target, ivar, mask)
        == chi2_per_pixel(prediction, target, ivar, mask).mean()
    )


def test_info_nce_matches_a_hand_computation():
    z_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_b = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    tau = 0.5
    cos = torch.tensor([[1.0, 1 / math.sqrt(2)], [0.0, 1 / math.sqrt(2)]]) / tau
    rows = -(torch.log_softmax(cos, 1).diagonal()).mean()
    cols = -(torch.log_softmax(cos.T, 1).diagonal()).mean()
    assert info_nce(z_a, z_b, tau).item() == pytest.approx(0.5 * (rows + cols).item(), rel=1e-6)
    # aligned, well separated pairs give a small loss; swapped pairs a large one
    eye = torch.eye(4)
    assert info_nce(eye, eye, 0.1) < 1e-3 < info_nce(eye, eye.flip(0), 0.1)


def test_flow_matching_pair_interpolates_and_targets_the_difference():
    # noise -2, not -1: at -1, (1 - t) / noise equals (1 - t) * noise and hides a wrong operator
    clean, noise = torch.full((2, 1, 2, 2), 3.0), torch.full((2, 1, 2, 2), -2.0)
    x_t, target = flow_matching_pair(clean, noise, torch.tensor([0.0, 0.25]))
    assert torch.equal(x_t[0], noise[0])
    torch.testing.assert_close(x_t[1], torch.full((1, 2, 2), 0.75 * -2.0 + 0.25 * 3.0))
    assert torch.equal(target, clean - noise)
    x_1, _ = flow_matching_pair(clean, noise, torch.ones(2))
    assert torch.equal(x_1, clean)


def test_euler_sampler_with_the_exact_velocity_recovers_a_gaussian():
    """For data N(mu, s^2) and noise N(0, 1), the marginal velocity of the linear path is
    E[x - eps | x_t] = mu + (t s^2 - (1 - t)) / ((1 - t)^2 + t^2 s^2) (x_t - t mu); Euler steps
    along it must carry N(0, 1) to N(mu, s^2)."""
    mu, s = 2.0, 0.5

    def velocity(x, t):
        t = t.view(-1, 1)
        return mu + (t * s**2 - (1 - t)) / ((1 - t) ** 2 + t**2 * s**2) * (x - t * mu)

    noise = torch.randn(20000, 1, generator=torch.Generator().manual_seed(0))
    sample = euler_sample(velocity, noise, steps=200)
    assert sample.mean().item() == pytest.approx(mu, abs=0.02)
    assert sample.std().item() == pytest.approx(s, abs=0.02)
    # too few steps on the same field is visibly off: the test can fail
    coarse = euler_sample(velocity, noise, steps=2)
    assert abs(coarse.std().item() - s) > 0.05


def test_encoders_decoders_follow_each_instrument_grid():
    encoder = Encoder({"A": 3, "B": 5}, dim=7, width=8)
    assert encoder(torch.randn(2, 3, 16, 16), "A").shape == (2, 7)
    assert encoder(torch.randn(2, 5, 24, 24), "B").shape == (2, 7)
    decoder = Decoder(bands=5, size=24, latent_dim=7, condition_dim=3, width=8)
    assert decoder(torch.randn(2, 7), torch.randn(2, 3)).shape == (2, 5, 24, 24)
    plain = Decoder(bands=3, size=16, latent_dim=7, condition_dim=0, width=8)
    assert plain(torch.randn(2, 7)).shape == (2, 3, 16, 16)
    with pytest.raises(ValueError, match="divide by 4"):
        Decoder(bands=3, size=18, latent_dim=7, condition_dim=0)


def test_the_instrument_latent_modulates_the_decoder():
    torch.manual_seed(0)
    decoder = Decoder(bands=2, size=16, latent_dim=4, condition_dim=2, width=8)
    z_p = torch.randn(1, 4)
    assert not torch.allclose(decoder(z_p, torch.zeros(1, 2)), decoder(z_p, torch.ones(1, 2)))


def test_flow_decoder_trains_and_samples_in_the_instrument_format():
    torch.manual_seed(0)
    flow = FlowDecoder(
        bands=3, size=16, latent_dim=4, condition_dim=2, channels=(8, 16), sample_steps=3
    )
    clean, z_p, z_s = torch.randn(2, 3, 16, 16), torch.randn(2, 4), torch.randn(2, 2)
    loss = flow.loss(clean, z_p, z_s, generator=torch.Generator().manual_seed(1))
    loss.backward()
    assert loss.item() > 0 and flow.condition.weight.grad.abs().sum() > 0  # the condition acts
    draw = flow.sample(z_p, z_s, (2, 3, 16, 16), torch.Generator().manual_seed(2))
    assert draw.shape == (2, 3, 16, 16) and torch.isfinite(draw).all()


def test_flow_decoder_without_an_instrument_latent():
    """Translation and the autoencoder have no z_s: the flow's condition is z_p alone."""
    torch.manual_seed(0)
    flow = FlowDecoder(bands=2, size=8, latent_dim=4, condition_dim=0, channels=(8, 16))
    velocity = flow.velocity(torch.randn(2, 2, 8, 8), torch.rand(2), torch.randn(2, 4))
    assert velocity.shape == (2, 2, 8, 8)


def test_chi2_is_per_item_with_each_items_own_unmasked_count():
    """Two items in one batch, one with a single unmasked pixel: each item's sum over its own
    pixels divided by its own count of unmasked pixels (eq. 2)."""
    prediction, target = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    target[0] = 1.0
    target[1] = 2.0
    mask = torch.ones(2, 1, 2, 2)
    mask[0].view(-1)[1:] = 0.0  # item 0: one pixel counts
    chi2 = chi2_per_pixel(prediction, target, torch.ones_like(target), mask)
    torch.testing.assert_close(chi2, torch.tensor([1.0 / 1, 4.0 * 4 / 4]))


def test_film_modulates_by_one_plus_gamma_and_shifts_by_beta():
    """FiLM (h * (1 + gamma) + beta, then GELU) with the linear map fixed by hand."""
    block = FiLMBlock(width=2, condition_dim=1)
    with torch.no_grad():
        block.conv.weight.zero_()
        block.conv.weight[0, 0, 1, 1] = block.conv.weight[1, 1, 1, 1] = 1.0  # identity conv
        block.conv.bias.zero_()
        block.film.weight.copy_(torch.tensor([[0.5], [-0.5], [2.0], [1.0]]))  # gamma, beta
        block.film.bias.zero_()
    h = torch.ones(1, 2, 1, 1)
    out = block(h, torch.ones(1, 1))  # gamma (0.5, -0.5), beta (2, 1)
    expected = F.gelu(torch.tensor([1.5 + 2.0, 0.5 + 1.0]))
    torch.testing.assert_close(out[0, :, 0, 0], expected)
    assert out.shape == (1, 2, 2, 2)  # upsampled x2
    decoder = Decoder(bands=2, size=8, latent_dim=3, condition_dim=2, width=4)
    assert all(block.film is not None for block in decoder.blocks)  # z_s conditions each block


def test_a_decoder_without_an_instrument_latent():
    torch.manual_seed(0)
    decoder = Decoder(bands=2, size=8, latent_dim=3, condition_dim=0, width=4)
    assert all(block.film is None for block in decoder.blocks)
    assert decoder(torch.randn(5, 3)).shape == (5, 2, 8, 8)
