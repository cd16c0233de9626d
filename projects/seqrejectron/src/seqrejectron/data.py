"""Data: behind one DataModule, the miniature's expert demonstrations (environment A,
``source: minigrid``) or real offline data (``source: minari``: two Minari datasets and the
environment they come from, see ``offline.py``).

A training batch is the whole problem, as the algorithm is full-batch: the labelled train states
and expert actions, the unlabelled test states and the length of each test trajectory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import ClosedUnitInterval, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_gpu import run_seed
from seqrejectron.envs import N_ACTIONS, N_FEATURES, Layout, expert_policy
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
    """Expert demonstrations in the train dynamics (labelled) and in the test dynamics (states
    only). ``minigrid``: environment (A), one lava-crossing layout fixed by the run's seed.
    ``minari``: the first ``n_train`` episodes of ``train_dataset_id`` and ``n_test`` of
    ``test_dataset_id`` under ``data_root``, deployed in ``env_id`` (test dynamics: ``shift_spec``;
    ``train_spec`` applies to both; rollouts of ``eval_horizon`` steps, sparse ``cost``)."""

    def __init__(
        self,
        source: Literal["minigrid", "minari"] = "minigrid",
        horizon: Literal[40, 80, 160] = 80,
        shift: Literal["wind", "ice"] = "wind",
        strength: ClosedUnitInterval = 0.3,
        n_train: PositiveInt = 200,
        n_test: PositiveInt = 200,
        n_eval: PositiveInt = 100,
        steps_per_epoch: PositiveInt = 50,
        in_features: PositiveInt = N_FEATURES,
        n_actions: PositiveInt = N_ACTIONS,
        data_root: Path | None = None,
        train_dataset_id: str | None = None,
        test_dataset_id: str | None = None,
        env_id: str | None = None,
        shift_spec: Path | None = None,
        train_spec: Path | None = None,
        eval_horizon: PositiveInt = 300,
        cost: Literal["goal", "fall"] = "goal",
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.offline = None
        if source == "minari":
            self.offline = self.load_offline()
            offline = self.offline
            expected = {"in_features": offline.in_features, "n_actions": offline.n_actions}
            where = f"the data ({train_dataset_id} in {env_id})"
        else:
            size, _ = SIZES[horizon]
            expected = {"in_features": N_FEATURES, "n_actions": N_ACTIONS}
            where = f"horizon {horizon} (grid {size})"
        for name, value in expected.items():
            if self.hparams[name] != value:
                raise ConfigError(
                    f"data.{name}={self.hparams[name]} but {where} gives {value}; "
                    f"set --data.{name}={value}"
                )

    def load_offline(self):
        from seqrejectron.offline import load_offline_problem

        h = self.hparams
        needed = ("data_root", "train_dataset_id", "test_dataset_id", "env_id", "shift_spec")
        missing = [name for name in needed if h[name] is None]
        if missing:
            raise ConfigError(
                "data.source=minari needs " + ", ".join(f"data.{name}" for name in missing)
            )
        return load_offline_problem(
            Path(h.data_root),
            h.train_dataset_id,
            h.test_dataset_id,
            h.env_id,
            h.shift_spec,
            h.train_spec,
            h.n_train,
            h.n_test,
            h.eval_horizon,
            h.cost,
        )

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        self.seed = run_seed() if h.seed is None else h.seed
        if self.offline is not None:
            self.train_env, self.test_env = self.offline.train_env, self.offline.test_env
            self.train, self.test = self.offline.train, self.offline.test
        else:
            size, crossings = SIZES[h.horizon]
            self.train_env = Layout(size, crossings, h.horizon, layout_seed=self.seed * 1000 + size)
            self.test_env = self.train_env.with_shift(h.shift, h.strength)
            self.train = [
                self.train_env.rollout(expert_policy, s)
                for s in episode_seeds(self.seed, 0, h.n_train)
            ]
            self.test = [
                self.test_env.rollout(expert_policy, s)
                for s in episode_seeds(self.seed, 1, h.n_test)
            ]
        check_same_space(self.train, self.test)
        self.batch = {
            "train_x": stack(self.train),
            "train_a": stack(self.train, "expert"),
            "test_x": stack(self.test),
            "test_lengths": torch.tensor([len(t) for t in self.test]),
            "train_lengths": torch.tensor([len(t) for t in self.train]),
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
