from __future__ import annotations

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


def tiny_model(seed: int = 0, prediction: str = "residual") -> PixelDiffusionWM:
    torch.manual_seed(seed)
    return PixelDiffusionWM(
        frame_size=SIZE,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        num_train_timesteps=100,
        prediction=prediction,
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


@pytest.mark.parametrize("prediction", ["residual", "epsilon"])
def test_loss_decreases_on_a_fixed_batch(prediction):
    model = tiny_model(prediction=prediction)
    current, actions = tiny_batch()
    future = current.roll(1, dims=-1)

    def fixed_loss() -> float:
        # the same timesteps and noise before and after (5 draws), so only the weights differ
        draws = [torch.Generator().manual_seed(100 + i) for i in range(5)]
        with torch.no_grad():
            return sum(model.loss(current, actions, future, d).item() for d in draws) / 5

    before = fixed_loss()
    g = torch.Generator().manual_seed(1)
    fit(model, lambda _: model.loss(current, actions, future, g), steps=30, lr=1e-2)
    assert fixed_loss() < 0.6 * before


@pytest.mark.parametrize("prediction", ["residual", "epsilon"])
def test_sample_is_seeded_shaped_and_in_range(prediction):
    model = tiny_model(prediction=prediction)
    with torch.no_grad():  # a non-zero output layer: the residual model then depends on the noise
        model.unet.conv_out.weight.normal_(0, 0.1)
    current, actions = tiny_batch(batch=2)
    first = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(7))
    again = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(7))
    other = model.sample(current, actions, steps=3, generator=torch.Generator().manual_seed(8))
    assert first.shape == (2, 3, SIZE, SIZE)
    assert first.min() >= -1 and first.max() <= 1
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)


class OracleDenoiser(PixelDiffusionWM):
    """The exact noise of x_t under a known clean frame (``epsilon``), or that frame itself
    (``residual``, x0-prediction): DDIM with it must return that frame."""

    def __init__(self, clean: torch.Tensor, **kwargs) -> None:
        super().__init__(**kwargs)
        self.clean = clean

    def forward(self, noisy, current, actions, timesteps):
        if self.prediction == "residual":
            return self.clean
        alpha_bar = self.scheduler.alphas_cumprod[timesteps]
        return (noisy - alpha_bar.sqrt() * self.clean) / (1 - alpha_bar).sqrt()


@pytest.mark.parametrize("prediction", ["residual", "epsilon"])
@pytest.mark.parametrize("steps", [1, 4, 50])
def test_ddim_with_the_exact_prediction_recovers_the_clean_frame(steps, prediction):
    current, actions = tiny_batch(batch=2)
    clean = current.roll(3, dims=-2) * 0.9
    oracle = OracleDenoiser(
        clean, frame_size=SIZE, block_out_channels=(8, 16), norm_num_groups=4,
        prediction=prediction,
    )  # fmt: skip
    out = oracle.sample(current, actions, steps, torch.Generator().manual_seed(0))
    assert torch.allclose(out, clean, atol=1e-4)


def test_the_untrained_residual_model_is_persistence_and_its_loss_is_the_frame_change():
    model = tiny_model()
    current, actions = tiny_batch()
    future = current.roll(1, dims=-1)
    frames = model.sample(current, actions, 4, torch.Generator().manual_seed(0))
    # a zero output layer: every DDIM step's clean estimate is the current frame (in [-1, 1])
    torch.testing.assert_close(frames, current, atol=1e-4, rtol=0)
    loss = model.loss(current, actions, future, torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss, ((current - future) ** 2).mean())
    # gradients still reach the UNet's output layer (its input is not zero)
    loss.backward()
    assert model.unet.conv_out.weight.grad.abs().sum() > 0


def test_an_unknown_prediction_is_rejected():
    with pytest.raises(ValueError, match="prediction"):
        tiny_model(prediction="v")


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
    # the same sample calls on the same shapes and generator: bit for bit
    assert torch.equal(frames[:, 0], first) and torch.equal(frames[:, 1], second)


@pytest.mark.parametrize("prediction", ["residual", "epsilon"])
def test_gradients_reach_the_action_embedding(prediction):
    model = tiny_model(prediction=prediction)
    current, actions = tiny_batch()
    future = current.roll(1, dims=-1)
    if prediction == "residual":
        # the zero output layer blocks every gradient but its own at init; one step opens it
        fit(model, lambda _: model.loss(current, actions, future, torch.Generator()), 1, 1e-3)
        model.zero_grad()
    model.loss(current, actions, future, torch.Generator().manual_seed(0)).backward()
    for p in model.action_embed.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_actions_change_the_sample_after_a_short_fit():
    model = tiny_model()
    current, actions = tiny_batch(batch=4)
    g = torch.Generator().manual_seed(0)
    fit(model, lambda _: model.loss(current, actions, current.roll(1, -1), g), steps=20, lr=3e-3)

    def predict(chunk: torch.Tensor) -> torch.Tensor:
        # the same current frame and the same noise seed: only the action chunk differs
        return model.sample(current[:1], chunk[None], 5, torch.Generator().manual_seed(3))

    assert torch.equal(predict(actions[0]), predict(actions[0].clone()))
    assert (predict(actions[0]) - predict(actions[1])).abs().mean() > 1e-3
    # control: with the embedding's output layer zeroed the action no longer reaches the UNet
    with torch.no_grad():
        model.action_embed[-1].weight.zero_()
        model.action_embed[-1].bias.zero_()
    # a zeroed layer outputs exact zeros for any chunk: the UNet gets the same bits, same shapes
    assert torch.equal(predict(actions[0]), predict(actions[1]))


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
    # token i is the patch at row i // g, column i % g (row-major, as ViT patch embeddings are)
    decoder = FeatureToPixelDecoder(num_tokens=6 * 6, token_dim=5, frame_size=12, hidden=8)
    decoder.net = torch.nn.Identity()  # keep only the reshape to the grid
    tokens = torch.randn(2, 36, 5)
    grid = decoder(tokens)  # [2, 5, 6, 6]
    for i in (0, 1, 6, 35):
        assert torch.equal(grid[:, :, i // 6, i % 6], tokens[:, i])


def test_decoder_reaches_any_integer_multiple_of_the_grid():
    decoder = FeatureToPixelDecoder(num_tokens=4, token_dim=5, frame_size=12, hidden=8)
    assert decoder(torch.randn(1, 4, 5)).shape == (1, 3, 12, 12)
    # the project's default: 64 tokens (8x8 grid) of width 128 to 64x64 frames
    assert FeatureToPixelDecoder()(torch.randn(1, 64, 128)).shape == (1, 3, 64, 64)


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
    # a constant error of 0.2 on every pixel: MSE 0.04, PSNR exactly 10 log10(4 / 0.04) = 20 dB
    shifted = image_quality(target + 0.2, target)["psnr"]
    assert torch.allclose(shifted, torch.full((3,), 20.0), atol=1e-3)
