"""The frozen visual encoder: ViT patch tokens of foreground-masked frames.

Paper scale: a pretrained DINOv2 / DINOv3 from a local folder (``from_pretrained`` with
``local_files_only=True``). Miniature: the same transformers class (``Dinov2Model``) with a tiny
config, self-supervised once on frames of separate episodes by masked-patch prediction
(SimMIM-style: the model's own mask token replaces half the patches, a linear head predicts
their pixels), then frozen. It is a stand-in for DINO, not DINO: no semantic features are
claimed for it.

Also the checks that tie frames to the encoder: ViT input sizes (multiples of the patch size).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

# Imported here, at module import, on purpose: importing transformers' model classes after a
# MuJoCo EGL renderer exists crashes the process (segfault, seen with mujoco 4.0 + llvmpipe), so
# every pipeline imports this module before it builds a scene.
from transformers import AutoModel, Dinov2Config, Dinov2Model

from papers_worldmodels.errors import DataFormatError

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)  # ImageNet statistics, as DINO
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def tiny_config(
    image_size: int = 64, patch_size: int = 8, hidden: int = 128, layers: int = 4, heads: int = 4
):
    """A Dinov2Config small enough for 2 CPU cores (64 patch tokens of width 128 at 64x64)."""
    check_image_size(image_size, patch_size)
    return Dinov2Config(
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        layerscale_value=1.0,
    )


def build_encoder(config=None, pretrained: Path | None = None) -> nn.Module:
    """A Dinov2Model from ``pretrained`` (a local folder, never the hub) or from ``config``."""
    if pretrained is not None:
        if not Path(pretrained).is_dir():
            raise FileNotFoundError(
                f"no encoder checkpoint at {pretrained}: put a DINOv2/DINOv3 folder there "
                "(config.json + model.safetensors, as saved by save_pretrained)"
            )
        return AutoModel.from_pretrained(pretrained, local_files_only=True)
    return Dinov2Model(config or tiny_config())


def preprocess(frames: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """uint8 [B, H, W, 3] frames (and bool [B, H, W] foreground masks) -> normalised [B, 3, H, W].

    The frame is multiplied by its foreground mask before encoding, as in the paper.
    """
    images = frames.permute(0, 3, 1, 2).float() / 255.0
    if masks is not None:
        images = images * masks[:, None].float()
    return (images - MEAN) / STD


def patch_tokens(encoder: nn.Module, pixels: torch.Tensor, bool_masked_pos=None) -> torch.Tensor:
    """The encoder's patch tokens [B, L, C] (the class token and any registers dropped)."""
    hidden = encoder(pixel_values=pixels, bool_masked_pos=bool_masked_pos).last_hidden_state
    patches = (pixels.shape[-1] // encoder.config.patch_size) ** 2
    return hidden[:, -patches:]


@torch.no_grad()
def encode_frames(encoder: nn.Module, frames, masks, batch_size: int = 256) -> torch.Tensor:
    """Frozen tokens of many frames, in batches: uint8 [N, H, W, 3] -> float [N, L, C];
    ``masks`` (bool [N, H, W]) may be None."""
    encoder.eval()
    out = [
        patch_tokens(
            encoder, preprocess(frames[i : i + batch_size], _rows(masks, slice(i, i + batch_size)))
        )
        for i in range(0, len(frames), batch_size)
    ]
    return torch.cat(out)


def freeze(encoder: nn.Module) -> nn.Module:
    """Evaluation mode and no gradients: the world models train on its tokens, never into it."""
    encoder.eval()
    for parameter in encoder.parameters():
        parameter.requires_grad_(False)
    return encoder


def masked_patch_loss(encoder, head: nn.Linear, pixels, mask_ratio: float, generator):
    """SimMIM-style loss: L1 between the pixels of masked patches and their linear prediction."""
    size = encoder.config.patch_size
    grid = pixels.shape[-1] // size
    masked = torch.rand(pixels.shape[0], grid * grid, generator=generator) < mask_ratio
    predicted = head(patch_tokens(encoder, pixels, bool_masked_pos=masked))  # [B, L, 3 p^2]
    target = pixels.unfold(2, size, size).unfold(3, size, size)  # [B, 3, g, g, p, p]
    target = target.permute(0, 2, 3, 1, 4, 5).reshape(pixels.shape[0], grid * grid, -1)
    return (predicted - target).abs()[masked].mean()


def pretrain(
    encoder,
    frames,
    masks,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    mask_ratio: float = 0.5,
    seed: int = 0,
) -> list[float]:
    """Self-supervise the stand-in encoder on separate frames; returns the loss curve."""
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(encoder.config.hidden_size, 3 * encoder.config.patch_size**2)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=lr)
    encoder.train()
    losses = []
    for _ in range(steps):
        index = torch.randint(len(frames), (batch_size,), generator=generator)
        loss = masked_patch_loss(
            encoder, head, preprocess(frames[index], _rows(masks, index)), mask_ratio, generator
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------- input sizes


def check_image_size(image_size: int, patch_size: int) -> None:
    """A ViT input size must be a positive multiple of the patch size."""
    if not isinstance(patch_size, int) or patch_size <= 0:
        raise DataFormatError(f"The patch size must be a positive integer, got {patch_size!r}.")
    if not isinstance(image_size, int) or image_size <= 0:
        raise DataFormatError(f"The image size must be a positive integer, got {image_size!r}.")
    if image_size % patch_size == 0:
        return
    lower = image_size // patch_size * patch_size
    options = [n for n in (lower, lower + patch_size) if n > 0]
    raise DataFormatError(
        f"Image size {image_size} is not a multiple of the encoder's patch size {patch_size} "
        f"(DINOv2: 14, DINOv3: 16); use {' or '.join(map(str, options))}."
    )


def encoder_input_size(config, *, size: int | None = None) -> int:
    """The square size frames are resized to for an encoder ``config`` (anything with
    ``image_size`` and ``patch_size``): ``size`` when given, else the config's own."""
    try:
        image_size, patch_size = config.image_size, config.patch_size
    except AttributeError as error:
        raise DataFormatError(
            f"The encoder config {type(config).__name__} has no image_size/patch_size; "
            "expected a ViT config such as Dinov2Config or DINOv3ViTConfig."
        ) from error
    image_size, patch_size = _square(image_size, "image_size"), _square(patch_size, "patch_size")
    chosen = image_size if size is None else size
    check_image_size(chosen, patch_size)
    return chosen


def _square(value, what: str) -> int:
    # transformers configs give sizes as an int or an (h, w) pair.
    if isinstance(value, Sequence):
        if len(value) != 2 or value[0] != value[1]:
            raise DataFormatError(f"The encoder's {what} {value} is not square; expected one size.")
        value = value[0]
    return int(value)


def _rows(masks, index):
    """Rows of optional foreground masks (None: frames are encoded unmasked)."""
    return None if masks is None else masks[index]
