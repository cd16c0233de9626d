"""Identifiability and world-model quality in numbers: affine R^2, MCC, linear probes.

The identifiability statement (abstract: "identify the task-centric latent factors up to a simple
transformation"; design note [R]: an affine map) is scored three ways on held-out frames:

- ``affine_r2``: R^2 of the best affine map from the aligned summary u to the true state (fit on
  training frames, scored on others): 1 when u = A s + b with A invertible;
- ``mcc``: the mean absolute Pearson correlation between u's channels and the state's factors
  after the best one-to-one matching (Hungarian, scipy): the strong, axis-aligned form that an
  affine result does not promise (reported beside it);
- ``mean_canonical_correlation``: the mean canonical correlation of u and s, invariant to any
  invertible affine map of either (the "weak" MCC that matches an affine identifiability result).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score


def affine_r2(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, ridge=1e-6
) -> float:
    """R^2 (variance-weighted over the target's columns) of a ridge-regularised affine map
    x -> y fit on the training rows and scored on the test rows."""
    model = Ridge(alpha=ridge).fit(_rows(train_x), _rows(train_y))
    return float(
        r2_score(_rows(test_y), model.predict(_rows(test_x)), multioutput="variance_weighted")
    )


def mcc(x: np.ndarray, y: np.ndarray) -> float:
    """Mean |Pearson correlation| of the matched pairs (x_i, y_j), one-to-one (Hungarian)."""
    x, y = _rows(x), _rows(y)
    corr = np.corrcoef(x.T, y.T)[: x.shape[1], x.shape[1] :]
    corr = np.nan_to_num(np.abs(corr))
    rows, cols = linear_sum_assignment(-corr)
    return float(corr[rows, cols].sum() / y.shape[1])


def mean_canonical_correlation(x: np.ndarray, y: np.ndarray, eps: float = 1e-8) -> float:
    """The mean of the min(dim x, dim y) canonical correlations of x and y (the singular values
    of Qx^T Qy, Q orthonormal bases of the centred columns)."""
    x, y = _rows(x), _rows(y)
    qx = _orthonormal_basis(x - x.mean(0), eps)
    qy = _orthonormal_basis(y - y.mean(0), eps)
    singular = np.linalg.svd(qx.T @ qy, compute_uv=False)
    return float(np.clip(singular, 0, 1).sum() / y.shape[1])


class LinearProbe:
    """A ridge probe from flattened latents to a target (the common metric of open-loop
    prediction: fit on encoded training frames, applied to predicted latents)."""

    def __init__(self, ridge: float = 1e-3):
        self.model = Ridge(alpha=ridge)

    def fit(self, latents: np.ndarray, target: np.ndarray) -> LinearProbe:
        self.model.fit(_rows(latents), _rows(target))
        return self

    def r2(self, latents: np.ndarray, target: np.ndarray) -> float:
        predicted = self.model.predict(_rows(latents))
        return float(r2_score(_rows(target), predicted, multioutput="variance_weighted"))


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(len(a), -1)


def _orthonormal_basis(a: np.ndarray, eps: float) -> np.ndarray:
    u, s, _ = np.linalg.svd(a, full_matrices=False)
    return u[:, s > eps * max(s.max(initial=0.0), eps)]
