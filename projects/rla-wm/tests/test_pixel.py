from __future__ import annotations

import math

import pytest
import torch

from rlawm.pixel import (
    FeatureToPixelDecoder,
    PixelDiffusionWM,
    count_flops,
    image_quality,
    pixel_flops_per_frame,
)

SIZE, H, A = 16, 4, 2  # tiny frames; the project's chunk of 4 steps of 2-D pusher commands


def tiny_model(seed: int = 0) -> PixelDiffusionWM:
    torch.manual_seed(seed)
    return PixelDiffusionWM(
        frame_size=SIZE,
        block_out_channels=(8, 16),
        attention_head_dim=8,
        norm_num_groups=4,
        num_train_timesteps=100,
    )


def tiny_batch(batch: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    current = torch.rand(batch, 3, SIZE, SIZE, generator=g) * 2 - 1
    actions = torch.rand(batch, H, A, generator=g) * 2 - 1
    return current, actions


def fit(model: torch.nn.Module, loss_fn, steps: int, lr: float) -> None:
    """A plain Adam loop on a fixed batch (``loss_fn(step)`` returns the scalar loss)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        loss_fn(step).backward()
        opt.step()


def test_epsilon_loss_decreases_on_a_fixed_batch():
    model = tiny_model()
    current, actions = tiny_batch()
    future = current.roll(1, dims=-1)

    def fixed_loss():
        # the same timesteps and noise before and after, so only the weights differ
        return model.loss(current, actions, future, torch.Generator().manual_seed(123)).item()

    before = fixed_loss()
    g = torch.Generator().manual_seed(1)
    fit(model, lambda _: model.loss(current, actions, future, g), steps=30, lr=3e-3)
    assert fixed_loss() < 0.7 * before


def test_sample_is_seeded_shaped_and_in_range():
    model = tiny_model()
    current, actions = tiny_batch(batch=2)
    first = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(7))
    again = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(7))
    other = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(8))
    assert first.shape == (2, 3, SIZE, SIZE)
    assert first.min() >= -1 and first.max() <= 1
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)


def test_rollout_chains_the_chunks():
    model = tiny_model()
    current, _ = tiny_batch(batch=2)
    chunks = torch.rand(2, 3, H, A) * 2 - 1
    frames = model.rollout(current, chunks, steps=2, generator=torch.Generator().manual_seed(0))
    assert frames.shape == (2, 3, 3, SIZE, SIZE)
    # the second prediction starts from the first, under the same seeding scheme as sample
    g = torch.Generator().manual_seed(0)
    first = model.sample(current, chunks[:, 0], 2, g)
    second = model.sample(first, chunks[:, 1], 2, g)
    assert torch.equal(frames[:, 0], first) and torch.equal(frames[:, 1], second)


def test_gradients_reach_the_action_embedding_at_init():
    model = tiny_model()
    current, actions = tiny_batch()
    model.loss(current, actions, current, torch.Generator().manual_seed(0)).backward()
    for p in model.action_embed.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_actions_change_the_sample_after_a_short_fit():
    model = tiny_model()
    current, _ = tiny_batch(batch=4)
    # the future frame is a flat +-0.5 image whose sign is the sign of the (constant) action
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0])
    actions = sign[:, None, None].expand(4, H, A).contiguous()
    future = 0.5 * sign[:, None, None, None].expand(4, 3, SIZE, SIZE)
    g = torch.Generator().manual_seed(0)
    fit(model, lambda _: model.loss(current, actions, future, g), steps=40, lr=3e-3)
    # the same current frame and the same noise seed, only the action chunk differs
    up = model.sample(current[:1], actions[:1], 10, torch.Generator().manual_seed(3))
    down = model.sample(current[:1], actions[1:2], 10, torch.Generator().manual_seed(3))
    assert (up - down).abs().mean() > 0.05
    assert up.mean() > down.mean()


def test_sample_flops_scale_with_ddim_steps():
    model = tiny_model()
    current, actions = tiny_batch(batch=1)

    def sample_flops(steps: int) -> int:
        return count_flops(model.sample, current, actions, steps, torch.Generator())

    two, four = sample_flops(2), sample_flops(4)
    assert two > 0
    assert four / two == pytest.approx(2.0, rel=0.01)
    # the per-frame count (one denoiser call times steps) agrees with counting the whole sample
    assert pixel_flops_per_frame(model, current, actions, steps=2) == pytest.approx(two, rel=0.01)


def test_default_model_shape_and_flops_per_frame():
    model = PixelDiffusionWM()
    current = torch.zeros(2, 3, 64, 64)
    actions = torch.zeros(2, 4, 2)
    eps = model(current, current, actions, torch.tensor([10, 500]))
    assert eps.shape == (2, 3, 64, 64)
    one_step = pixel_flops_per_frame(model, current, actions, steps=1)
    # counted on the first item only: the batch size of the caller does not matter
    assert pixel_flops_per_frame(model, current[:1], actions[:1], steps=50) == 50 * one_step
    assert 1e8 < one_step < 1e10


def test_wrong_action_shape_is_rejected():
    model = tiny_model()
    current, _ = tiny_batch(batch=2)
    with pytest.raises(ValueError, match="actions"):
        model.sample(current, torch.zeros(2, H + 1, A), steps=1)


def test_decoder_shape_range_and_short_fit():
    torch.manual_seed(0)
    decoder = FeatureToPixelDecoder(num_tokens=16, token_dim=12, frame_size=SIZE, hidden=16)
    tokens = torch.randn(4, 16, 12)
    frames = torch.rand(4, 3, SIZE, SIZE) * 1.6 - 0.8
    out = decoder(tokens)
    assert out.shape == (4, 3, SIZE, SIZE)
    assert out.abs().max() <= 1

    def l1() -> float:
        with torch.no_grad():
            return (decoder(tokens) - frames).abs().mean().item()

    before = l1()
    fit(decoder, lambda _: decoder.loss(tokens, frames), steps=40, lr=1e-2)
    assert l1() < 0.8 * before


def test_decoder_follows_the_token_grid_layout():
    # token i is patch (i // g, i % g): a decoder fed one hot token changes that patch most
    torch.manual_seed(0)
    decoder = FeatureToPixelDecoder(num_tokens=4, token_dim=3, frame_size=8, hidden=8)
    tokens = torch.zeros(1, 4, 3)
    bumped = tokens.clone()
    bumped[0, 1] = 5.0  # top-right patch of the 2x2 grid
    change = (decoder(bumped) - decoder(tokens)).abs().sum(1)[0]  # [8, 8]
    patches = change.reshape(2, 4, 2, 4).sum((1, 3))  # [2, 2] per-patch totals
    assert patches.argmax().item() == 1


def test_decoder_reaches_any_integer_multiple_of_the_grid():
    decoder = FeatureToPixelDecoder(num_tokens=4, token_dim=5, frame_size=12, hidden=8)
    assert decoder(torch.randn(1, 4, 5)).shape == (1, 3, 12, 12)


def test_decoder_rejects_bad_sizes():
    with pytest.raises(ValueError, match="perfect square"):
        FeatureToPixelDecoder(num_tokens=10, token_dim=4, frame_size=16)
    with pytest.raises(ValueError, match="multiple"):
        FeatureToPixelDecoder(num_tokens=9, token_dim=4, frame_size=16)
    decoder = FeatureToPixelDecoder(num_tokens=16, token_dim=4, frame_size=16, hidden=8)
    with pytest.raises(ValueError, match="tokens"):
        decoder(torch.randn(1, 9, 4))


def test_image_quality_per_item():
    g = torch.Generator().manual_seed(0)
    target = torch.rand(3, 3, SIZE, SIZE, generator=g) * 1.6 - 0.8
    same = image_quality(target, target)
    assert same["psnr"].shape == (3,) and same["ssim"].shape == (3,)
    assert torch.all(same["psnr"] > 100)  # +inf (zero error) or a very large value
    assert torch.allclose(same["ssim"], torch.ones(3), atol=1e-5)

    # a different noise level per item: PSNR follows 10 log10(range^2 / MSE) with range 2
    sigma = torch.tensor([0.01, 0.05, 0.2])[:, None, None, None]
    noisy = target + sigma * torch.randn(target.shape, generator=g)
    mse = (noisy - target).pow(2).mean((1, 2, 3))
    expected = 10 * torch.log10(4.0 / mse)
    got = image_quality(noisy, target)
    assert torch.allclose(got["psnr"], expected, atol=1e-3)
    assert got["psnr"][0] > got["psnr"][1] > got["psnr"][2]
    assert torch.all(got["ssim"] < 1) and got["ssim"][0] > got["ssim"][2]
    assert math.isclose(expected[2].item(), 10 * math.log10(4 / 0.04), abs_tol=0.2)
