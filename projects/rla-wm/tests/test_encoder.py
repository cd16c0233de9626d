"""The frozen encoder: masked input, frozen weights, a self-supervised fit that learns."""

from __future__ import annotations

import pytest
import torch

from rlawm.encoder import (
    build_encoder,
    encode_frames,
    freeze,
    preprocess,
    pretrain,
    tiny_config,
)


def frames_and_masks(n=8, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (n, size, size, 3), generator=g, dtype=torch.uint8)
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    masks[:, 8:16, 8:16] = True
    return frames, masks


def test_background_outside_the_mask_does_not_reach_the_encoder():
    frames, masks = frames_and_masks()
    changed = frames.clone()
    changed[:, :4] = 0  # outside the foreground
    assert torch.equal(preprocess(frames, masks), preprocess(changed, masks))
    assert not torch.equal(preprocess(frames, None), preprocess(changed, None))


def test_tokens_have_the_patch_grid_shape_and_the_frozen_encoder_has_no_gradients():
    encoder = freeze(build_encoder(tiny_config(image_size=32, patch_size=8, hidden=32, layers=1)))
    frames, masks = frames_and_masks()
    tokens = encode_frames(encoder, frames, masks, batch_size=3)
    assert tokens.shape == (8, 16, 32)
    assert all(not p.requires_grad for p in encoder.parameters())
    # same call, same shapes: bitwise determinism on one machine
    assert torch.equal(tokens, encode_frames(encoder, frames, masks, batch_size=3))
    # Batches of 3 vs one batch of 8: the matrix kernels block the float32 sums differently per
    # batch shape (and per CPU), so the last bits differ (measured up to 2.4e-7 on tokens of
    # size ~1 after the layer norm); a frame mixed up with another would differ by ~1.
    torch.testing.assert_close(tokens, encode_frames(encoder, frames, masks), rtol=1e-5, atol=1e-5)


def test_self_supervised_pretraining_lowers_its_loss():
    torch.manual_seed(0)
    encoder = build_encoder(tiny_config(image_size=32, patch_size=8, hidden=32, layers=1))
    frames, masks = frames_and_masks(n=16)
    losses = pretrain(encoder, frames, masks, steps=40, lr=3e-3, batch_size=8)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_missing_pretrained_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        build_encoder(pretrained=tmp_path / "dinov3")


def test_a_saved_encoder_loads_back_from_its_local_folder(tmp_path):
    config = tiny_config(image_size=32, patch_size=8, hidden=32, layers=1)
    encoder = freeze(build_encoder(config))
    encoder.save_pretrained(tmp_path / "encoder")
    loaded = freeze(build_encoder(pretrained=tmp_path / "encoder"))
    frames, masks = frames_and_masks()
    torch.testing.assert_close(
        encode_frames(loaded, frames, masks), encode_frames(encoder, frames, masks)
    )
