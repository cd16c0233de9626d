"""The stand-in encoder's self-supervision: colour-invariant contrastive pretraining.

DINO's features are robust to colour because its training compares views under colour jitter;
masked-patch prediction alone (papers_worldmodels.encoder.pretrain) leaves a tiny ViT's tokens
dominated by colour: a linear probe of the agent's position from them scored R^2 about 0 on new
episodes at full distractor strength (results/pilots/README.md). So the stand-in is trained the
DINO/SimCLR way: two colour-jittered views of one frame (per-image channel permutation, gain and
offset; the geometry untouched) are positives, the other frames of the batch negatives (InfoNCE
on a linear head over the pooled token grid, which keeps where things are). Objects that are not
the agent (the distractors) stay in the features: nothing tells the encoder they do not matter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papers_worldmodels.encoder import MEAN, STD, patch_tokens


def colour_jitter(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per-image random channel permutation, gain in [0.5, 1.5] and offset in [-0.3, 0.3] of
    [B, 3, H, W] images in [0, 1], clamped to [0, 1]."""
    b = images.shape[0]
    order = torch.argsort(torch.rand(b, 3, generator=generator), dim=1)
    permuted = images[torch.arange(b)[:, None], order]
    gain = 0.5 + torch.rand(b, 3, 1, 1, generator=generator)
    offset = 0.6 * torch.rand(b, 3, 1, 1, generator=generator) - 0.3
    return (permuted * gain + offset).clamp(0, 1)


def view_embedding(encoder, head: nn.Linear, images: torch.Tensor, grid: int) -> torch.Tensor:
    """A unit vector per image: the head over the token grid average-pooled to grid x grid."""
    tokens = patch_tokens(encoder, (images - MEAN) / STD)
    side = int(tokens.shape[1] ** 0.5)
    x = tokens.transpose(1, 2).reshape(len(tokens), -1, side, side)
    pooled = F.adaptive_avg_pool2d(x, grid).flatten(1)
    return F.normalize(head(pooled), dim=-1)


def pretrain_invariant(
    encoder,
    frames: torch.Tensor,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    temperature: float = 0.1,
    grid: int = 4,
    seed: int = 0,
) -> list[float]:
    """SimCLR-style pretraining of ``encoder`` on uint8 frames [N, H, W, 3]; the loss curve."""
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(encoder.config.hidden_size * grid * grid, 128)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=lr)
    encoder.train()
    losses = []
    for _ in range(steps):
        index = torch.randint(len(frames), (batch_size,), generator=generator)
        images = frames[index].permute(0, 3, 1, 2).float() / 255.0
        a = view_embedding(encoder, head, colour_jitter(images, generator), grid)
        b = view_embedding(encoder, head, colour_jitter(images, generator), grid)
        logits = a @ b.T / temperature
        target = torch.arange(batch_size)
        loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    encoder.eval()
    return losses
