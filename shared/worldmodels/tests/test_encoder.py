"""The frozen encoder: masked input, frozen weights, a self-supervised fit that learns, the
numbers rla-wm's encoder gave before it moved here, and the ViT input-size checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from papers_worldmodels.encoder import (
    build_encoder,
    check_image_size,
    encode_frames,
    encoder_input_size,
    freeze,
    preprocess,
    pretrain,
    tiny_config,
)
from papers_worldmodels.errors import DataFormatError


@pytest.fixture(autouse=True)
def two_threads():
    torch.set_num_threads(2)


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


def test_the_stand_in_gives_the_numbers_it_gave_in_rla_wm():
    """Loss curve and token sum of a fixed seeded run, recorded with rlawm.encoder before the
    move (same torch and transformers): seeding, initialisation, masking and the mask draw of
    the self-supervision are unchanged. Tolerances allow for another CPU's float rounding."""
    torch.manual_seed(0)
    encoder = build_encoder(tiny_config(image_size=32, patch_size=8, hidden=32, layers=1))
    g = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (16, 32, 32, 3), generator=g, dtype=torch.uint8)
    masks = torch.rand(16, 32, 32, generator=g) > 0.3
    losses = pretrain(encoder, frames, masks, steps=10, lr=3e-3, batch_size=8, seed=3)
    tokens = encode_frames(freeze(encoder), frames, masks, batch_size=5)
    assert losses[:3] == pytest.approx([1.4395298, 1.4069738, 1.3843161], rel=1e-4)
    assert tokens.sum().item() == pytest.approx(61.651276, abs=5e-3)


def test_check_image_size_and_encoder_input_size():
    check_image_size(224, 14)
    check_image_size(518, 14)
    check_image_size(224, 16)
    with pytest.raises(DataFormatError, match="64 is not a multiple .* 14.*use 56 or 70"):
        check_image_size(64, 14)
    with pytest.raises(DataFormatError, match=r"use 14\.$"):
        check_image_size(10, 14)
    with pytest.raises(DataFormatError, match="patch size must be a positive integer"):
        tiny_config(image_size=32, patch_size=0)

    dinov2 = SimpleNamespace(image_size=518, patch_size=14)
    assert encoder_input_size(dinov2) == 518
    assert encoder_input_size(dinov2, size=224) == 224
    assert encoder_input_size(SimpleNamespace(image_size=(224, 224), patch_size=(16, 16))) == 224
    assert encoder_input_size(tiny_config(image_size=32, patch_size=8)) == 32
    with pytest.raises(DataFormatError, match="use 56 or 70"):
        encoder_input_size(dinov2, size=64)
    with pytest.raises(DataFormatError, match="not square"):
        encoder_input_size(SimpleNamespace(image_size=(224, 256), patch_size=16))
    with pytest.raises(DataFormatError, match="no image_size/patch_size") as info:
        encoder_input_size(SimpleNamespace(hidden_size=384))
    assert info.value.user_facing
