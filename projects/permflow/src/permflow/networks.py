"""Permutation-equivariant networks shared by PermFlow and the Sinkhorn baselines.

* ``SortingNet`` (task A): a per-item CNN encodes each image, a transformer mixes the items;
  cells (item i, rank r) carry the item's token, a rank embedding and (flow) x_t[i, r] and a
  time embedding; axial attention along ranks and along items (no positional encoding over
  items, so permuting the items permutes the outputs). The head emits v[i, r] (flow) or the
  Sinkhorn logit[i, r].
* ``AxialNet`` (task B, assignment): cells (i, j) carry [C_ij, x_t_ij, t-emb]; blocks alternate
  attention along rows and along columns, so the map is equivariant to independent permutations
  of rows and of columns. The head emits v_ij (or logit_ij).
"""

import math

import torch
from torch import nn


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of t in [0, 1]. t: [B] -> [B, dim]."""
    freqs = torch.exp(torch.arange(dim // 2, device=t.device) * (-math.log(1000.0) / (dim // 2)))
    angles = 1000.0 * t.float().unsqueeze(-1) * freqs  # [B, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(t.dtype)


class DigitEncoder(nn.Module):
    """Small CNN: one grey image [1, s, digits * s] (a number's digits side by side) -> feature
    vector [out_dim]; the pooled grid keeps 2 x 2 cells per digit, so digit order survives."""

    def __init__(self, out_dim: int = 64, channels: tuple[int, ...] = (16, 32), digits: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 1
        for ch in channels:
            layers += [nn.Conv2d(in_ch, ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            in_ch = ch
        pooled = nn.AdaptiveAvgPool2d((2, 2 * digits))
        layers += [pooled, nn.Flatten(), nn.Linear(in_ch * 4 * digits, out_dim)]
        self.net = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


class SortingNet(nn.Module):
    """Task A: per-item CNN, a transformer over items, then axial attention over the item x rank
    grid.

    The item transformer (no positional encoding) compares the items' digits. Cell (i, r) then
    holds [item i's token + a learned embedding of rank r] and, for the flow, [x_t[i, r], time];
    ``grid_depth`` axial blocks alternate attention along the ranks of one item and along the
    items of one rank, so routing "item i to rank r" can weigh every other item's claim on rank
    r, which a per-item token that sees only its own row of x_t cannot. The head emits v[i, r]
    (flow) or the Sinkhorn logit[i, r]. Equivariant over items; ranks are an ordered axis.
    """

    def __init__(
        self,
        n: int,
        flow: bool,
        width: int = 32,
        depth: int = 2,
        heads: int = 4,
        image_dim: int = 64,
        time_dim: int = 16,
        channels: tuple[int, ...] = (16, 32),
        digits: int = 1,
        grid_depth: int = 1,
    ):
        super().__init__()
        self.n, self.flow, self.time_dim = n, flow, time_dim
        self.encoder = DigitEncoder(image_dim, channels, digits)
        self.embed = nn.Linear(image_dim, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.trunk = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        # Unit-scale rank codes: the flow's cells also carry the noisy x_t[i, r], and with codes
        # at 0.02 the ranks were indistinguishable under it, so the field learned to read x_t
        # alone and ignored the images (chance accuracy after 500 steps; the Sinkhorn network,
        # which has no x_t, learned anyway).
        self.rank = nn.Parameter(torch.randn(n, width))  # [n ranks, width]
        self.cell = nn.Linear(1 + time_dim, width) if flow else None
        self.grid = nn.Sequential(*[AxialBlock(width, heads) for _ in range(grid_depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def encode_items(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, n, 1, s, w] -> features [B, n, image_dim]; reused across ODE steps."""
        b, n = images.shape[:2]
        return self.encoder(images.flatten(0, 1)).view(b, n, -1)

    def forward(self, features, x=None, t=None) -> torch.Tensor:
        """features [B, n, image_dim], x [B, n, n], t [B] -> velocity or logits [B, n, n]."""
        b, n, _ = features.shape
        items = self.trunk(self.embed(features))  # [B, n, W]
        h = items.unsqueeze(2) + self.rank[:n].view(1, 1, n, -1)  # [B, n items, n ranks, W]
        if self.flow:
            temb = time_embedding(t, self.time_dim).to(features.dtype)  # [B, time_dim]
            cells = [x.to(features.dtype).unsqueeze(-1), temb.view(b, 1, 1, -1).expand(b, n, n, -1)]
            h = h + self.cell(torch.cat(cells, -1))
        return self.head(self.grid(h)).squeeze(-1)


class AxialBlock(nn.Module):
    """Self-attention along rows (over j for each i), then along columns (over i for each j)."""

    def __init__(self, width: int, heads: int):
        super().__init__()

        def layer():
            return nn.TransformerEncoderLayer(
                width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
            )

        self.row_attention, self.col_attention = layer(), layer()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, n, m, d = h.shape  # [B, rows, cols, width]
        h = self.row_attention(h.reshape(b * n, m, d)).view(b, n, m, d)
        h = h.transpose(1, 2).reshape(b * m, n, d)
        h = self.col_attention(h).view(b, m, n, d).transpose(1, 2)
        return h.contiguous()


class AxialNet(nn.Module):
    """Task B: axial attention over the n x n grid of cost-matrix cells."""

    def __init__(self, flow: bool, width: int = 32, depth: int = 2, heads: int = 4, time_dim=16):
        super().__init__()
        self.flow, self.time_dim = flow, time_dim
        self.embed = nn.Linear(1 + (1 + time_dim if flow else 0), width)
        self.blocks = nn.Sequential(*[AxialBlock(width, heads) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def forward(self, cost, x=None, t=None) -> torch.Tensor:
        """cost [B, n, n], x [B, n, n], t [B] -> velocity or logits [B, n, n]."""
        b, n, _ = cost.shape
        cells = [cost.unsqueeze(-1)]  # [B, n, n, 1]
        if self.flow:
            temb = time_embedding(t, self.time_dim).to(cost.dtype)  # [B, time_dim]
            cells += [x.to(cost.dtype).unsqueeze(-1), temb.view(b, 1, 1, -1).expand(b, n, n, -1)]
        return self.head(self.blocks(self.embed(torch.cat(cells, -1)))).squeeze(-1)
