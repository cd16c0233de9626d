"""A DiT that denoises two representations at two different times.

diffusers provides the parts (sinusoidal ``Timesteps``, ``TimestepEmbedding`` MLPs, adaLN-Zero
``AdaLayerNormZero``, ``Attention``, ``FeedForward``, ``AdaLayerNormContinuous``, 2-D sin-cos
position embeddings); its ``DiTTransformer2DModel`` takes a single timestep, so the dual-time
conditioning is written here: each representation's time has its *own* embedding MLP and the
two embeddings are summed (SFD's LightningDiT does the same). Tying them would make the model
blind to which representation is how noisy, silently breaking asynchrony.

Tokens: both representations are patchified onto the same token grid (texture with patch
``patch``, the semantic map with its own patch so the grids match) and their patch embeddings
are summed, which equals SFD's channel concatenation followed by one linear embedding. A
*global* semantic latent (``lead_size=1``: one vector per image, as a class-level code) is
embedded once and added to every token; its velocity is read from the mean over tokens.
"""

from __future__ import annotations

import torch
from diffusers.models.attention import FeedForward
from diffusers.models.attention_processor import Attention
from diffusers.models.embeddings import TimestepEmbedding, Timesteps, get_2d_sincos_pos_embed
from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero
from torch import nn

TIME_SCALE = 1000.0  # t in [0, 1] -> the 0..1000 range diffusers' sinusoidal embedding expects


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)(W/p), C p p]."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, channels: int, size: int, patch: int) -> torch.Tensor:
    """[B, T, C p p] -> [B, C, size, size]."""
    b, grid = tokens.shape[0], size // patch
    x = tokens.reshape(b, grid, grid, channels, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, channels, size, size)


class DiTBlock(nn.Module):
    """adaLN-Zero transformer block (Peebles & Xie), assembled from diffusers modules."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = AdaLayerNormZero(width)
        self.attn = Attention(query_dim=width, heads=heads, dim_head=width // heads, bias=True)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(width, activation_fn="gelu-approximate")

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, emb=condition)
        x = x + gate_msa[:, None] * self.attn(h)
        h = self.norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp[:, None] * self.ff(h)


class DualTimeDiT(nn.Module):
    """v_theta(x_lead, x_lag; t_lead, t_lag, y) -> (v_lead, v_lag).

    ``lag_*``: the texture latent [B, lag_channels, lag_size, lag_size] with patch ``patch``;
    ``lead_*``: the semantic latent [B, lead_channels, lead_size, lead_size], patchified to the
    same grid. ``num_classes`` > 0 adds a label embedding with a null class for CFG.
    """

    def __init__(
        self,
        lag_channels: int = 1,
        lag_size: int = 16,
        lead_channels: int = 4,
        lead_size: int = 4,
        patch: int = 4,
        width: int = 96,
        depth: int = 4,
        heads: int = 4,
        num_classes: int = 0,
    ) -> None:
        super().__init__()
        grid = lag_size // patch
        if lag_size % patch or (lead_size != 1 and lead_size % grid):
            raise ValueError(
                f"texture size {lag_size} must be a multiple of the patch {patch}, and the "
                f"semantic size {lead_size} 1 (global) or a multiple of the token grid {grid}"
            )
        self.lag_shape, self.lead_shape = (lag_channels, lag_size), (lead_channels, lead_size)
        self.global_lead = lead_size == 1
        self.patch, self.lead_patch = patch, 1 if self.global_lead else lead_size // grid
        self.embed_lag = nn.Linear(lag_channels * patch * patch, width)
        self.embed_lead = nn.Linear(lead_channels * self.lead_patch**2, width)
        position = get_2d_sincos_pos_embed(width, grid, base_size=grid, output_type="pt")
        self.register_buffer("position", position.float()[None], persistent=False)
        self.time_features = Timesteps(width, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.embed_t_lead = TimestepEmbedding(width, width)  # separate MLPs: never tie these
        self.embed_t_lag = TimestepEmbedding(width, width)
        self.num_classes = num_classes
        self.embed_class = nn.Embedding(num_classes + 1, width) if num_classes else None
        self.blocks = nn.ModuleList(DiTBlock(width, heads) for _ in range(depth))
        self.norm_out = AdaLayerNormContinuous(width, width, elementwise_affine=False, eps=1e-6)
        self.head_lag = nn.Linear(width, lag_channels * patch * patch)
        self.head_lead = nn.Linear(width, lead_channels * self.lead_patch**2)
        self._zero_init()

    def _zero_init(self) -> None:
        """DiT's adaLN-Zero init: every block starts as the identity and the output as zero."""
        for block in self.blocks:
            nn.init.zeros_(block.norm1.linear.weight)
            nn.init.zeros_(block.norm1.linear.bias)
        for layer in (self.norm_out.linear, self.head_lag, self.head_lead):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def condition(
        self, t_lead: torch.Tensor, t_lag: torch.Tensor, labels: torch.Tensor | None
    ) -> torch.Tensor:
        """c = E_lead(t_lead) + E_lag(t_lag) [+ E_y(y)]  [B, width]."""
        dtype = self.embed_lag.weight.dtype
        c = self.embed_t_lead(self.time_features(t_lead * TIME_SCALE).to(dtype))
        c = c + self.embed_t_lag(self.time_features(t_lag * TIME_SCALE).to(dtype))
        if self.embed_class is not None:
            if labels is None:  # unconditional prediction: the null class
                labels = torch.full_like(t_lead, self.num_classes, dtype=torch.long)
            c = c + self.embed_class(labels)
        return c

    def forward(
        self,
        x_lead: torch.Tensor,
        x_lag: torch.Tensor,
        t_lead: torch.Tensor,
        t_lag: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.embed_lag(patchify(x_lag, self.patch))  # [B, T, width]
        tokens = tokens + self.embed_lead(patchify(x_lead, self.lead_patch)) + self.position
        # a global lead is a single "patch": its embedding [B, 1, width] reaches every token
        c = self.condition(t_lead, t_lag, labels)
        for block in self.blocks:
            tokens = block(tokens, c)
        tokens = self.norm_out(tokens, c)
        v_lag = unpatchify(self.head_lag(tokens), self.lag_shape[0], self.lag_shape[1], self.patch)
        if self.global_lead:  # one vector per image: read it from the mean token
            v_lead = self.head_lead(tokens.mean(1)).reshape(-1, self.lead_shape[0], 1, 1)
        else:
            v_lead = unpatchify(
                self.head_lead(tokens), self.lead_shape[0], self.lead_shape[1], self.lead_patch
            )
        return v_lead, v_lag
