"""Data: the real-format loader and the embedded miniature behind one DataModule.

Real format (TEMPLATE): ``<root>/data.npz`` with ``x`` float [N, F] and ``y`` float [N].
Miniature: y = w.x + noise with a seeded w, generated once and cached.
"""

from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from papers_data import cached_generate, require_files, resolve_data_root, seeded_split

HOW_TO_GET = "TEMPLATE: say where the real dataset is published and how to convert it."


class DataFormatError(ValueError):
    """The data do not have the shape or values this project needs."""

    user_facing = True


def check_arrays(x: np.ndarray, y: np.ndarray, in_features: int) -> None:
    """Raise a DataFormatError naming what is wrong with (x, y)."""
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise DataFormatError(f"expected x [N, F] and y [N], got {x.shape} and {y.shape}")
    if x.shape[1] != in_features:
        raise DataFormatError(
            f"the data have {x.shape[1]} features but data.in_features={in_features}; "
            f"set --data.in_features={x.shape[1]}"
        )
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise DataFormatError("the data contain NaN or infinite values; clean them first")


def load_real(root: str, in_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Read ``data.npz`` from the data root (raises DatasetNotFoundError when missing)."""
    folder = resolve_data_root(root, "graphmet", ["data.npz"], HOW_TO_GET)
    path = require_files(folder, "graphmet", ["data.npz"], HOW_TO_GET)["data.npz"]
    with np.load(path) as stored:
        x, y = stored["x"].astype(np.float32), stored["y"].astype(np.float32)
    check_arrays(x, y, in_features)
    return x, y


def generate_miniature(n: int, in_features: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """A seeded linear problem y = w.x + noise."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=in_features)
    x = rng.normal(size=(n, in_features)).astype(np.float32)
    y = (x @ w + noise * rng.normal(size=n)).astype(np.float32)
    return {"x": x, "y": y}


class GraphmetDataModule(LightningDataModule):
    def __init__(
        self,
        root: str | None = None,
        n_train: int = 512,
        n_val: int = 128,
        in_features: int = 8,
        noise: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if h.root is not None:
            x, y = load_real(h.root, h.in_features)
        else:
            config = {
                "n": h.n_train + h.n_val,
                "in_features": h.in_features,
                "noise": h.noise,
                "seed": h.seed,
            }
            arrays = cached_generate("graphmet", config, lambda: generate_miniature(**config))
            x, y = arrays["x"], arrays["y"]
        train_idx, val_idx = seeded_split(len(y), (1 - h.n_val / len(y), h.n_val / len(y)), h.seed)
        self.train_set = TensorDataset(
            torch.from_numpy(x[train_idx]), torch.from_numpy(y[train_idx])
        )
        self.val_set = TensorDataset(torch.from_numpy(x[val_idx]), torch.from_numpy(y[val_idx]))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )
