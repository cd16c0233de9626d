"""Seeded, deterministic splits and shuffles."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler


def seeded_split(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Disjoint index arrays of sizes ``floor(f * n)`` for each fraction, from one seeded shuffle.

    The same ``(n, fractions, seed)`` always gives the same split; fractions may sum to less
    than one (the rest is unused) but not more.
    """
    if n < 0 or any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"fractions must be non-negative and sum to at most 1, got {fractions}")
    order = np.random.default_rng(seed).permutation(n)
    sizes = [int(np.floor(f * n + 1e-9)) for f in fractions]
    bounds = np.cumsum([0, *sizes])
    return [np.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class EpochShuffle(DistributedSampler):
    """An endless stream of shuffles of ``range(n)`` (shuffle ``e`` fixed by ``(seed, e)``): an
    epoch reads the rest of the shuffle that holds the stream position ``consumed()`` gives (all
    of it when the position starts a shuffle, as it does except right after a resume).

    ``shuffle=True`` draws the order from the global generator, and an order keyed on the epoch
    number is not enough either: a run resumed from a checkpoint saved at an epoch's end restarts
    Lightning's epoch bookkeeping in states where the epoch number, or the number of batches left
    in the restored epoch, differs from the uninterrupted run's. The optimizer step count is
    restored exactly, so key the position on it (``drawn_by_trainer``); a resumed run then reads
    the uninterrupted run's batches.

    Under DDP each of the ``world`` ranks reads every ``world``-th position of the shuffle, padded
    like ``DistributedSampler`` (with its own first items) to a multiple of ``world`` so that all
    ranks take the same number of batches. It is a ``DistributedSampler`` so that Lightning uses
    it as is: Lightning's wrapper for other samplers assumes an epoch yields ``len()`` items,
    which is false for an epoch resumed mid-shuffle. ``replicas`` gives ``(rank, world)``; by
    default they come from ``torch.distributed`` when it is initialised, else ``(0, 1)``.
    """

    def __init__(
        self,
        n: int,
        seed: int,
        consumed: Callable[[], int],
        replicas: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        # DistributedSampler.__init__ is not called: it needs a dataset and fixes the ranks at
        # construction, while these are read when an epoch starts.
        self.n, self.seed, self.consumed = n, seed, consumed
        self.replicas = replicas or _process_group_replicas

    def _shuffle(self, epoch: int) -> list[int]:
        words = np.random.SeedSequence([self.seed, epoch]).generate_state(2)
        generator = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))
        return torch.randperm(self.n, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        rank, world = self.replicas()
        epoch, offset = divmod(self.consumed(), self.n)
        total = math.ceil(self.n / world) * world
        padded = (self._shuffle(epoch) * math.ceil(total / self.n))[:total]
        yield from padded[offset + rank :: world]

    def __len__(self) -> int:
        return math.ceil(self.n / self.replicas()[1])

    def set_epoch(self, epoch: int) -> None:
        """Ignored: the position in the stream comes from ``consumed``."""


def _process_group_replicas() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def drawn_by_trainer(
    datamodule: Any, n: int, batch_size: int, drop_last: bool = False
) -> Callable[[], int]:
    """``consumed`` for an ``EpochShuffle`` of ``n`` items built in a DataModule: the stream
    position the trainer's optimizer steps have reached (0 while no trainer is attached).

    Epoch ``e`` starts at position ``e * n``; within it each optimizer step has drawn
    ``batch_size x devices x gradient accumulation`` items (a short last batch, kept unless
    ``drop_last``, still counts as a step, which is why the position is not steps x batch)."""

    def consumed() -> int:
        trainer = getattr(datamodule, "trainer", None)
        if trainer is None:
            return 0
        accumulate, ranks = trainer.accumulate_grad_batches, trainer.world_size
        per_rank = math.ceil(n / ranks)
        batches = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
        steps_per_epoch = max(1, math.ceil(batches / accumulate))
        epoch, step = divmod(trainer.global_step, steps_per_epoch)
        return epoch * n + min(step * batch_size * accumulate * ranks, n)

    return consumed
