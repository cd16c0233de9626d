"""RLA-WM: a feature-space world model that predicts Residual Latent Actions by flow matching.

Notation: a frozen ViT turns a (foreground-masked) frame into patch tokens x_t in R^{L x C}; an
action chunk a_{t:t+h} in R^{h x A} moves the scene h steps ahead.

Residual Latent Action (RLA) autoencoder:
    z = E_rla(x_{t+h} - x_t)                      in R^{N x d}, N latent tokens     (Eq. 1)
    x_hat_{t+h} = D_rla(x_t, z)                                                      (Eq. 2)
    L_rla = lambda_1 |x_hat - x_{t+h}|_1 + lambda_2 |x_hat - x_{t+h}|^2 (+ VQ terms)   (Eq. 3)
The encoder only sees the residual, so a static scene encodes from zero input and z has to
carry the motion; "concat" (E sees [x_t ; x_{t+h}]) is the ablation.

RLA world model (RLA-WM), rectified flow over z given x_t and the action chunk:
    z_tau = (1 - tau) eps + tau z,   eps ~ N(0, I),  tau ~ U[0, 1]                     (Eq. 4)
    L_FM = E |v_theta(z_tau, tau | x_t, a) - (z - eps)|^2                             (Eq. 5)
    sample: z <- eps; z <- z + v_theta(z, tau_k) / K for tau_k = k / K, k = 0..K-1   (Eq. 6)
    x_hat_{t+h} = D_rla(x_t, z), rolled out autoregressively chunk by chunk.        (Eq. 7)
v_theta is two-stage (as the official code): a conditioning stage of AdaLN blocks over x_t
tokens modulated by the action token (GRU over the chunk + horizon embedding) gives
condition queries once; the flow stage (blocks modulated by tau, cross-attending to the
queries) is evaluated at every Euler step; its output projection starts at zero.

Evaluation measures (reconstructed; the paper reports DINO-L1 / LPIPS):
    energy distance  D^2(P, Q) = 2 E|X - Y| - E|X - X'| - E|Y - Y'|                   (Eq. 8)
    collapse ratio   rho = spread(predictions) / spread(truth), per start and chunk   (Eq. 9)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

ResidualMode = Literal["sub", "concat"]


def encoder_input(x_t: torch.Tensor, x_next: torch.Tensor, mode: ResidualMode) -> torch.Tensor:
    """The RLA encoder's input (Eq. 1): x_{t+h} - x_t, or [x_t ; x_{t+h}] (the ablation)."""
    if x_t.shape != x_next.shape:
        raise ValueError(f"x_t {tuple(x_t.shape)} and x_t+h {tuple(x_next.shape)} differ")
    if mode == "sub":
        return x_next - x_t  # [B, L, C]
    if mode == "concat":
        return torch.cat([x_t, x_next], dim=-1)  # [B, L, 2C]
    raise ValueError(f"unknown residual mode {mode!r}; use 'sub' or 'concat'")


def rla_reconstruction_loss(
    prediction: torch.Tensor, target: torch.Tensor, l1_weight: float = 1.0, mse_weight: float = 1.0
) -> torch.Tensor:
    """Eq. 3 without the VQ terms: lambda_1 * mean L1 + lambda_2 * mean squared error."""
    return (
        l1_weight * (prediction - target).abs().mean()
        + mse_weight * (prediction - target).pow(2).mean()
    )


def vector_quantize(
    z: torch.Tensor, codebook: torch.Tensor, beta: float = 0.25
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optional VQ of the latent tokens: nearest code, straight-through gradient, and the VQ-VAE
    loss |sg(z) - e|^2 + beta |z - sg(e)|^2. z [B, N, d], codebook [K, d]."""
    flat = z.reshape(-1, z.shape[-1])  # [B*N, d]
    codes = codebook[torch.cdist(flat, codebook).argmin(dim=1)].reshape(z.shape)
    loss = F.mse_loss(codes, z.detach()) + beta * F.mse_loss(z, codes.detach())
    return z + (codes - z).detach(), loss


def flow_interpolant(z: torch.Tensor, noise: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Eq. 4: z_tau = (1 - tau) eps + tau z; tau [B] broadcast over the latent's other axes."""
    tau = tau.reshape(-1, *([1] * (z.dim() - 1)))
    return (1 - tau) * noise + tau * z


def flow_target(z: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The rectified-flow velocity of Eq. 5: d z_tau / d tau = z - eps."""
    return z - noise


def flow_matching_loss(
    velocity: torch.Tensor, z: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Eq. 5: mean squared error between the predicted and the target velocity."""
    return (velocity - flow_target(z, noise)).pow(2).mean()


def euler_sample(
    velocity_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    noise: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """Eq. 6: integrate dz/dtau = v(z, tau) from tau = 0 (noise) to 1 with ``steps`` Euler steps."""
    if steps < 1:
        raise ValueError(f"Euler sampling needs at least one step, got {steps}")
    z = noise
    for k in range(steps):
        tau = torch.full((z.shape[0],), k / steps, dtype=z.dtype, device=z.device)
        z = z + velocity_fn(z, tau) / steps
    return z


def timestep_embedding(tau: torch.Tensor, dim: int, max_period: float = 1000.0) -> torch.Tensor:
    """Sinusoidal embedding of tau in [0, 1] (scaled by 1000, as timesteps): [B] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=tau.device) / half)
    angles = 1000.0 * tau[:, None].float() * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(tau.dtype)


def transformer(width: int, depth: int, heads: int) -> nn.TransformerEncoder:
    """Pre-norm transformer blocks (torch's own layer; SDPA attention, no flash-attn dependency)."""
    layer = nn.TransformerEncoderLayer(
        width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    return nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)


class RLAEncoder(nn.Module):
    """E_rla of Eq. 1: residual tokens [B, L, C_in] -> latent tokens [B, N, d] (learned queries)."""

    def __init__(
        self,
        in_dim: int,
        tokens: int,
        width: int,
        depth: int,
        heads: int,
        latent_tokens: int,
        latent_dim: int,
    ):
        super().__init__()
        self.project = nn.Linear(in_dim, width)
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.queries = nn.Parameter(torch.randn(1, latent_tokens, width) * 0.02)
        self.blocks = transformer(width, depth, heads)
        self.out = nn.Linear(width, latent_dim)

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        tokens = self.project(residual) + self.position  # [B, L, W]
        queries = self.queries.expand(residual.shape[0], -1, -1)  # [B, N, W]
        hidden = self.blocks(torch.cat([queries, tokens], dim=1))
        return self.out(hidden[:, : queries.shape[1]])  # [B, N, d]


class RLADecoder(nn.Module):
    """D_rla of Eq. 2: (x_t [B, L, C], z [B, N, d]) -> x_hat_{t+h} [B, L, C].

    It predicts the change x_hat - x_t from the joint sequence [x_t ; z]; the last projection
    starts at zero, so an untrained decoder copies x_t (the persistence baseline) [R].
    """

    def __init__(
        self, token_dim: int, tokens: int, width: int, depth: int, heads: int, latent_dim: int
    ):
        super().__init__()
        self.project = nn.Linear(token_dim, width)
        self.project_latent = nn.Linear(latent_dim, width)
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = transformer(width, depth, heads)
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, token_dim))
        nn.init.zeros_(self.out[1].weight)
        nn.init.zeros_(self.out[1].bias)

    def forward(self, x_t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        hidden = torch.cat([self.project(x_t) + self.position, self.project_latent(z)], dim=1)
        hidden = self.blocks(hidden)[:, : x_t.shape[1]]  # [B, L, W]
        return x_t + self.out(hidden)


class RLAAutoencoder(nn.Module):
    """Eqs. 1-3: the residual encoder, the decoder and an optional VQ codebook."""

    def __init__(
        self,
        token_dim: int,
        tokens: int,
        width: int = 128,
        depth: int = 2,
        heads: int = 4,
        latent_tokens: int = 8,
        latent_dim: int = 8,
        mode: ResidualMode = "sub",
        codebook_size: int = 0,
    ):
        super().__init__()
        self.mode = mode
        in_dim = 2 * token_dim if mode == "concat" else token_dim
        self.encoder = RLAEncoder(in_dim, tokens, width, depth, heads, latent_tokens, latent_dim)
        self.decoder = RLADecoder(token_dim, tokens, width, depth, heads, latent_dim)
        self.codebook = (
            nn.Parameter(torch.randn(codebook_size, latent_dim)) if codebook_size else None
        )

    def encode(self, x_t: torch.Tensor, x_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z = E(x_{t+h} - x_t) (Eq. 1), quantised when a codebook exists; returns (z, vq loss)."""
        z = self.encoder(encoder_input(x_t, x_next, self.mode))
        if self.codebook is None:
            return z, z.new_zeros(())
        return vector_quantize(z, self.codebook)

    def decode(self, x_t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(x_t, z)

    def loss(
        self,
        x_t: torch.Tensor,
        x_next: torch.Tensor,
        l1_weight: float = 1.0,
        mse_weight: float = 1.0,
    ) -> torch.Tensor:
        """Eq. 3 (with the VQ terms when quantising)."""
        z, vq_loss = self.encode(x_t, x_next)
        return rla_reconstruction_loss(self.decode(x_t, z), x_next, l1_weight, mse_weight) + vq_loss


class ActionChunkEncoder(nn.Module):
    """The action token: a GRU over the chunk [B, h, A] plus a horizon embedding -> [B, W]."""

    def __init__(self, action_dim: int, width: int, max_horizon: int = 64):
        super().__init__()
        self.gru = nn.GRU(action_dim, width, batch_first=True)
        self.horizon = nn.Embedding(max_horizon + 1, width)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(actions)  # [1, B, W]
        horizon = torch.full((actions.shape[0],), actions.shape[1], device=actions.device)
        return last[0] + self.horizon(horizon)


class AdaLNBlock(nn.Module):
    """A transformer block whose layer norms are modulated (shift, scale, gate) by a vector c;
    with ``cross`` it also attends to a context (the flow stage's view of the condition queries)."""

    def __init__(self, width: int, heads: int, cross: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.cross = nn.MultiheadAttention(width, heads, batch_first=True) if cross else None
        self.norm_cross = nn.LayerNorm(width) if cross else None
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.modulation = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.modulation.weight)  # every block starts as the identity
        nn.init.zeros_(self.modulation.bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor, context: torch.Tensor | None = None):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c)[:, None].chunk(6, dim=-1)
        x = self.norm1(h) * (1 + scale1) + shift1
        h = h + gate1 * self.attention(x, x, x, need_weights=False)[0]
        if self.cross is not None:
            q = self.norm_cross(h)
            h = h + self.cross(q, context, context, need_weights=False)[0]
        x = self.norm2(h) * (1 + scale2) + shift2
        return h + gate2 * self.mlp(x)


class ActionConditionedTokens(nn.Module):
    """x_t tokens [B, L, C] -> [B, L, W]: projected, positioned, then AdaLN blocks modulated by
    the action token (the RLA-WM conditioning stage; the regression baselines share it)."""

    def __init__(
        self, token_dim: int, tokens: int, action_dim: int, width: int, depth: int, heads: int
    ):
        super().__init__()
        self.project = nn.Linear(token_dim, width)
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.action_encoder = ActionChunkEncoder(action_dim, width)
        self.blocks = nn.ModuleList(AdaLNBlock(width, heads) for _ in range(depth))

    def forward(self, x_t: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        action_token = self.action_encoder(actions)  # [B, W]
        h = self.project(x_t) + self.position
        for block in self.blocks:
            h = block(h, action_token)
        return h


class RLAWorldModel(nn.Module):
    """v_theta of Eq. 5: a conditioning stage (once) and a flow stage (every Euler step)."""

    def __init__(
        self,
        token_dim: int,
        tokens: int,
        action_dim: int,
        latent_tokens: int = 8,
        latent_dim: int = 8,
        width: int = 128,
        cond_depth: int = 2,
        flow_depth: int = 2,
        heads: int = 4,
    ):
        super().__init__()
        self.latent_shape = (latent_tokens, latent_dim)
        self.condition = ActionConditionedTokens(
            token_dim, tokens, action_dim, width, cond_depth, heads
        )
        self.project_latent = nn.Linear(latent_dim, width)
        self.latent_position = nn.Parameter(torch.randn(1, latent_tokens, width) * 0.02)
        self.time = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.flow_blocks = nn.ModuleList(
            AdaLNBlock(width, heads, cross=True) for _ in range(flow_depth)
        )
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, latent_dim))
        nn.init.zeros_(self.out[1].weight)  # zero-init velocity head (as the official model)
        nn.init.zeros_(self.out[1].bias)
        self.width = width

    def forward_cond(self, x_t: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Condition queries [B, L, W] from x_t tokens [B, L, C] and the chunk [B, h, A]."""
        return self.condition(x_t, actions)

    def forward_flow(self, z_tau: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor):
        """The velocity v_theta(z_tau, tau | cond): [B, N, d]."""
        c = self.time(timestep_embedding(tau, self.width))
        h = self.project_latent(z_tau) + self.latent_position
        for block in self.flow_blocks:
            h = block(h, c, cond)
        return self.out(h)

    def loss(self, x_t, actions, z, generator: torch.Generator | None = None) -> torch.Tensor:
        """Eq. 5 with tau ~ U[0, 1] and eps ~ N(0, I) drawn from ``generator`` (seeded)."""
        noise = torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
        tau = torch.rand(z.shape[0], generator=generator, device=z.device, dtype=z.dtype)
        velocity = self.forward_flow(
            flow_interpolant(z, noise, tau), tau, self.forward_cond(x_t, actions)
        )
        return flow_matching_loss(velocity, z, noise)

    def sample(self, x_t, actions, steps: int = 10, generator: torch.Generator | None = None):
        """Eq. 6: one RLA sample [B, N, d] per start, from seeded noise."""
        cond = self.forward_cond(x_t, actions)
        noise = torch.randn(
            (x_t.shape[0], *self.latent_shape),
            generator=generator,
            device=x_t.device,
            dtype=x_t.dtype,
        )
        return euler_sample(lambda z, tau: self.forward_flow(z, tau, cond), noise, steps)


def rollout(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x_t: torch.Tensor,
    action_chunks: torch.Tensor,
) -> torch.Tensor:
    """Eq. 7: autoregress a one-chunk predictor over chunks [B, K, h, A] -> tokens [B, K, L, C]."""
    predictions = []
    for k in range(action_chunks.shape[1]):
        x_t = step(x_t, action_chunks[:, k])
        predictions.append(x_t)
    return torch.stack(predictions, dim=1)


def energy_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Eq. 8 (V-statistic): 2 mean|x_i - y_j| - mean|x_i - x_j| - mean|y_i - y_j|.

    x [n, D], y [m, D].
    """
    return 2 * torch.cdist(x, y).mean() - torch.cdist(x, x).mean() - torch.cdist(y, y).mean()


def spread(samples: torch.Tensor) -> torch.Tensor:
    """Root mean per-dimension variance (population) of a set of samples [n, D]."""
    return samples.var(dim=0, unbiased=False).mean().sqrt()


def collapse_ratio(predictions: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Eq. 9: spread of predictions over spread of true outcomes of one start and chunk."""
    return spread(predictions) / spread(truth).clamp_min(1e-12)


def pooled_collapse_ratio(
    predictions: torch.Tensor, truth: torch.Tensor, min_truth_spread: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9 pooled over groups: mean prediction spread / mean truth spread, over the groups
    whose truth spread reaches ``min_truth_spread`` (a mean of per-group ratios is dominated by
    groups whose outcomes barely differ, seen in the pilots). predictions [G, n, D], truth
    [G, m, D]; returns (ratio, mask of the groups kept [G])."""
    truth_spread = torch.stack([spread(group) for group in truth])  # [G]
    prediction_spread = torch.stack([spread(group) for group in predictions])  # [G]
    kept = truth_spread >= min_truth_spread
    if not kept.any():
        raise ValueError(f"no group's true outcomes spread by {min_truth_spread} or more")
    return prediction_spread[kept].mean() / truth_spread[kept].mean(), kept
