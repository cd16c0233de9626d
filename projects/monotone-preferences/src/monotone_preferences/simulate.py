"""The seeded simulator of evaluators (design note 4, [R]): criteria, a monotone preference
function of one family, and noisy overall evaluations. Personas are SIMULATIONS, not LLM or
human data: ``compensatory`` is the linear family, ``committee`` the conjunctive threshold one.

Criteria: ``x ~ U[0, 1]^d`` through a Gaussian copula with equicorrelation ``rho``.
Families (each non-decreasing in every coordinate):

- ``linear``:   f = sum_j w_j x_j, w proportional to (1, 0.75, 0.5, 0.25)[:d] (compensatory);
- ``threshold``: f = sigmoid(15 (min(x_1, x_2) - 0.6)) + 0.1 mean(x_3..x_d) (conjunctive bar,
  minor criteria beyond the first two);
- ``min``:       f = min_j x_j (Leontief: the weakest criterion binds);
- ``lexicographic``: f = floor(4 x_1) / 4 + 0.25 mean(x_2..x_d) (a grade on the first criterion,
  ties broken by the others);
- ``mild``:      f = min(x_1, x_2) + 0.5 mean(x_1..x_d) (a weakest-link term beside a compensatory
  one: the best linear fit leaves 5-17% of Var f, against 25-50% for ``min`` and 27-43% for
  ``threshold``, so a 20% margin over linear models is not granted by the family).

Outputs: ``y = f + sigma eps`` with ``sigma = noise * sd(f)`` (continuous scores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import norm

FAMILIES = ("linear", "threshold", "min", "lexicographic", "mild")
PERSONAS = {"compensatory": "linear", "committee": "threshold"}


def linear_weights(d: int) -> np.ndarray:
    base = np.array([1.0, 0.75, 0.5, 0.25, 0.2, 0.15, 0.1, 0.05])
    w = base[:d] if d <= len(base) else np.linspace(1.0, 0.05, d)
    return w / w.sum()


def family_features(family: str, x: np.ndarray) -> np.ndarray:
    """The features in which ``family`` is linear with non-negative weights: [n, p].

    The positive control fits NNLS on these (the correctly specified monotone model)."""
    d = x.shape[1]
    if family == "linear":
        return x
    if family == "threshold":
        bar = expit(15.0 * (np.minimum(x[:, 0], x[:, 1 % d]) - 0.6))[:, None]
        return np.hstack([bar, x[:, 2:]]) if d > 2 else bar
    if family == "min":
        return x.min(1, keepdims=True)
    if family == "lexicographic":
        grade = np.floor(4.0 * x[:, :1]) / 4.0
        return np.hstack([grade, x[:, 1:]])
    if family == "mild":
        return np.hstack([np.minimum(x[:, :1], x[:, 1 % d : 1 % d + 1]), x])
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


def preference(family: str, x: np.ndarray) -> np.ndarray:
    """f(x) for the family (see the module doc)."""
    d = x.shape[1]
    features = family_features(family, x)
    if family == "linear":
        return features @ linear_weights(d)
    if family == "threshold":
        return features[:, 0] + (0.1 * features[:, 1:].mean(1) if d > 2 else 0.0)
    if family == "min":
        return features[:, 0]
    if family == "mild":
        return features[:, 0] + 0.5 * features[:, 1:].mean(1)
    return features[:, 0] + (0.25 * features[:, 1:].mean(1) if d > 1 else 0.0)


def draw_criteria(n: int, d: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """x ~ U[0,1]^d via a Gaussian copula with equicorrelation rho: [n, d]."""
    if not -1.0 / max(d - 1, 1) < rho < 1.0:
        raise ValueError(f"rho={rho} does not give a valid {d}x{d} equicorrelation matrix")
    cov = np.full((d, d), rho) + (1.0 - rho) * np.eye(d)
    z = rng.standard_normal((n, d)) @ np.linalg.cholesky(cov).T
    return norm.cdf(z)


@dataclass(frozen=True)
class Simulation:
    x: np.ndarray  # [n, d] criteria
    f: np.ndarray  # [n] noiseless preference
    y: np.ndarray  # [n] observed evaluation
    sigma: float


def simulate(
    family: str, n: int, d: int, rho: float, noise: float, seed: int, sd_f: float | None = None
) -> Simulation:
    """One seeded draw; ``sd_f`` (default: the draw's own sd of f) sets sigma = noise * sd_f."""
    rng = np.random.default_rng(seed)
    x = draw_criteria(n, d, rho, rng)
    f = preference(family, x)
    sigma = noise * (float(f.std()) if sd_f is None else sd_f)
    return Simulation(x, f, f + sigma * rng.standard_normal(n), sigma)


def reference_sd(family: str, d: int, rho: float, seed: int = 12345, n: int = 20000) -> float:
    """sd of f over a large fixed draw: one noise scale and Var f per grid cell."""
    return float(preference(family, draw_criteria(n, d, rho, np.random.default_rng(seed))).std())
