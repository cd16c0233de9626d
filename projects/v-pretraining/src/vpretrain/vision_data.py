"""Vision data: unlabeled images for the learner, dense feedback scenes for the designer's value,
disjoint evaluation scenes, and a classification probe set (the "don't collapse" guard).

Every item is a dict: ``image`` float [C, H, W] in [0, 1]; dense items add ``mask`` int64 [H, W]
(``ignore_index`` = unlabelled) and ``depth`` float [H, W] in metres (0 = invalid); probe items
add ``label`` int64.

``source="digit_scenes"`` (default): the SYNTHETIC miniature, scenes composed of REAL MNIST
digits (``papers_data.load_mnist_5k``) with labels known by construction (``make_digit_scenes``).
``source="real"``: paper scale, from an image folder (unlabeled), ADE20K (segmentation), NYUv2
(depth) and an ImageNet-style folder (probe); a missing folder or file is a
``DatasetNotFoundError`` naming what to put where, never a fallback to the miniature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from PIL import Image
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate

from papers_cli import ConfigError
from papers_data import (
    DatasetNotFoundError,
    EpochShuffle,
    cached_generate,
    drawn_by_trainer,
    load_mnist_5k,
    resolve_data_root,
)
from papers_gpu import derived_seed, run_seed

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")

# The miniature's geometry: a floor plane whose depth falls from FAR (top row) to NEAR (bottom
# row); digits float in front of it at depths in DIGIT_DEPTHS, drawn larger and brighter the
# nearer they are, so depth can be read from the image.
BACKGROUND_FAR, BACKGROUND_NEAR = 4.0, 2.5
DIGIT_DEPTHS = (1.0, 2.0)
DIGIT_SIZE_AT_1M = 22  # pixels

EXPECTED = {
    "image-folder": ["**/*.jpg or **/*.png"],
    "ade20k": [
        "images/training/*.jpg",
        "annotations/training/*.png",
        "images/validation/*.jpg",
        "annotations/validation/*.png",
    ],
    "nyuv2": ["images/train/*.png", "depth/train/*.png", "images/test/*.png", "depth/test/*.png"],
    "probe": ["train/<class>/*.jpg", "val/<class>/*.jpg"],
}
ROOT_OPTIONS = {
    "image-folder": "unlabeled_root",
    "ade20k": "ade20k_root",
    "nyuv2": "nyuv2_root",
    "probe": "probe_root",
}
HOW_TO_GET = {
    "image-folder": "Put images (jpg/png) under the folder, flat or in subfolders (ImageNet's "
    "train/ folder works as is).",
    "ade20k": "Unpack ADEChallengeData2016 (http://sceneparsing.csail.mit.edu): "
    "images/{training,validation}/*.jpg and annotations/{training,validation}/*.png with the "
    "same file stems, pixel values 0 (other, ignored) and 1..150 (classes).",
    "nyuv2": "Export the NYU Depth v2 labeled split (795 train / 654 test) as "
    "images/{train,test}/<name>.png (RGB) and depth/{train,test}/<name>.png (uint16 "
    "millimetres, 0 = no measurement).",
    "probe": "An ImageNet-style folder: train/<class>/*.jpg and val/<class>/*.jpg.",
}


# --------------------------------------------------------------------------- the miniature


def make_digit_scenes(
    digits: np.ndarray,
    labels: np.ndarray,
    n: int,
    rng: np.random.Generator,
    size: int = 32,
    max_digits: int = 3,
) -> dict[str, np.ndarray]:
    """SYNTHETIC scenes of real digits: ``n`` grey canvases of ``size`` pixels with 1..max_digits
    digits drawn from ``digits`` uint8 [N, 28, 28] (classes ``labels``).

    Each digit sits at its own depth in DIGIT_DEPTHS, in front of a floor whose depth is a known
    vertical gradient; digits are composited far to near, so nearer ones occlude. Returns
    ``image`` float32 [n, 1, size, size], ``mask`` int64 [n, size, size] (digit class + 1,
    0 = background), ``depth`` float32 [n, size, size] (metres) and ``label`` int64 [n] (the
    class of the largest, i.e. nearest, digit).
    """
    rows = np.linspace(0.0, 1.0, size, dtype=np.float32)[:, None]
    floor_depth = np.broadcast_to(
        BACKGROUND_FAR - (BACKGROUND_FAR - BACKGROUND_NEAR) * rows, (size, size)
    )
    images = np.empty((n, 1, size, size), np.float32)
    masks = np.zeros((n, size, size), np.int64)
    depths = np.empty((n, size, size), np.float32)
    probe_labels = np.empty(n, np.int64)
    for i in range(n):
        image = shade(floor_depth).copy()
        depth = floor_depth.copy()
        count = rng.integers(1, max_digits + 1)
        picks = rng.choice(len(digits), size=count, replace=False)
        digit_depths = np.sort(rng.uniform(*DIGIT_DEPTHS, size=count))[::-1]  # far to near
        for pick, digit_depth in zip(picks, digit_depths, strict=True):
            side = min(size, round(DIGIT_SIZE_AT_1M / digit_depth))
            alpha = (
                np.asarray(
                    Image.fromarray(digits[pick]).resize((side, side), Image.BILINEAR), np.float32
                )
                / 255.0
            )
            top, left = rng.integers(0, size - side + 1, size=2)
            window = np.s_[top : top + side, left : left + side]
            image[window] = alpha * shade(digit_depth) + (1 - alpha) * image[window]
            drawn = alpha > 0.5
            masks[i][window][drawn] = labels[pick] + 1
            depth[window][drawn] = digit_depth
        probe_labels[i] = labels[picks[-1]]
        images[i, 0] = np.clip(image + rng.normal(0, 0.02, image.shape), 0, 1)
        depths[i] = depth
    return {"image": images, "mask": masks, "depth": depths, "label": probe_labels}


def shade(depth):
    """Brightness of a surface at ``depth`` metres: nearer is brighter."""
    return np.minimum(1.0, 0.9 / np.asarray(depth, np.float32))


class TensorItems(Dataset):
    """The items of one split of ``arrays`` (keyed ``<split>/<key>``) as dicts of tensors."""

    def __init__(self, arrays: dict[str, np.ndarray], split: str, keys: tuple[str, ...]) -> None:
        self.tensors = {key: torch.from_numpy(arrays[f"{split}/{key}"]) for key in keys}

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: tensor[index] for key, tensor in self.tensors.items()}


def digit_scene_splits(
    seed: int, sizes: dict[str, int], image_size: int, max_digits: int
) -> dict[str, TensorItems]:
    """The miniature's five splits, generated once per config and cached on disk. Digits of the
    evaluation and probe-test scenes come from a pool (a fifth of the 5,000) disjoint from the
    digits of the other splits."""
    config = {"seed": seed, "sizes": sizes, "image_size": image_size, "max_digits": max_digits}
    scenes = cached_generate("v-pretraining-digit-scenes", config, lambda: generate(**config))
    return {name: TensorItems(scenes, name, keys) for name, keys in SPLIT_KEYS.items()}


SPLIT_KEYS = {
    "unlabeled": ("image",),
    "feedback": ("image", "mask", "depth"),
    "probe_train": ("image", "label"),
    "evaluation": ("image", "mask", "depth"),
    "probe_test": ("image", "label"),
}


def generate(seed: int, sizes: dict[str, int], image_size: int, max_digits: int):
    """The arrays of every split, keyed ``<split>/<key>``."""
    digits, labels = load_mnist_5k()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits))
    pools = {"train": order[len(order) // 5 :], "held_out": order[: len(order) // 5]}
    arrays = {}
    for name, keys in SPLIT_KEYS.items():
        pool = pools["held_out" if name in ("evaluation", "probe_test") else "train"]
        scenes = make_digit_scenes(
            digits[pool], labels[pool], sizes[name], rng, image_size, max_digits
        )
        arrays.update({f"{name}/{key}": scenes[key] for key in keys})
    return arrays


# --------------------------------------------------------------------------- real formats


def read_image(path: Path, image_size: int, num_channels: int) -> torch.Tensor:
    """An image file as float [C, image_size, image_size] in [0, 1] (bilinear resize)."""
    with Image.open(path) as image:
        image = image.convert("L" if num_channels == 1 else "RGB")
        image = image.resize((image_size, image_size), Image.BILINEAR)
        pixels = np.asarray(image, np.float32) / 255.0
    pixels = pixels[None] if num_channels == 1 else pixels.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(pixels))


def resize_nearest(array: np.ndarray, image_size: int) -> torch.Tensor:
    """A label or depth map [H, W] resized to [image_size, image_size] without mixing values."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    resized = F.interpolate(tensor[None, None].double(), size=(image_size, image_size))[0, 0]
    return resized.to(tensor.dtype)


def list_images(folder: Path, dataset: str, root: Path) -> list[Path]:
    """The image files under ``folder`` (recursively, sorted); raise if there are none."""
    files = (
        sorted(p for p in folder.rglob("*") if p.suffix in IMAGE_SUFFIXES)
        if folder.is_dir()
        else []
    )
    if not files:
        relative = folder.relative_to(root) if folder != root else Path(".")
        missing = [f"image files under {relative}/"]
        raise DatasetNotFoundError(dataset, root, EXPECTED[dataset], HOW_TO_GET[dataset], missing)
    return files


class ImageFolderItems(Dataset):
    """Images under a folder: unlabeled (flat or nested) or, with ``labelled``, one subfolder
    per class (classes sorted by name, as torchvision's ImageFolder)."""

    def __init__(
        self, root: Path, image_size: int, num_channels: int, labelled: bool, dataset: str
    ) -> None:
        self.files = list_images(root, dataset, root)
        self.image_size, self.num_channels, self.labelled = image_size, num_channels, labelled
        if labelled:
            self.classes = sorted({p.relative_to(root).parts[0] for p in self.files})
            if any(len(p.relative_to(root).parts) < 2 for p in self.files):
                raise DatasetNotFoundError(dataset, root, EXPECTED[dataset], HOW_TO_GET[dataset])
            self.targets = [self.classes.index(p.relative_to(root).parts[0]) for p in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = {"image": read_image(self.files[index], self.image_size, self.num_channels)}
        if self.labelled:
            item["label"] = torch.tensor(self.targets[index])
        return item


class ADE20KItems(Dataset):
    """ADE20K scene parsing: class 0 ('other') becomes ``ignore_index``, classes 1..150 become
    0..149; no depth (all 0 = invalid)."""

    SPLITS = {"train": "training", "test": "validation"}

    def __init__(self, root: Path, split: str, image_size: int, ignore_index: int) -> None:
        folder = self.SPLITS[split]
        self.images = list_images(root / "images" / folder, "ade20k", root)
        self.masks = [root / "annotations" / folder / f"{p.stem}.png" for p in self.images]
        missing = [str(m) for m in self.masks if not m.is_file()]
        if missing:
            raise DatasetNotFoundError(
                "ade20k", root, EXPECTED["ade20k"], HOW_TO_GET["ade20k"], missing[:5]
            )
        self.image_size, self.ignore_index = image_size, ignore_index

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        with Image.open(self.masks[index]) as png:
            classes = np.asarray(png, np.int64)
        mask = np.where(classes == 0, self.ignore_index, classes - 1)
        mask = resize_nearest(mask, self.image_size)
        return {
            "image": read_image(self.images[index], self.image_size, 3),
            "mask": mask,
            "depth": torch.zeros(mask.shape),
        }


class NYUv2Items(Dataset):
    """NYU Depth v2: depth PNGs in uint16 millimetres become float metres (0 stays 0 =
    invalid); no segmentation (all ``ignore_index``)."""

    def __init__(self, root: Path, split: str, image_size: int, ignore_index: int) -> None:
        self.images = list_images(root / "images" / split, "nyuv2", root)
        self.depths = [root / "depth" / split / f"{p.stem}.png" for p in self.images]
        missing = [str(d) for d in self.depths if not d.is_file()]
        if missing:
            raise DatasetNotFoundError(
                "nyuv2", root, EXPECTED["nyuv2"], HOW_TO_GET["nyuv2"], missing[:5]
            )
        self.image_size, self.ignore_index = image_size, ignore_index

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        depth = read_depth_mm(self.depths[index])
        depth = resize_nearest(depth, self.image_size)
        return {
            "image": read_image(self.images[index], self.image_size, 3),
            "mask": torch.full(depth.shape, self.ignore_index, dtype=torch.int64),
            "depth": depth,
        }


def read_depth_mm(path: Path) -> np.ndarray:
    """A uint16 depth PNG in millimetres as float32 metres [H, W]; 0 (no measurement) stays 0."""
    with Image.open(path) as png:
        millimetres = np.asarray(png)
    if millimetres.dtype not in (np.uint16, np.int32):  # Pillow reads 16-bit PNGs as either
        raise ValueError(f"{path}: expected a 16-bit depth PNG, got {millimetres.dtype}")
    return millimetres.astype(np.float32) / 1000.0


def subset(dataset: Dataset, n: int, seed: int) -> Dataset:
    """A seeded subset of ``n`` items (all of them when the dataset holds fewer)."""
    if len(dataset) <= n:
        return dataset
    order = np.random.default_rng(seed).permutation(len(dataset))[:n]
    return Subset(dataset, np.sort(order).tolist())


def real_splits(
    roots: dict[str, str | None],
    sizes: dict[str, int],
    image_size: int,
    ignore_index: int,
    seed: int,
) -> dict[str, Dataset]:
    """Paper-scale splits: feedback = ADE20K training + NYUv2 train (seeded subsets of
    n_feedback / 2 each), evaluation = ADE20K validation + NYUv2 test (n_eval / 2 each)."""
    folders = {
        name: resolve_data_root(
            root, name, EXPECTED[name], f"{HOW_TO_GET[name]} Option: --data.{ROOT_OPTIONS[name]}."
        )
        for name, root in roots.items()
    }
    ade, nyu = folders["ade20k"], folders["nyuv2"]

    def dense(split: str, n: int) -> Dataset:
        parts = [
            subset(ADE20KItems(ade, split, image_size, ignore_index), n // 2, seed),
            subset(NYUv2Items(nyu, split, image_size, ignore_index), n - n // 2, seed),
        ]
        return ConcatDataset(parts)

    probe = folders["probe"]
    return {
        "unlabeled": ImageFolderItems(
            folders["image-folder"], image_size, 3, False, "image-folder"
        ),
        "feedback": dense("train", sizes["feedback"]),
        "evaluation": dense("test", sizes["evaluation"]),
        "probe_train": subset(
            ImageFolderItems(probe / "train", image_size, 3, True, "probe"),
            sizes["probe_train"],
            seed,
        ),
        "probe_test": subset(
            ImageFolderItems(probe / "val", image_size, 3, True, "probe"), sizes["probe_test"], seed
        ),
    }


# --------------------------------------------------------------------------- the DataModule


class DigitScenesDataModule(LightningDataModule):
    """Unlabeled batches for training; the feedback set for the designer's value (through
    ``feedback_batch``); two test loaders, the dense evaluation scenes then the probe test set.

    ``seed`` fixes the miniature and the subsets; by default the run's ``seed_everything``.
    ``num_channels`` and ``num_classes`` must match the source (1 and 11 for digit scenes:
    background + 10 digit classes; 3 and 150 for ADE20K).
    """

    def __init__(
        self,
        source: Literal["digit_scenes", "real"] = "digit_scenes",
        image_size: PositiveInt = 32,
        num_channels: PositiveInt = 1,
        num_classes: PositiveInt = 11,
        ignore_index: NonNegativeInt = 255,
        n_unlabeled: PositiveInt = 1024,
        n_feedback: PositiveInt = 256,
        n_evaluation: PositiveInt = 256,
        n_probe_train: PositiveInt = 512,
        n_probe_test: PositiveInt = 256,
        max_digits: PositiveInt = 3,
        batch_size: PositiveInt = 32,
        feedback_batch_size: PositiveInt = 64,
        eval_batch_size: PositiveInt = 128,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
        unlabeled_root: Path | None = None,
        ade20k_root: Path | None = None,
        nyuv2_root: Path | None = None,
        probe_root: Path | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "splits"):
            return
        h = self.hparams
        self.seed = run_seed() if h.seed is None else h.seed
        sizes = {
            "unlabeled": h.n_unlabeled,
            "feedback": h.n_feedback,
            "evaluation": h.n_evaluation,
            "probe_train": h.n_probe_train,
            "probe_test": h.n_probe_test,
        }
        if h.source == "digit_scenes":
            if (h.num_channels, h.num_classes) != (1, 11):
                raise ConfigError(
                    "digit scenes are grey with 11 classes (background + 10 digits): set "
                    f"--data.num_channels=1 --data.num_classes=11 (got {h.num_channels}, "
                    f"{h.num_classes})"
                )
            self.splits = digit_scene_splits(self.seed, sizes, h.image_size, h.max_digits)
        else:
            if h.num_channels != 3:
                raise ConfigError("real images are RGB: set --data.num_channels=3")
            roots = {name: h[option] for name, option in ROOT_OPTIONS.items()}
            self.splits = real_splits(roots, sizes, h.image_size, h.ignore_index, self.seed)

    def feedback_batch(self, index: int) -> dict[str, torch.Tensor]:
        """The ``index``-th feedback minibatch: a seeded draw, the same on every rank (so every
        rank computes the same downstream direction) and after a resume."""
        feedback = self.splits["feedback"]
        generator = torch.Generator().manual_seed(derived_seed(self.seed, index))
        size = min(self.hparams.feedback_batch_size, len(feedback))
        picks = torch.randperm(len(feedback), generator=generator)[:size]
        return default_collate([feedback[int(i)] for i in picks])

    def train_dataloader(self) -> DataLoader:
        # The shuffle is keyed on the items drawn (the optimizer steps taken), so a resumed run
        # reads the uninterrupted run's batches.
        unlabeled = self.splits["unlabeled"]
        n, batch = len(unlabeled), self.hparams.batch_size
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, batch))
        return self.loader(unlabeled, batch, sampler=order)

    def test_dataloader(self) -> list[DataLoader]:
        batch = self.hparams.eval_batch_size
        return [
            self.loader(self.splits["evaluation"], batch),
            self.loader(self.splits["probe_test"], batch),
        ]

    def loader(self, dataset: Dataset, batch_size: int, sampler=None) -> DataLoader:
        """A DataLoader in the DataModule's settings (sequential unless a sampler is given)."""
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, num_workers=self.hparams.num_workers
        )
