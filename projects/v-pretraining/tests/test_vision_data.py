import numpy as np
import pytest
import torch
from PIL import Image

from papers_data import DatasetNotFoundError
from vpretrain.vision_data import (
    BACKGROUND_FAR,
    BACKGROUND_NEAR,
    DIGIT_DEPTHS,
    ADE20KItems,
    DigitScenesDataModule,
    ImageFolderItems,
    NYUv2Items,
    read_depth_mm,
)

SMALL = {
    "n_unlabeled": 32,
    "n_feedback": 16,
    "n_evaluation": 16,
    "n_probe_train": 16,
    "n_probe_test": 16,
}


def scenes(seed: int) -> DigitScenesDataModule:
    data = DigitScenesDataModule(seed=seed, **SMALL)
    data.setup()
    return data


def test_digit_scenes_are_deterministic_under_a_seed():
    first, again, other = scenes(0), scenes(0), scenes(1)
    for split, items in first.splits.items():
        assert len(items) == SMALL[f"n_{split}"]
        for key, tensor in items.tensors.items():
            assert torch.equal(tensor, again.splits[split].tensors[key])
    assert not torch.equal(
        first.splits["unlabeled"].tensors["image"], other.splits["unlabeled"].tensors["image"]
    )
    assert torch.equal(first.feedback_batch(3)["mask"], again.feedback_batch(3)["mask"])
    assert not torch.equal(first.feedback_batch(3)["mask"], first.feedback_batch(4)["mask"])


def test_masks_and_depth_agree_digits_in_front_of_the_floor():
    items = scenes(0).splits["feedback"].tensors
    images, masks, depth = items["image"], items["mask"], items["depth"]
    assert images.shape == (16, 1, 32, 32) and images.min() >= 0 and images.max() <= 1
    floor = torch.linspace(BACKGROUND_FAR, BACKGROUND_NEAR, 32)[:, None].expand(32, 32)
    digit = masks > 0
    assert digit.any() and (~digit).any() and masks.max() <= 10
    torch.testing.assert_close(depth[~digit], floor.expand_as(depth)[~digit])
    assert (depth[digit] >= DIGIT_DEPTHS[0]).all() and (depth[digit] <= DIGIT_DEPTHS[1]).all()
    assert (depth[digit] < floor.expand_as(depth)[digit]).all()  # nearer than the background
    assert images[:, 0][digit].mean() > images[:, 0][~digit].mean() + 0.2  # digits are drawn


def test_probe_label_is_a_digit_of_the_scene():
    data = scenes(0)
    probe = data.splits["probe_train"].tensors
    assert probe["label"].min() >= 0 and probe["label"].max() <= 9
    assert set(probe) == {"image", "label"}
    assert len(probe["label"].unique()) > 3


def write_ade20k(root):
    for folder in ("training", "validation"):
        (root / "images" / folder).mkdir(parents=True)
        (root / "annotations" / folder).mkdir(parents=True)
        Image.fromarray(np.full((6, 8, 3), 128, np.uint8)).save(root / "images" / folder / "a.jpg")
        classes = np.array([[0, 1, 150, 7]] * 3 + [[0, 0, 2, 2]] * 3, np.uint8).repeat(2, axis=1)
        Image.fromarray(classes).save(root / "annotations" / folder / "a.png")


def test_ade20k_masks_shift_classes_and_ignore_zero(tmp_path):
    write_ade20k(tmp_path)
    items = ADE20KItems(tmp_path, "train", image_size=8, ignore_index=255)
    item = items[0]
    assert item["image"].shape == (3, 8, 8) and item["mask"].dtype == torch.int64
    assert item["mask"][0].tolist() == [255, 255, 0, 0, 149, 149, 6, 6]  # 0 -> ignore, k -> k-1
    assert item["mask"][-1].tolist() == [255, 255, 255, 255, 1, 1, 1, 1]
    assert (item["depth"] == 0).all()  # no depth: all invalid
    (tmp_path / "annotations" / "validation" / "a.png").unlink()
    with pytest.raises(DatasetNotFoundError, match="annotations/validation/a.png"):
        ADE20KItems(tmp_path, "test", image_size=8, ignore_index=255)


def write_nyuv2(root):
    for split in ("train", "test"):
        (root / "images" / split).mkdir(parents=True)
        (root / "depth" / split).mkdir(parents=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / "images" / split / "0001.png")
        millimetres = np.array([[1500, 0, 65535, 1]] * 4, np.uint16)
        Image.fromarray(millimetres).save(root / "depth" / split / "0001.png")


def test_nyuv2_depth_is_uint16_millimetres_with_zero_invalid(tmp_path):
    write_nyuv2(tmp_path)
    metres = read_depth_mm(tmp_path / "depth" / "train" / "0001.png")
    assert metres.dtype == np.float32
    np.testing.assert_allclose(metres[0], [1.5, 0.0, 65.535, 0.001], rtol=1e-6)
    item = NYUv2Items(tmp_path, "train", image_size=4, ignore_index=255)[0]
    torch.testing.assert_close(item["depth"][1], torch.tensor([1.5, 0.0, 65.535, 0.001]))
    assert (item["mask"] == 255).all()  # no segmentation labels
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "depth" / "test" / "0001.png")
    with pytest.raises(ValueError, match="16-bit"):
        read_depth_mm(tmp_path / "depth" / "test" / "0001.png")


def test_image_folder_classes_and_flat_folders(tmp_path):
    for name, shade in (("cat", 10), ("ant", 200)):
        (tmp_path / "train" / name).mkdir(parents=True)
        for i in range(2):
            pixels = np.full((5, 7, 3), shade, np.uint8)
            Image.fromarray(pixels).save(tmp_path / "train" / name / f"{i}.jpg")
    labelled = ImageFolderItems(tmp_path / "train", 16, 3, labelled=True, dataset="probe")
    assert labelled.classes == ["ant", "cat"] and len(labelled) == 4
    item = labelled[0]
    assert item["label"].item() == 0 and item["image"].shape == (3, 16, 16)
    assert item["image"].mean().item() == pytest.approx(200 / 255, abs=0.02)
    unlabeled = ImageFolderItems(tmp_path, 8, 1, labelled=False, dataset="image-folder")
    assert len(unlabeled) == 4 and set(unlabeled[0]) == {"image"}
    with pytest.raises(DatasetNotFoundError, match="image files"):
        ImageFolderItems(tmp_path / "empty", 8, 3, labelled=False, dataset="image-folder")


def test_real_source_never_falls_back_to_the_miniature(tmp_path, monkeypatch):
    monkeypatch.delenv("PAPERS_DATA_ROOT", raising=False)
    data = DigitScenesDataModule(source="real", num_channels=3, num_classes=150)
    with pytest.raises(DatasetNotFoundError, match="--data.unlabeled_root"):
        data.setup()
    write_ade20k(tmp_path / "ade")
    (tmp_path / "images").mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "images" / "x.png")
    data = DigitScenesDataModule(
        source="real",
        num_channels=3,
        num_classes=150,
        unlabeled_root=str(tmp_path / "images"),
        ade20k_root=str(tmp_path / "ade"),
        nyuv2_root=str(tmp_path / "no_nyu"),
    )
    with pytest.raises(DatasetNotFoundError, match="no_nyu"):
        data.setup()
