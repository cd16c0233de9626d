"""The pixel-space baseline and the feature-to-pixel decoder.

- ``PixelDiffusionWM``: an action-conditioned pixel video-diffusion world model (a diffusers
  ``UNet2DModel`` sampled with DDIM), the pixel baseline that the paper compares RLA-WM against in
  quality and in FLOPs per predicted frame. By default it predicts the clean next frame as the
  current frame plus a residual (``prediction="residual"``: x0-prediction, zero-initialised
  output, so the untrained model is persistence); ``prediction="epsilon"`` is the DDPM noise
  loss of the first record, kept as an option;
- ``FeatureToPixelDecoder``: frozen-encoder patch tokens back to frames, for evaluation and
  visualisation only (PSNR / SSIM of decoded predictions);
- ``image_quality``: per-item PSNR and SSIM of [-1, 1] images;
- ``count_flops`` / ``pixel_flops_per_frame``: FLOPs measured by ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, UNet2DModel
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from torchmetrics.functional.image import (
    peak_signal_noise_ratio,
    structural_similarity_index_measure,
)

# Frames live in [-1, 1], so the PSNR / SSIM data range is 2.
DATA_RANGE = 2.0


class PixelDiffusionWM(nn.Module):
    """Pixel video-diffusion world model: p(next frame | current frame, action chunk).

    The UNet sees the noisy future frame and the current frame stacked as 6 input channels. The
    action chunk [B, h, A] is flattened, embedded by an MLP to the UNet's timestep-embedding width
    and passed as ``class_labels`` through ``class_embed_type="identity"``, so diffusers adds it to
    the timestep embedding; every ResNet block turns that sum into a per-channel bias.

    ``prediction``: ``"residual"`` (default) reads the UNet's output r as the clean-frame estimate
    x0 = current + r, trained by MSE(x0, future) and sampled by DDIM with
    ``prediction_type="sample"``; the UNet's output layer starts at zero, so the untrained model
    predicts "nothing moves" and training only has to learn the motion (the first record's
    epsilon-prediction model at the same budget output noise, PSNR 5.7 dB). ``"epsilon"`` is the
    DDPM noise loss.
    """

    def __init__(
        self,
        frame_size: int = 64,
        channels: int = 3,
        chunk_len: int = 4,
        action_dim: int = 2,
        block_out_channels: tuple[int, ...] = (16, 32, 64),
        layers_per_block: int = 1,
        mid_attention: bool = True,
        attention_head_dim: int = 8,
        norm_num_groups: int = 8,
        num_train_timesteps: int = 1000,
        prediction: str = "residual",
    ) -> None:
        super().__init__()
        if prediction not in ("residual", "epsilon"):
            raise ValueError(f"prediction must be 'residual' or 'epsilon', got {prediction!r}")
        self.prediction = prediction
        self.frame_size, self.channels = frame_size, channels
        self.chunk_len, self.action_dim = chunk_len, action_dim
        levels = len(block_out_channels)
        # Self-attention only at the lowest resolution (the mid block): cheap and enough to move
        # information across the frame; the other levels are plain ResNet blocks.
        self.unet = UNet2DModel(
            sample_size=frame_size,
            in_channels=2 * channels,
            out_channels=channels,
            down_block_types=("DownBlock2D",) * levels,
            up_block_types=("UpBlock2D",) * levels,
            block_out_channels=block_out_channels,
            layers_per_block=layers_per_block,
            add_attention=mid_attention,
            attention_head_dim=attention_head_dim,
            norm_num_groups=norm_num_groups,
            class_embed_type="identity",
        )
        if prediction == "residual":  # the untrained model copies the current frame
            nn.init.zeros_(self.unet.conv_out.weight)
            nn.init.zeros_(self.unet.conv_out.bias)
        embed_dim = block_out_channels[0] * 4  # UNet2DModel's default timestep-embedding width
        self.action_embed = nn.Sequential(
            nn.Linear(chunk_len * action_dim, embed_dim), nn.SiLU(), nn.Linear(embed_dim, embed_dim)
        )
        # DDPM's linear betas (1e-4 .. 0.02 at T = 1000) rescaled by 1000 / T, so any T follows the
        # same noise path and still ends at (almost) pure noise. "trailing" spacing starts DDIM at
        # t = T - 1 whatever the step count; eta = 0 makes DDIM deterministic.
        self.scheduler = DDIMScheduler(
            num_train_timesteps=num_train_timesteps,
            beta_start=0.1 / num_train_timesteps,
            beta_end=20.0 / num_train_timesteps,
            prediction_type="sample" if prediction == "residual" else "epsilon",
            clip_sample=True,  # each DDIM step keeps its clean-frame estimate in [-1, 1]
            timestep_spacing="trailing",
        )

    def _check(self, current: Tensor, actions: Tensor) -> None:
        expected = (self.channels, self.frame_size, self.frame_size)
        if current.dim() != 4 or tuple(current.shape[1:]) != expected:
            raise ValueError(f"current frames must be [B, {expected}], got {tuple(current.shape)}")
        if actions.dim() != 3 or tuple(actions.shape[1:]) != (self.chunk_len, self.action_dim):
            raise ValueError(
                f"actions must be [B, {self.chunk_len}, {self.action_dim}], "
                f"got {tuple(actions.shape)}"
            )
        if actions.shape[0] != current.shape[0]:
            raise ValueError("current frames and actions have different batch sizes")

    def forward(self, noisy: Tensor, current: Tensor, actions: Tensor, timesteps: Tensor) -> Tensor:
        """One denoiser call [B, 3, H, W]: the clean next frame current + r (``residual``) or the
        noise epsilon (``epsilon``), what the scheduler's prediction type expects."""
        self._check(current, actions)
        condition = self.action_embed(actions.flatten(1))  # [B, h*A] -> [B, E]
        out = self.unet(torch.cat([noisy, current], dim=1), timesteps, class_labels=condition)
        return current + out.sample if self.prediction == "residual" else out.sample

    def loss(
        self,
        current: Tensor,
        actions: Tensor,
        future: Tensor,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """MSE(x0_theta(x_t, t | current, actions), future) for ``residual`` (x0-prediction);
        the DDPM epsilon loss MSE(eps_theta(...), eps) for ``epsilon``."""
        batch = future.shape[0]
        t = torch.randint(
            0,
            self.scheduler.config.num_train_timesteps,
            (batch,),
            generator=generator,
            device=future.device,
        )
        noise = torch.randn(future.shape, generator=generator, device=future.device)
        noisy = self.scheduler.add_noise(future, noise, t)  # [B, 3, H, W]
        target = future if self.prediction == "residual" else noise
        return F.mse_loss(self(noisy, current, actions, t), target)

    @torch.no_grad()
    def sample(
        self,
        current: Tensor,
        actions: Tensor,
        steps: int = 50,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """DDIM sampling (eta = 0) of the next frame [B, 3, H, W] in [-1, 1]; ``generator`` must
        live on the frames' device."""
        self._check(current, actions)
        # The only randomness is the starting noise, so one generator seed fixes the frames.
        x = torch.randn(current.shape, generator=generator, device=current.device)
        self.scheduler.set_timesteps(steps, device=current.device)
        for t in self.scheduler.timesteps:
            output = self(x, current, actions, t)  # x0 (residual) or epsilon: the scheduler's type
            x = self.scheduler.step(output, t, x, eta=0.0).prev_sample
        return x.clamp(-1.0, 1.0)

    @torch.no_grad()
    def rollout(
        self,
        current: Tensor,
        action_chunks: Tensor,
        steps: int = 50,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Autoregressive rollout over K chunks [B, K, h, A]: the frames [B, K, 3, H, W]."""
        frames = []
        frame = current
        for k in range(action_chunks.shape[1]):
            frame = self.sample(frame, action_chunks[:, k], steps, generator)
            frames.append(frame)
        return torch.stack(frames, dim=1)


class FeatureToPixelDecoder(nn.Module):
    """Patch tokens [B, L, C] -> frames [B, 3, H, W] in [-1, 1]: 1x1 projection on the sqrt(L) grid,
    then (upsample, 3x3 conv, GroupNorm, SiLU) stages up to the frame size, a 3x3 conv and tanh."""

    def __init__(
        self,
        num_tokens: int = 64,
        token_dim: int = 128,
        frame_size: int = 64,
        channels: int = 3,
        hidden: int = 64,
        min_hidden: int = 16,
        norm_num_groups: int = 8,
    ) -> None:
        super().__init__()
        grid = math.isqrt(num_tokens)
        if grid * grid != num_tokens:
            raise ValueError(f"the number of tokens L={num_tokens} is not a perfect square")
        if frame_size % grid:
            raise ValueError(f"frame size {frame_size} is not a multiple of the {grid}x{grid} grid")
        self.num_tokens, self.token_dim, self.grid = num_tokens, token_dim, grid
        layers: list[nn.Module] = [nn.Conv2d(token_dim, hidden, kernel_size=1)]
        width, factor = hidden, frame_size // grid
        # x2 stages while the remaining factor is even, then one stage for any odd remainder, so any
        # integer multiple of the grid is reachable.
        scales = []
        while factor % 2 == 0:
            scales.append(2)
            factor //= 2
        if factor > 1:
            scales.append(factor)
        for scale in scales:
            out = max(width // 2, min_hidden)
            layers += [
                nn.Upsample(scale_factor=scale, mode="nearest"),
                nn.Conv2d(width, out, kernel_size=3, padding=1),
                nn.GroupNorm(math.gcd(norm_num_groups, out), out),
                nn.SiLU(),
            ]
            width = out
        layers += [nn.Conv2d(width, channels, kernel_size=3, padding=1), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, tokens: Tensor) -> Tensor:
        """Decode tokens [B, L, C] (row-major patch order) to frames [B, 3, H, W]."""
        if tokens.dim() != 3 or tuple(tokens.shape[1:]) != (self.num_tokens, self.token_dim):
            raise ValueError(
                f"tokens must be [B, {self.num_tokens}, {self.token_dim}], "
                f"got {tuple(tokens.shape)}"
            )
        # [B, L, C] -> [B, C, g, g]: token i sits at row i // g, column i % g.
        grid = tokens.transpose(1, 2).reshape(tokens.shape[0], self.token_dim, self.grid, self.grid)
        return self.net(grid)

    def loss(self, tokens: Tensor, frames: Tensor) -> Tensor:
        """Reconstruction loss L1 + MSE of the decoded frames."""
        decoded = self(tokens)
        return F.l1_loss(decoded, frames) + F.mse_loss(decoded, frames)


def image_quality(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Per-item PSNR (dB) and SSIM of [-1, 1] images [B, 3, H, W]: tensors of shape [B]."""
    pred, target = pred.float(), target.float()
    psnr = peak_signal_noise_ratio(
        pred, target, data_range=DATA_RANGE, reduction="none", dim=(1, 2, 3)
    )
    ssim = structural_similarity_index_measure(
        pred, target, data_range=DATA_RANGE, reduction="none"
    )
    return {"psnr": psnr, "ssim": ssim}


def count_flops(fn: Callable[..., object], *args: object) -> int:
    """FLOPs of one call ``fn(*args)`` as counted by FlopCounterMode, under no_grad: matmuls,
    convolutions and attention at 2 FLOPs per multiply-add; element-wise ops are not counted."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fn(*args)
    return counter.get_total_flops()


def pixel_flops_per_frame(
    model: PixelDiffusionWM, current: Tensor, actions: Tensor, steps: int = 50
) -> int:
    """FLOPs of generating one frame with ``steps`` DDIM steps: one denoiser call on the first item
    (batch 1) times ``steps`` (the scheduler's update is element-wise, hence uncounted)."""
    current, actions = current[:1], actions[:1]
    t = torch.tensor([model.scheduler.config.num_train_timesteps - 1], device=current.device)
    return steps * count_flops(model, torch.zeros_like(current), current, actions, t)
