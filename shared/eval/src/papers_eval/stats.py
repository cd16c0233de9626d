"""Confidence intervals over seeds and test items, bootstrap intervals and Pareto fronts.

A claim experiment measures each method on several seeds, and on each seed either one number
(a final return, a fitted parameter's error) or one number per test item (per-sample losses,
per-episode returns). ``contrast_interval`` gives the interval of a linear combination of such
measurements (one method's mean, or a difference between methods):

- one value per seed: a Student-t interval over the seeds. A percentile bootstrap of three values
  covers the truth about 75% of the time at a nominal 95%; the t interval covers it at the nominal
  rate for normal seed-to-seed variation. When the seeds do not vary at all there is no interval
  (``NO_SEED_VARIATION``): a metric the seed cannot move is not evidence that it would hold on
  another seed, so a check on it fails (claim protocol v3).
- values per item: the wider of two intervals (protocol v3). (a) A stratified item bootstrap:
  the seeds stay fixed and the items are resampled within each seed; when methods share a seed's
  test items (same count, same order), a paired comparison resamples the same item indices for
  every method, so what the items have in common cancels. (b) A Student-t interval on the
  per-seed means (paired: on the per-seed contrasts). (b) is exact for normal per-seed means and
  carries the seed-to-seed variation; (a) guards against a few extreme items the three seed
  means hide. The earlier two-stage bootstrap (seeds resampled, then items) was miscalibrated
  both ways: it counted item noise twice when items dominate (coverage 0.99 at a nominal 0.95)
  and treated three seeds as the population when seeds dominate (0.82). The coverage harness in
  ``tests/test_coverage.py`` measures the combination in both regimes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Per seed, one value or a sequence of per-item values.
PerSeed = Sequence[float | Sequence[float] | np.ndarray]

ONE_SEED = "one seed: no interval"
NO_SEED_VARIATION = "no seed variation: no interval"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval and how it was computed."""

    estimate: float
    low: float
    high: float
    method: str  # "t over seeds", "item bootstrap", "t over seed means", or no interval
    paired: bool
    n_seeds: int
    n_items: int  # fewest items on any seed (1 when each seed gives one value)

    def as_dict(self) -> dict:
        return {
            "estimate": self.estimate,
            "ci": [self.low, self.high],
            "interval": self.method,
            "paired": self.paired,
            "n_seeds": self.n_seeds,
            "n_items": self.n_items,
        }


def per_seed_arrays(values: PerSeed) -> list[np.ndarray]:
    """Each seed's values as a 1-D float array (a scalar becomes one item)."""
    arrays = [np.atleast_1d(np.asarray(v, dtype=float)).ravel() for v in values]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("every seed needs at least one value")
    return arrays


def per_seed_means(values: PerSeed) -> list[float]:
    """Each seed's mean over its items."""
    return [float(a.mean()) for a in per_seed_arrays(values)]


def contrast_interval(
    terms: Sequence[tuple[float, PerSeed]],
    *,
    paired: bool = True,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Interval of ``sum_k c_k * mean(term_k)``, where a term's mean is its mean over seeds of
    per-seed item means. ``terms`` are ``(c_k, per-seed values)``; all terms have the same seeds.

    ``paired``: terms measured on the same seeds (and, with items, the same items per seed) are
    resampled together. An unpaired contrast resamples each term on its own.
    """
    coefficients = np.array([c for c, _ in terms], dtype=float)
    groups = [per_seed_arrays(values) for _, values in terms]
    n_seeds = len(groups[0])
    if any(len(g) != n_seeds for g in groups):
        raise ValueError(f"terms have different numbers of seeds: {[len(g) for g in groups]}")
    means = np.array([[a.mean() for a in g] for g in groups])  # [K, S]
    estimate = float(coefficients @ means.mean(axis=1))
    n_items = min(a.size for g in groups for a in g)
    if paired and any(
        len({g[s].size for g in groups}) > 1 for s in range(n_seeds)
    ):  # items differ in number: they cannot be the same items
        raise ValueError("a paired comparison needs the same items per seed for every term")
    one_value = all(a.size == 1 for g in groups for a in g)
    if n_seeds < 2:
        if one_value:
            return Interval(estimate, np.nan, np.nan, ONE_SEED, paired, n_seeds, 1)
    else:
        t_low, t_high = _t_interval(coefficients, means, paired, confidence)
        if one_value:
            if t_low == t_high:  # every seed gave the same contrast: nothing to generalise from
                return Interval(estimate, np.nan, np.nan, NO_SEED_VARIATION, paired, n_seeds, 1)
            return Interval(estimate, t_low, t_high, "t over seeds", paired, n_seeds, 1)
    rng = np.random.default_rng(seed)
    if paired:
        stacked = [np.stack([g[s] for g in groups], axis=1) for s in range(n_seeds)]  # [n_s, K]
        draws = _item_bootstrap_means(stacked, rng, n_resamples) @ coefficients
    else:
        draws = sum(
            c * _item_bootstrap_means([a[:, None] for a in g], rng, n_resamples)[:, 0]
            for c, g in zip(coefficients, groups, strict=True)
        )
    alpha = (1 - confidence) / 2
    low, high = (float(q) for q in np.quantile(draws, [alpha, 1 - alpha]))
    method = "item bootstrap"
    if n_seeds >= 2 and (t_high - t_low) > (high - low):
        low, high, method = t_low, t_high, "t over seed means"
    return Interval(estimate, low, high, method, paired, n_seeds, n_items)


def _t_interval(
    coefficients: np.ndarray, means: np.ndarray, paired: bool, confidence: float
) -> tuple[float, float]:
    """Student-t interval of ``coefficients @ means.mean(1)`` from per-seed values ``[K, S]``:
    on per-seed contrasts when paired, Welch-Satterthwaite degrees of freedom otherwise."""
    n_seeds = means.shape[1]
    if paired:
        contrast = coefficients @ means
        centre, se, dof = contrast.mean(), contrast.std(ddof=1) / np.sqrt(n_seeds), n_seeds - 1
    else:
        parts = coefficients**2 * means.var(axis=1, ddof=1) / n_seeds
        centre, se = float(coefficients @ means.mean(axis=1)), np.sqrt(parts.sum())
        dof = parts.sum() ** 2 / max(np.sum(parts**2 / (n_seeds - 1)), 1e-300)
    if se == 0:
        return float(centre), float(centre)
    half = stats.t.ppf(0.5 + confidence / 2, dof) * se
    return float(centre - half), float(centre + half)


def _item_bootstrap_means(
    per_seed: Sequence[np.ndarray], rng: np.random.Generator, n_resamples: int
) -> np.ndarray:
    """Bootstrap draws ``[B, K]`` of the mean over seeds of per-seed item means, the seeds held
    fixed and the items (rows) resampled within each seed; the K columns share item indices."""
    item_means = np.stack(
        [a[rng.integers(0, len(a), size=(n_resamples, len(a)))].mean(axis=1) for a in per_seed]
    )  # [S, B, K]
    return item_means.mean(axis=0)


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
