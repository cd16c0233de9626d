"""Seeded, deterministic splits and shuffles."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler


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


class EpochShuffle(Sampler[int]):
    """A shuffle of ``range(n)`` that depends only on (seed, epoch), read when the epoch's first
    batch is drawn.

    A DataLoader's ``shuffle=True`` draws its order from the global generator when its iterator
    starts, and Lightning starts the first epoch's iterator of a run earlier than the others, so
    a run resumed from a checkpoint would see another order than the uninterrupted run. Pass
    ``epoch=lambda: trainer.current_epoch`` (e.g. from a DataModule's ``self.trainer``).
    """

    def __init__(self, n: int, seed: int, epoch: Callable[[], int]) -> None:
        self.n, self.seed, self.epoch = n, seed, epoch

    def __iter__(self) -> Iterator[int]:
        words = np.random.SeedSequence([self.seed, self.epoch()]).generate_state(2)
        generator = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))
        yield from torch.randperm(self.n, generator=generator).tolist()

    def __len__(self) -> int:
        return self.n
