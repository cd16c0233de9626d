r"""Dual encoder with a counterfactual generation objective (pure torch; no Lightning, no I/O).

Notation. Galaxy i is observed by instrument A (Legacy-like) and by instrument B (HSC-like):
x^A_i, x^B_i, each with an inverse-variance map w and a mask m. Two encoders per instrument
stem, sharing a trunk across instruments:

- the intrinsic ("physics") encoder E_p(x, X) -> z_p  (what the galaxy is),
- the instrument encoder E_s(x, X) -> z_s             (PSF, noise: how X saw it),

and a decoder per instrument D_X(z_p, z_s) that renders a view in X's bands and pixel grid.

Counterfactual objective (the abstract's "counterfactual generation objective that leverages
overlapping observations"; the form is the design note's reconstruction). For a pair (x^A_i,
x^B_i) and *neighbours* n^A_i, n^B_i, other objects seen under the same observation's
condition, the view of i by B is generated from A's intrinsic latent and B's instrument latent
of the neighbour:

    L_cf = chi2(D_B(E_p(x^A_i), E_s(n^B_i)), x^B_i) + chi2(D_A(E_p(x^B_i), E_s(n^A_i)), x^A_i)   (1)

with the inverse-variance, masked per-pixel chi-square

    chi2(y, x) = sum_p m_p w_p (y_p - x_p)^2 / sum_p m_p.                                      (2)

Galaxy structure can reach the target only through z_p of the *other* instrument, and the
target's PSF and noise only through z_s of *another object*: the objective separates them. A
self term with the neighbour's instrument latent,

    L_self = chi2(D_B(E_p(x^B_i), E_s(n^B_i)), x^B_i)
           + chi2(D_A(E_p(x^A_i), E_s(n^A_i)), x^A_i),                                        (3)

helps z_p early (reconstructed; weight in the config). The flow-matching decoder (from a
third-party summary, reconstructed) replaces the regression by conditional flow matching on
the same conditioning:

    x_t = (1 - t) eps + t x,   L_fm = || v_theta(x_t, t | z_p, z_s) - (x - eps) ||^2,           (4)

sampled by Euler steps of dx/dt = v from x_0 = eps (eq. 5). Baselines use (6), the symmetric
InfoNCE of AstroCLIP-style cross-instrument contrastive learning:

    L_nce = CE(s_ij / tau, i) over rows and columns, s_ij = cos(z^A_i, z^B_j).                  (6)

Shapes in comments: B batch, C bands, H = W stamp side, D latent width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn


def chi2_per_pixel(
    prediction: torch.Tensor,
    target: torch.Tensor,
    inverse_variance: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. (2), one value per item: sum_p m_p w_p (y_p - x_p)^2 / sum_p m_p  -> [B].

    Masked pixels (m = 0: bad, saturated, off the footprint) weigh zero; an item with no
    unmasked pixel contributes 0.
    """
    if mask is None:
        mask = torch.ones_like(target)
    weight = mask * inverse_variance  # [B, C, H, W]
    squared = weight * (prediction - target) ** 2
    per_item = squared.flatten(1).sum(1)
    return per_item / mask.flatten(1).sum(1).clamp_min(1.0)


def chi2_loss(prediction, target, inverse_variance, mask=None) -> torch.Tensor:
    """Eq. (2) averaged over the batch."""
    return chi2_per_pixel(prediction, target, inverse_variance, mask).mean()


def info_nce(z_a: torch.Tensor, z_b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (6): symmetric InfoNCE between row-aligned batches [B, D] (positives on the
    diagonal, cosine similarity)."""
    logits = F.normalize(z_a, dim=1) @ F.normalize(z_b, dim=1).T / temperature  # [B, B]
    labels = torch.arange(len(z_a), device=z_a.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def flow_matching_pair(
    clean: torch.Tensor, noise: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (4): the interpolant x_t = (1 - t) eps + t x and its velocity target x - eps."""
    t = t.view(-1, *([1] * (clean.dim() - 1)))  # [B, 1, 1, 1]
    return (1.0 - t) * noise + t * clean, clean - noise


def euler_sample(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    noise: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """Eq. (5): integrate dx/dt = v(x, t) from t = 0 (x = noise) to t = 1 in ``steps`` Euler
    steps."""
    x = noise
    for k in range(steps):
        t = torch.full((len(x),), k / steps, device=x.device, dtype=x.dtype)
        x = x + velocity(x, t) / steps
    return x


class Stem(nn.Module):
    """One instrument's input stem: its bands and pixel grid -> a [B, width, 4, 4] map."""

    def __init__(self, bands: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(bands, width, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Encoder(nn.Module):
    """Per-instrument stems into one shared trunk -> a latent [B, dim].

    The same class serves as intrinsic encoder E_p, instrument encoder E_s, and the single
    encoder of the baselines; instruments are named by key ("A", "B")."""

    def __init__(self, bands: Mapping[str, int], dim: int, width: int = 16) -> None:
        super().__init__()
        self.stems = nn.ModuleDict({name: Stem(c, width) for name, c in bands.items()})
        self.trunk = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.GELU(),
            nn.Flatten(),
            nn.Linear(2 * width * 16, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, dim),
        )

    def forward(self, x: torch.Tensor, instrument: str) -> torch.Tensor:
        return self.trunk(self.stems[instrument](x))  # [B, dim]


class FiLMBlock(nn.Module):
    """Upsample x2, convolve, and modulate by the instrument latent: h * (1 + gamma) + beta."""

    def __init__(self, width: int, condition_dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.film = nn.Linear(condition_dim, 2 * width) if condition_dim else None

    def forward(self, h: torch.Tensor, z_s: torch.Tensor) -> torch.Tensor:
        h = self.conv(F.interpolate(h, scale_factor=2, mode="nearest"))
        if self.film is not None:
            gamma, beta = self.film(z_s).chunk(2, dim=1)  # [B, width] each
            h = h * (1 + gamma[..., None, None]) + beta[..., None, None]
        return F.gelu(h)


class Decoder(nn.Module):
    """D_X(z_p, z_s): the deterministic decoder for one instrument (eq. 1 and 3).

    z_p (and z_s) -> a [width, size/4, size/4] map -> two FiLM upsampling blocks conditioned on
    z_s -> the instrument's bands at its stamp size. ``condition_dim = 0`` gives a decoder with
    no instrument latent (the autoencoder and translation baselines)."""

    def __init__(
        self, bands: int, size: int, latent_dim: int, condition_dim: int, width: int = 16
    ) -> None:
        super().__init__()
        if size % 4:
            raise ValueError(
                f"the decoder upsamples twice by 2: stamp size {size} must divide by 4"
            )
        self.width, self.base = width, size // 4
        self.project = nn.Linear(latent_dim + condition_dim, width * self.base**2)
        self.blocks = nn.ModuleList([FiLMBlock(width, condition_dim) for _ in range(2)])
        self.out = nn.Conv2d(width, bands, 3, padding=1)

    def forward(self, z_p: torch.Tensor, z_s: torch.Tensor | None = None) -> torch.Tensor:
        if z_s is None:
            z_s = z_p.new_zeros(len(z_p), 0)
        h = self.project(torch.cat([z_p, z_s], 1)).view(-1, self.width, self.base, self.base)
        for block in self.blocks:
            h = block(F.gelu(h), z_s)
        return self.out(h)  # [B, bands, size, size]


class FlowDecoder(nn.Module):
    """D_X as a conditional flow-matching model (eq. 4-5): a diffusers ``UNet2DModel`` whose
    class embedding is a linear map of [z_p, z_s] to the time-embedding width."""

    def __init__(
        self,
        bands: int,
        size: int,
        latent_dim: int,
        condition_dim: int,
        channels: tuple[int, ...] = (32, 64),
        sample_steps: int = 16,
    ) -> None:
        super().__init__()
        from diffusers import UNet2DModel

        self.sample_steps = sample_steps
        embed = 4 * channels[0]
        self.unet = UNet2DModel(
            sample_size=size,
            in_channels=bands,
            out_channels=bands,
            block_out_channels=channels,
            down_block_types=("DownBlock2D",) * len(channels),
            up_block_types=("UpBlock2D",) * len(channels),
            layers_per_block=1,
            norm_num_groups=8,
            class_embed_type="identity",
        )
        self.condition = nn.Linear(latent_dim + condition_dim, embed)

    def velocity(self, x_t, t, z_p, z_s=None) -> torch.Tensor:
        cond = z_p if z_s is None else torch.cat([z_p, z_s], 1)
        # Time in [0, 1] scaled to the sinusoidal embedding's usual range of diffusion steps.
        return self.unet(x_t, 1000 * t, class_labels=self.condition(cond)).sample

    def loss(self, clean, z_p, z_s, generator: torch.Generator | None = None) -> torch.Tensor:
        """Eq. (4) averaged over pixels and batch."""
        noise = torch.randn(clean.shape, generator=generator, device=clean.device)
        t = torch.rand(len(clean), generator=generator, device=clean.device)
        x_t, target = flow_matching_pair(clean, noise, t)
        return F.mse_loss(self.velocity(x_t, t, z_p, z_s), target)

    @torch.no_grad()
    def sample(self, z_p, z_s=None, shape=None, generator=None) -> torch.Tensor:
        """Eq. (5): one draw per row of z_p."""
        noise = torch.randn(shape, generator=generator, device=z_p.device)
        return euler_sample(lambda x, t: self.velocity(x, t, z_p, z_s), noise, self.sample_steps)
