"""Seeded, deterministic splits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
