"""Data: the miniature's expert demonstrations (environment A) behind one DataModule, and the
Minari-format reader for real offline datasets (see ``minari_format.py``).

A training batch is the whole problem, as the algorithm is full-batch: the labelled train states
and expert actions, the unlabelled test states and the length of each test trajectory.
"""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import ClosedUnitInterval, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_gpu import run_seed
from seqrejectron.envs import Layout, expert_policy
from seqrejectron.experiment import SIZES, episode_seeds
from seqrejectron.search import stack


class Repeat(Dataset):
    """The same full batch, ``length`` times (one epoch = ``length`` optimizer steps)."""

    def __init__(self, batch: dict, length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return self.batch


class Episodes(Dataset):
    def __init__(self, seeds) -> None:
        self.seeds = list(seeds)

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([self.seeds[index]])


def first(items: list):
    return items[0]


class SeqRejectronDataModule(LightningDataModule):
    """Environment (A): expert demonstrations in the train dynamics (labelled) and in the test
    dynamics (states only), on one lava-crossing layout fixed by the run's seed."""

    def __init__(
        self,
        horizon: Literal[40, 80, 160] = 80,
        shift: Literal["wind", "ice"] = "wind",
        strength: ClosedUnitInterval = 0.3,
        n_train: PositiveInt = 200,
        n_test: PositiveInt = 200,
        n_eval: PositiveInt = 100,
        steps_per_epoch: PositiveInt = 50,
        in_features: PositiveInt = 62,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        size, _ = SIZES[horizon]
        if in_features != 2 * size + 40:
            raise ConfigError(
                f"data.in_features={in_features} but horizon {horizon} (grid {size}) gives "
                f"{2 * size + 40} features; set --data.in_features={2 * size + 40}"
            )

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        self.seed = run_seed() if h.seed is None else h.seed
        size, crossings = SIZES[h.horizon]
        self.train_env = Layout(size, crossings, h.horizon, layout_seed=self.seed * 1000 + size)
        self.test_env = self.train_env.with_shift(h.shift, h.strength)
        self.train = [
            self.train_env.rollout(expert_policy, s) for s in episode_seeds(self.seed, 0, h.n_train)
        ]
        self.test = [
            self.test_env.rollout(expert_policy, s) for s in episode_seeds(self.seed, 1, h.n_test)
        ]
        check_same_space(self.train, self.test)
        self.batch = {
            "train_x": stack(self.train),
            "train_a": stack(self.train, "expert"),
            "test_x": stack(self.test),
            "test_lengths": torch.tensor([len(t) for t in self.test]),
        }

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Repeat(self.batch, self.hparams.steps_per_epoch), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Repeat(self.batch, 1), batch_size=None)

    def test_dataloader(self) -> DataLoader:
        """Episode seeds; the module rolls pi-hat out in both dynamics for each."""
        seeds = episode_seeds(self.seed, 6, self.hparams.n_eval)
        return DataLoader(Episodes(seeds), batch_size=None)


def check_same_space(train, test) -> None:
    if not test:
        raise ConfigError("the unlabelled test set is empty: SeqRejectron needs test trajectories")
    if not train:
        raise ConfigError("the labelled train set is empty")
    dims = {t.feats.shape[1] for t in train}, {t.feats.shape[1] for t in test}
    if dims[0] != dims[1]:
        raise ConfigError(
            f"test trajectories live in another observation space (dimension {sorted(dims[1])}) "
            f"than the train demonstrations ({sorted(dims[0])})"
        )
