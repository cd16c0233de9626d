"""The five refinement cores F_theta and the observation encoders E, in pure torch.

Every core implements one weight-tied refinement step h_{k+1} = F_theta(h_k, x) with the
encoded observation x injected at every step, so K steps cost K times the same FLOPs:

    iru          gated interpolation cell (IRU, Ghugare et al.):
                 f = sigma(W_f LN[x; h] + 1), i = tanh(W_i LN[x; h]), h <- f*h + (1 - f)*i
    gru          h <- GRUCell(x, h)
    transformer  h <- Block(h + x), one pre-norm transformer block shared across steps (tokens)
    resmlp       h <- h + MLP(LN[x; h])
    conv         h <- h + Conv3x3(GELU(GroupNorm(Conv3x3[x; h]))) on a grid (or a 1 x T strip)

Representations come in three forms: "vector" [B, D], "tokens" [B, N, D] and "spatial"
[B, D, H, W]; ``pool`` turns any of them into the feature z [B, D] that the heads read,
concatenating the feature at the focus position (the agent's cell, the last character) with
the mean over positions.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from papers_cli import ConfigError, UserError

Architecture = Literal["iru", "gru", "transformer", "resmlp", "conv"]
ARCHITECTURES = get_args(Architecture)
# Attention heads of the transformer core and GroupNorm groups of the conv core: both split dim.
CHANNEL_GROUPS = 4
FORM_OF = {
    "iru": "vector",
    "gru": "vector",
    "resmlp": "vector",
    "transformer": "tokens",
    "conv": "spatial",
}
VECTOR_TOKENS = 4  # latent tokens a transformer core uses for a state-vector observation
GRID_OBJECTS, GRID_COLORS, GRID_STATES = 11, 6, 4  # MiniGrid's symbolic encoding
AGENT_OBJECT = 10


def check_architecture(name: str, obs_kind: str, dim: int) -> None:
    """Raise a UserError for an unknown architecture, a ConfigError for one that does not fit
    the observation or the width ``dim``."""
    if name not in ARCHITECTURES:
        raise UserError(
            f"Unknown architecture '{name}'. Choose one of {', '.join(ARCHITECTURES)} "
            "(--model.architecture)."
        )
    if name == "conv" and obs_kind == "vector":
        raise ConfigError(
            "The recurrent conv net refines a grid (or a character strip) and has no spatial "
            "input for a state-vector task; use iru, gru, transformer or resmlp there."
        )
    if name in ("transformer", "conv") and dim % CHANNEL_GROUPS:
        raise ConfigError(
            f"model.dim={dim} must be a multiple of {CHANNEL_GROUPS} for the {name} core (its "
            "attention heads or norm groups split the width); change --model.dim"
        )


class Encoder(nn.Module):
    """E(s): observation -> (x in the core's form, focus mask [B, N] or None)."""

    def __init__(self, obs_kind: str, obs_shape: tuple[int, ...], vocab: int, dim: int, form: str):
        super().__init__()
        self.obs_kind, self.form, self.dim = obs_kind, form, dim
        if obs_kind == "grid":
            width, height = obs_shape[:2]
            self.objects = nn.Embedding(GRID_OBJECTS, dim)
            self.colors = nn.Embedding(GRID_COLORS, dim)
            self.states = nn.Embedding(GRID_STATES, dim)
            self.position = nn.Parameter(torch.zeros(width * height, dim))
            if form == "vector":
                self.flatten = nn.Sequential(nn.Flatten(), nn.Linear(width * height * dim, dim))
        elif obs_kind == "sequence":
            (length,) = obs_shape
            self.tokens = nn.Embedding(vocab, dim)
            self.position = nn.Parameter(torch.zeros(length, dim))
            if form == "vector":
                self.flatten = nn.Sequential(nn.Flatten(), nn.Linear(length * dim, dim))
        elif obs_kind == "vector":
            (features,) = obs_shape
            size = dim * VECTOR_TOKENS if form == "tokens" else dim
            self.mlp = nn.Sequential(nn.Linear(features, dim), nn.GELU(), nn.Linear(dim, size))
        else:
            raise ValueError(f"unknown observation kind {obs_kind!r}")
        nn.init.normal_(getattr(self, "position", torch.empty(0)), std=0.02)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch = obs.shape[0]
        if self.obs_kind == "vector":
            x = self.mlp(obs)  # [B, D] or [B, 4D]
            return (x.view(batch, VECTOR_TOKENS, self.dim) if self.form == "tokens" else x), None
        if self.obs_kind == "grid":
            obs = obs.long()  # [B, W, H, 3]
            cells = self.objects(obs[..., 0]) + self.colors(obs[..., 1]) + self.states(obs[..., 2])
            width, height = obs.shape[1:3]
            tokens = cells.reshape(batch, width * height, self.dim) + self.position
            focus = (obs[..., 0] == AGENT_OBJECT).reshape(batch, -1).float()
            spatial_shape = (width, height)
        else:
            tokens = self.tokens(obs.long()) + self.position  # [B, T, D]
            focus = torch.zeros(tokens.shape[:2], device=obs.device)
            focus[:, -1] = 1.0  # predict the character after the last one
            spatial_shape = (1, tokens.shape[1])
        if self.form == "tokens":
            return tokens, focus
        if self.form == "spatial":
            return tokens.transpose(1, 2).reshape(batch, self.dim, *spatial_shape), focus
        return self.flatten(tokens), None


def pool(h: torch.Tensor, focus: torch.Tensor | None) -> torch.Tensor:
    """Any form -> [B, 2D] (focus feature, mean) or [B, D] for vectors."""
    if h.dim() == 2:
        return h
    tokens = h.flatten(2).transpose(1, 2) if h.dim() == 4 else h  # [B, N, D]
    mean = tokens.mean(1)
    if focus is None:
        return torch.cat([mean, mean], -1)
    weights = focus / focus.sum(1, keepdim=True).clamp_min(1.0)
    return torch.cat([torch.einsum("bn,bnd->bd", weights, tokens), mean], -1)


class GatedInterpolationCell(nn.Module):
    """IRU step: h <- f*h + (1-f)*i with f, i gated on LN[x; h]."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(2 * dim)
        self.forget = nn.Linear(2 * dim, dim)
        self.candidate = nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        joint = self.norm(torch.cat([x, h], -1))
        f = torch.sigmoid(self.forget(joint) + 1.0)  # +1 bias: start close to "keep h"
        return f * h + (1 - f) * torch.tanh(self.candidate(joint))


class GRURefiner(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.cell = nn.GRUCell(dim, dim)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.cell(x, h)


class TransformerRefiner(nn.Module):
    """One pre-norm transformer block, weight-tied across steps, with input injection."""

    def __init__(self, dim: int, heads: int = CHANNEL_GROUPS):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.block(h + x)


class ResidualMLPRefiner(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.LayerNorm(2 * dim), nn.Linear(2 * dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
        )

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(torch.cat([x, h], -1))


class ConvRefiner(nn.Module):
    """Recurrent 3x3 conv net: k steps propagate information k cells ("deep thinking" nets)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.Conv2d(2 * dim, dim, 3, padding=1)
        self.norm = nn.GroupNorm(CHANNEL_GROUPS, dim)
        self.out = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return h + self.out(nn.functional.gelu(self.norm(self.mix(torch.cat([x, h], 1)))))


def make_refiner(name: str, dim: int) -> nn.Module:
    """F_theta for one of the five architectures."""
    return {
        "iru": GatedInterpolationCell,
        "gru": GRURefiner,
        "transformer": TransformerRefiner,
        "resmlp": ResidualMLPRefiner,
        "conv": ConvRefiner,
    }[name](dim)
