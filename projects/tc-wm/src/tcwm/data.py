"""Data: the real-format loader and the embedded miniature behind one DataModule.

Real format (TEMPLATE): ``<root>/data.npz`` with ``x`` float [N, F] and ``y`` float [N].
Miniature: y = w.x + noise with a seeded w, generated once and cached.
"""

from __future__ import annotations

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from papers_cli import ConfigError
from papers_data import (
    EpochShuffle,
    cached_generate,
    drawn_by_trainer,
    require_files,
    resolve_data_root,
    seeded_split,
)
from papers_gpu import run_seed
from tcwm.formats import DataFormatError

HOW_TO_GET = "TEMPLATE: say where the real dataset is published and how to convert it."


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
    folder = resolve_data_root(root, "tc-wm", ["data.npz"], HOW_TO_GET)
    path = require_files(folder, "tc-wm", ["data.npz"], HOW_TO_GET)["data.npz"]
    with np.load(path) as stored:
        x, y = stored["x"].astype(np.float32), stored["y"].astype(np.float32)
    check_arrays(x, y, in_features)
    return x, y


def generate_miniature(n: int, in_features: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """A seeded linear problem y = w.x + noise; ``w`` is kept (the claim's oracle uses it)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=in_features).astype(np.float32)
    x = rng.normal(size=(n, in_features)).astype(np.float32)
    y = (x @ w + noise * rng.normal(size=n)).astype(np.float32)
    return {"x": x, "y": y, "w": w}


class TcwmDataModule(LightningDataModule):
    """Train / validation / test splits of the real data (``root``) or of the miniature.

    ``seed`` fixes the miniature and the split; by default it is the run's ``seed_everything``,
    so one seed changes data, initialisation and noise together.
    """

    def __init__(
        self,
        root: str | None = None,
        n_train: PositiveInt = 512,
        n_val: PositiveInt = 128,
        n_test: PositiveInt = 256,
        in_features: PositiveInt = 8,
        noise: NonNegativeFloat = 0.1,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.true_weights: np.ndarray | None = None

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        seed = self.seed = run_seed() if h.seed is None else h.seed
        n = h.n_train + h.n_val + h.n_test
        if h.root is not None:
            x, y = load_real(h.root, h.in_features)
        else:
            config = {"n": n, "in_features": h.in_features, "noise": h.noise, "seed": seed}
            arrays = cached_generate("tc-wm", config, lambda: generate_miniature(**config))
            x, y, self.true_weights = arrays["x"], arrays["y"], arrays["w"]
        if len(y) < n:
            raise ConfigError(
                f"the data hold {len(y)} rows, fewer than n_train + n_val + n_test = {n}"
            )
        sizes = [h.n_train, h.n_val, h.n_test]
        parts = seeded_split(len(y), [size / len(y) for size in sizes], seed)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx])) for idx in parts
        )

    def train_dataloader(self) -> DataLoader:
        # A shuffle per epoch keyed on the items drawn (the optimizer steps taken), so a resumed
        # run reads the uninterrupted run's batches; EpochShuffle's third argument is that
        # position, not the epoch number.
        n = len(self.train_set)
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, self.hparams.batch_size))
        return self._loader(self.train_set, sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def _loader(self, dataset: TensorDataset, sampler: EpochShuffle | None = None) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
        )
