"""Bootstrap confidence intervals and Pareto fronts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[[np.ndarray], float] = np.mean,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``statistic`` over ``values`` (seeded, reproducible).

    Percentile rather than BCa: BCa is undefined when every resample gives the same value,
    which happens for accuracies of 0 or 1 in small miniature test sets.
    """
    values = np.asarray(values, dtype=float).ravel()
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if values.size == 1 or np.all(values == values[0]):
        point = float(statistic(values))
        return point, point
    result = stats.bootstrap(
        (values,),
        lambda x, axis: np.apply_along_axis(statistic, axis, x),
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def pareto_front(costs: Sequence[float], scores: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats (lower or equal cost and higher or equal
    score, strictly better in one), ordered by increasing cost."""
    costs, scores = np.asarray(costs, dtype=float), np.asarray(scores, dtype=float)
    if costs.shape != scores.shape:
        raise ValueError(f"costs {costs.shape} and scores {scores.shape} differ in shape")
    front = []
    for i in range(costs.size):
        dominated = np.any(
            (costs <= costs[i])
            & (scores >= scores[i])
            & ((costs < costs[i]) | (scores > scores[i]))
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (costs[i], -scores[i]))
