"""Baselines on the same frozen tokens and data, with the interfaces of core.

- ``RegressionWorldModel``: DINO-WM-style direct regression x_t tokens + action chunk ->
  x_{t+h} tokens (L1 + MSE), the predictor the paper says blurs or collapses under ambiguity.
- ``TokenFlowWorldModel``: rectified flow (core Eqs. 4-6) directly in the full token space
  [L, C], the "generative in high-dimensional feature space" baseline.
- ``RLARegressor``: the RLA-WM conditioning network regressing z deterministically (no flow).
- ``persistence``: copy x_t (the negative control).
"""

from __future__ import annotations

import torch
from torch import nn

from rlawm.core import (
    ActionChunkEncoder,
    ActionConditionedTokens,
    AdaLNBlock,
    euler_sample,
    flow_interpolant,
    flow_matching_loss,
    rla_reconstruction_loss,
    timestep_embedding,
)


def persistence(x_t: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Predict no change: x_hat_{t+h} = x_t."""
    return x_t


class RegressionWorldModel(nn.Module):
    """x_hat_{t+h} = x_t + f(x_t, a): AdaLN blocks over x_t tokens modulated by the action token."""

    def __init__(
        self,
        token_dim: int,
        tokens: int,
        action_dim: int,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
    ):
        super().__init__()
        self.condition = ActionConditionedTokens(token_dim, tokens, action_dim, width, depth, heads)
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, token_dim))

    def forward(self, x_t: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return x_t + self.out(self.condition(x_t, actions))

    def loss(self, x_t, actions, x_next, l1_weight: float = 1.0, mse_weight: float = 1.0):
        return rla_reconstruction_loss(self(x_t, actions), x_next, l1_weight, mse_weight)


class TokenFlowWorldModel(nn.Module):
    """Rectified flow over the change x_{t+h} - x_t in full token space, conditioned per token on
    x_t and on the action token through AdaLN (time and action added)."""

    def __init__(
        self,
        token_dim: int,
        tokens: int,
        action_dim: int,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
    ):
        super().__init__()
        self.project = nn.Linear(2 * token_dim, width)
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.action_encoder = ActionChunkEncoder(action_dim, width)
        self.time = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(AdaLNBlock(width, heads) for _ in range(depth))
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, token_dim))
        nn.init.zeros_(self.out[1].weight)
        nn.init.zeros_(self.out[1].bias)
        self.width = width

    def velocity(self, y_tau, tau, x_t, action_token):
        c = action_token + self.time(timestep_embedding(tau, self.width))
        h = self.project(torch.cat([y_tau, x_t], dim=-1)) + self.position
        for block in self.blocks:
            h = block(h, c)
        return self.out(h)

    def loss(self, x_t, actions, x_next, generator: torch.Generator | None = None):
        target = x_next - x_t
        noise = torch.randn(target.shape, generator=generator, dtype=target.dtype)
        tau = torch.rand(target.shape[0], generator=generator, dtype=target.dtype)
        velocity = self.velocity(
            flow_interpolant(target, noise, tau), tau, x_t, self.action_encoder(actions)
        )
        return flow_matching_loss(velocity, target, noise)

    def sample(self, x_t, actions, steps: int = 10, generator: torch.Generator | None = None):
        action_token = self.action_encoder(actions)
        noise = torch.randn(x_t.shape, generator=generator, dtype=x_t.dtype)
        change = euler_sample(lambda y, tau: self.velocity(y, tau, x_t, action_token), noise, steps)
        return x_t + change


class RLARegressor(nn.Module):
    """RLA regressed without flow: the RLA-WM condition queries pooled by learned latent queries."""

    def __init__(
        self,
        token_dim: int,
        tokens: int,
        action_dim: int,
        latent_tokens: int = 8,
        latent_dim: int = 8,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
    ):
        super().__init__()
        self.condition = ActionConditionedTokens(token_dim, tokens, action_dim, width, depth, heads)
        self.queries = nn.Parameter(torch.randn(1, latent_tokens, width) * 0.02)
        self.pool = nn.MultiheadAttention(width, heads, batch_first=True)
        self.out = nn.Linear(width, latent_dim)

    def forward(self, x_t: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        h = self.condition(x_t, actions)
        queries = self.queries.expand(x_t.shape[0], -1, -1)
        return self.out(self.pool(queries, h, h, need_weights=False)[0])  # [B, N, d]

    def loss(self, x_t, actions, z):
        return (self(x_t, actions) - z).pow(2).mean()
