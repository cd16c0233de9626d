"""Data: expert-labelled states (imitation) and character windows behind one DataModule.

Control tasks: states from rollouts of the oracle / scripted expert with epsilon-random actions,
labelled with the expert action, the true difficulty and (grids) the exact Q*(s, .). Language
tasks: (context window, next character) pairs; the synthetic stream carries per-character depth
labels. Paper-scale language data: ``--data.text_path`` (a .txt file or a folder of them).
"""

from __future__ import annotations

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from aic.tasks import (
    TaskName,
    collect_states,
    encode_text,
    get_task,
    longest_program,
    read_text_corpus,
    stdlib_corpus,
    synthetic_programs,
    text_windows,
)
from papers_cli import ConfigError
from papers_data import EpochShuffle, cached_generate, drawn_by_trainer

FIELDS = ("obs", "target", "difficulty", "q")
DATA_FORMAT = 2  # bump when the generators change, so cached arrays are regenerated


def generate(
    task_name: str,
    n: int,
    seed: int,
    context: int,
    text_path: str | None = None,
    env_id: str | None = None,
):
    """n labelled samples of a task (seeded, deterministic)."""
    task = get_task(task_name, env_id)
    if task.domain != "language":
        return collect_states(task, n, seed)
    if task.name == "program-lm":
        text, labels = synthetic_programs(max(20 * n, 20_000), seed)
        return text_windows(encode_text(text), context, n, seed, labels)
    text = read_text_corpus(text_path) if text_path is not None else stdlib_corpus()
    tokens = encode_text(text)
    # the last 10 % of the corpus is held out; seeds >= 1000 (validation) read only from it
    split = int(0.9 * len(tokens))
    part = tokens[split:] if seed >= 1000 else tokens[:split]
    return text_windows(part, context, n, seed)


def as_tensors(arrays: dict) -> list[torch.Tensor]:
    out = [torch.from_numpy(np.ascontiguousarray(arrays[f])) for f in FIELDS if f in arrays]
    if "q" not in arrays:  # keep a fixed tuple layout: an empty Q* column
        out.append(torch.zeros(len(out[0]), 0))
    return out


class AicDataModule(LightningDataModule):
    def __init__(
        self,
        task: TaskName = "lava-crossing",
        env_id: str | None = None,
        n_train: PositiveInt = 6000,
        n_val: PositiveInt = 1000,
        context: PositiveInt = 32,
        text_path: str | None = None,
        batch_size: PositiveInt = 128,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.task = get_task(task, env_id)
        if task == "program-lm" and context < longest_program():
            raise ConfigError(
                f"data.context={context} is shorter than the longest synthetic program "
                f"({longest_program()} characters up to its answer): deep answers would be "
                f"unanswerable from the window and their depth labels meaningless; use "
                f"--data.context >= {longest_program()} (e.g. 32)"
            )

    def _split(self, n: int, seed: int) -> dict:
        h = self.hparams
        config = {
            "task": h.task,
            "n": n,
            "seed": seed,
            "context": h.context,
            "env": h.env_id,
            "format": DATA_FORMAT,
        }
        if h.text_path is not None:  # paper scale: read the real corpus, do not cache
            return generate(h.task, n, seed, h.context, h.text_path)
        return cached_generate(
            "aic", config, lambda: generate(h.task, n, seed, h.context, env_id=h.env_id)
        )

    def prepare_data(self) -> None:
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        h = self.hparams
        self.train_arrays = self._split(h.n_train, h.seed)
        self.val_arrays = self._split(h.n_val, h.seed + 1000)
        self.test_arrays = self._split(h.n_val, h.seed + 2000)
        self.train_set = TensorDataset(*as_tensors(self.train_arrays))
        self.val_set = TensorDataset(*as_tensors(self.val_arrays))
        self.test_set = TensorDataset(*as_tensors(self.test_arrays))

    def train_dataloader(self) -> DataLoader:
        # the order is keyed on the optimizer steps taken, so a resumed run reads the same batches
        n, batch = len(self.train_set), self.hparams.batch_size
        drop_last = n >= batch
        return DataLoader(
            self.train_set,
            batch_size=batch,
            sampler=EpochShuffle(n, self.hparams.seed, drawn_by_trainer(self, n, batch, drop_last)),
            num_workers=self.hparams.num_workers,
            drop_last=drop_last,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=512, num_workers=self.hparams.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=512, num_workers=self.hparams.num_workers)
