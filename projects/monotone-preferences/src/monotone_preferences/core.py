"""Learning evaluator preferences under monotonicity alone: the estimators, in numpy/scipy/OSQP.

Setting (abstract). An evaluator maps criteria scores ``x in R^d`` to an overall evaluation
``y = f(x) + eps``. After the user's direction flips ``x_j <- s_j x_j`` (``s_j in {+1, -1}``,
Eq. 0) the only assumption is that ``f`` is coordinate-wise non-decreasing:

    x <= x' (every coordinate)  =>  f(x) <= f(x').                                     (Eq. 1)

Two component estimators (design note 1.2):

- non-negative linear fit: ``f(x) = b + w^T x`` with ``w >= 0`` (monotone and linear), the least
  squares solution by NNLS on centred data                                                (Eq. 2);
- multivariate isotonic least squares on the dominance order (ties pooled with weights)

      min_theta sum_g c_g (ybar_g - theta_g)^2  s.t.  theta_i <= theta_j for x_i <= x_j  (Eq. 3)

  a QP solved by OSQP over the transitive reduction (Hasse diagram) of the dominance order,
  which has the same feasible set as all pairs (Eq. 4). A new point gets the midpoint of the
  lower envelope ``max{theta_i : x_i <= x}`` and the upper envelope ``min{theta_i : x_i >= x}``,
  each clipped to the fitted range (Eq. 5); both envelopes are non-decreasing in ``x``, so the
  prediction is monotone and equals ``theta_i`` at a fitted point.

The robust estimator (RECONSTRUCTION [R] of the paper's algorithm, which the design note could
not read): K-fold cross-fitting of the candidates, then either selection of the candidate with
the lower held-out squared error, or aggregation with exponential weights

      w_m  propto  exp(-n (L_m - min_k L_k) / (beta * min_k L_k))                            (Eq. 6)

refitted on all data. It lives behind the ``MonotoneEstimator`` interface (``fit``/``predict``/
``get_state``), so the paper's own algorithm can replace it.

Downstream quantities (design note 6): normalised excess error ``(f_hat - f)^2 / Var f`` (Eq. 7),
precision of top-k selection (Eq. 8), average effect of raising one criterion (criterion
importance, its sign and the counterfactual advice "raise the criterion with the largest
effect", Eq. 9) and the monotonicity-violation rate on random ordered pairs (Eq. 10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import osqp
import scipy.sparse as sp
import torch
from scipy.optimize import nnls
from torch import nn

BLOCK = 2048  # rows per block of the dominance computations: memory O(BLOCK * n)


class MonotoneEstimator(Protocol):
    """What a preference learner offers: fit on (x [n, d], y [n]), predict f on x [m, d]."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> MonotoneEstimator: ...

    def predict(self, x: np.ndarray) -> np.ndarray: ...


# ----------------------------------------------------------------------------- directions, ties
def apply_directions(x: np.ndarray, directions: Sequence[float] | np.ndarray) -> np.ndarray:
    """Eq. 0: ``x_j * s_j``, with every ``s_j`` exactly +1 or -1 (anything else is an error)."""
    s = np.asarray(directions, dtype=float)
    x = np.asarray(x, dtype=float)
    if s.shape != (x.shape[1],):
        raise ValueError(f"{x.shape[1]} criteria but {s.size} directions")
    if not np.all(np.isin(s, (-1.0, 1.0))):
        raise ValueError(f"directions must be +1 or -1, got {s.tolist()}")
    return x * s


def pool_ties(
    x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Identical criteria rows pooled: unique x [g, d], mean y [g], counts [g], inverse [n]."""
    unique, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    means = np.bincount(inverse, weights=y, minlength=len(unique)) / counts
    return unique, means, counts.astype(float), inverse


# ------------------------------------------------------------------------- the dominance order
def dominates(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """[a, b] boolean: ``lower[i] <= upper[j]`` in every coordinate (Eq. 1's order)."""
    return np.all(lower[:, None, :] <= upper[None, :, :], axis=-1)


def all_pair_edges(x: np.ndarray) -> np.ndarray:
    """Every ordered pair (i, j), i != j, with x_i <= x_j: [E, 2]. For distinct rows only."""
    d = dominates(x, x)
    np.fill_diagonal(d, False)
    return np.argwhere(d)


def reduced_edges(x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Eq. 4: the Hasse diagram of the dominance order on distinct rows x [n, d], as [E, 2].

    (i, j) is kept when x_i < x_j with no k strictly between; dropping the others leaves the
    feasible set of Eq. 3 unchanged (the order is transitive). Rows are processed in blocks of
    ``block``, so memory stays O(block * n) (the compute is O(n^3 / block) matrix products).
    """
    n = len(x)
    edges = []
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        strict = dominates(x[rows], x)  # [b, n]
        strict[np.arange(rows.stop - rows.start), np.arange(rows.start, rows.stop)] = False
        via = np.zeros(strict.shape, dtype=np.float32)  # paths i -> k -> j, counted
        for mid in range(0, n, block):
            cols = slice(mid, min(mid + block, n))
            onward = dominates(x[cols], x)  # [b', n]
            onward[np.arange(cols.stop - cols.start), np.arange(cols.start, cols.stop)] = False
            via += strict[:, cols].astype(np.float32) @ onward.astype(np.float32)
        keep = np.argwhere(strict & (via == 0))
        keep[:, 0] += rows.start
        edges.append(keep)
    return np.concatenate(edges) if edges else np.zeros((0, 2), dtype=int)


def isotonic_qp(
    y: np.ndarray, weights: np.ndarray, edges: np.ndarray, tol: float = 1e-7
) -> np.ndarray:
    """Eq. 3 solved by OSQP: min sum_g w_g (y_g - theta_g)^2 s.t. theta_i - theta_j <= 0 on edges.

    OSQP's form is ``1/2 theta^T P theta + q^T theta`` with P = 2 diag(w), q = -2 w y.
    """
    n = len(y)
    if len(edges) == 0:
        return y.astype(float).copy()
    e = len(edges)
    rows = np.repeat(np.arange(e), 2)
    cols = edges.reshape(-1)
    vals = np.tile([1.0, -1.0], e)
    a = sp.csc_matrix((vals, (rows, cols)), shape=(e, n))
    p = sp.diags(2.0 * weights).tocsc()
    solver = osqp.OSQP()
    solver.setup(
        P=p,
        q=-2.0 * weights * y,
        A=a,
        l=np.full(e, -np.inf),
        u=np.zeros(e),
        eps_abs=tol,
        eps_rel=tol,
        max_iter=200_000,
        polishing=False,  # polishing only prints to stdout here; eps 1e-7 is accurate enough
        verbose=False,
    )
    theta = np.asarray(solver.solve(raise_error=False).x, dtype=float)
    # The solver leaves violations of order tol; predictions must be monotone exactly.
    return enforce_order(theta, edges)


def enforce_order(theta: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Raise each theta_j to max(theta_j, theta_i) along edges until no edge is violated.

    Removes the solver's O(tol) violations (each pass is one vectorised sweep; the number of
    passes is at most the longest chain, and in practice 1-3 because violations are tiny)."""
    theta = theta.copy()
    src, dst = edges[:, 0], edges[:, 1]
    for _ in range(len(theta)):
        bad = theta[src] > theta[dst]
        if not bad.any():
            break
        np.maximum.at(theta, dst[bad], theta[src[bad]])
    return theta


class IsotonicRegressor:
    """Multivariate isotonic least squares (Eqs. 3-5): ties pooled, reduced edges, OSQP."""

    def __init__(self, block: int = BLOCK, tol: float = 1e-7) -> None:
        self.block, self.tol = block, tol

    def fit(self, x: np.ndarray, y: np.ndarray) -> IsotonicRegressor:
        self.points_, means, counts, _ = pool_ties(np.asarray(x, float), np.asarray(y, float))
        self.edges_ = reduced_edges(self.points_, self.block)
        self.theta_ = isotonic_qp(means, counts, self.edges_, self.tol)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Eq. 5: midpoint of the clipped lower and upper envelopes, computed in row blocks."""
        x = np.asarray(x, float)
        lo, hi = self.theta_.min(), self.theta_.max()
        out = np.empty(len(x))
        for start in range(0, len(x), self.block):
            part = x[start : start + self.block]
            below = dominates(self.points_, part)  # [g, b]: x_i <= x
            above = dominates(part, self.points_).T  # [g, b]: x <= x_i
            lower = np.where(below, self.theta_[:, None], -np.inf).max(0)
            upper = np.where(above, self.theta_[:, None], np.inf).min(0)
            out[start : start + self.block] = 0.5 * (np.maximum(lower, lo) + np.minimum(upper, hi))
        return out

    def get_state(self) -> dict[str, Any]:
        return {"points": self.points_, "theta": self.theta_}

    def set_state(self, state: dict[str, Any]) -> IsotonicRegressor:
        self.points_, self.theta_ = np.asarray(state["points"]), np.asarray(state["theta"])
        return self


# ------------------------------------------------------------------------------- linear fits
class NonNegativeLinear:
    """Eq. 2: ``f(x) = b + w^T x`` with ``w >= 0``; NNLS on centred data, free intercept."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> NonNegativeLinear:
        x, y = np.asarray(x, float), np.asarray(y, float)
        x_mean, y_mean = x.mean(0), y.mean()
        self.coef_, _ = nnls(x - x_mean, y - y_mean)
        self.intercept_ = float(y_mean - x_mean @ self.coef_)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, float) @ self.coef_ + self.intercept_

    def get_state(self) -> dict[str, Any]:
        return {"coef": self.coef_, "intercept": self.intercept_}

    def set_state(self, state: dict[str, Any]) -> NonNegativeLinear:
        self.coef_, self.intercept_ = np.asarray(state["coef"]), float(state["intercept"])
        return self


# ------------------------------------------------------------------- the robust estimator [R]
def fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    """A seeded assignment of n rows to ``folds`` folds of near-equal size."""
    if n < folds:
        raise ValueError(f"{n} rows cannot be split into {folds} folds; use fewer folds")
    return np.random.default_rng(seed).permutation(np.arange(n) % folds)


def cross_fitted_losses(
    factories: dict[str, Callable[[], MonotoneEstimator]],
    x: np.ndarray,
    y: np.ndarray,
    folds: int,
    seed: int,
) -> dict[str, float]:
    """Held-out mean squared error of each candidate over K folds (fit on K-1, score on 1)."""
    ids = fold_ids(len(y), folds, seed)
    errors = {name: np.zeros(len(y)) for name in factories}
    for k in range(folds):
        train, held = ids != k, ids == k
        for name, make in factories.items():
            errors[name][held] = (make().fit(x[train], y[train]).predict(x[held]) - y[held]) ** 2
    return {name: float(e.mean()) for name, e in errors.items()}


def aggregation_weights(
    losses: dict[str, float], n: int, rule: Literal["select", "aggregate"], beta: float
) -> dict[str, float]:
    """Selection (all weight on the lowest held-out loss) or Eq. 6's exponential weights."""
    names = list(losses)
    values = np.array([losses[m] for m in names])
    best = values.min()
    if rule == "select":
        weights = (np.arange(len(names)) == values.argmin()).astype(float)
    else:
        scale = beta * max(best, 1e-12)
        weights = np.exp(-n * (values - best) / scale)
        weights /= weights.sum()
    return dict(zip(names, weights.tolist(), strict=True))


class CrossFitRobust:
    """The reconstructed robust estimator [R]: cross-fitted choice between NNLS and isotonic LSE.

    ``rule='select'`` keeps the candidate with the lower K-fold held-out squared error;
    ``rule='aggregate'`` mixes them with Eq. 6's weights. Both refit on all rows.
    """

    def __init__(
        self,
        folds: int = 5,
        rule: Literal["select", "aggregate"] = "select",
        beta: float = 1.0,
        seed: int = 0,
        factories: dict[str, Callable[[], MonotoneEstimator]] | None = None,
    ) -> None:
        self.folds, self.rule, self.beta, self.seed = folds, rule, beta, seed
        self.factories = factories or {"linear": NonNegativeLinear, "isotonic": IsotonicRegressor}

    def fit(self, x: np.ndarray, y: np.ndarray) -> CrossFitRobust:
        x, y = np.asarray(x, float), np.asarray(y, float)
        self.cv_losses_ = cross_fitted_losses(self.factories, x, y, self.folds, self.seed)
        self.weights_ = aggregation_weights(self.cv_losses_, len(y), self.rule, self.beta)
        self.fitted_ = {name: make().fit(x, y) for name, make in self.factories.items()}
        return self

    @property
    def chosen_(self) -> str:
        return max(self.weights_, key=self.weights_.get)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return sum(w * self.fitted_[m].predict(x) for m, w in self.weights_.items() if w > 0)

    def get_state(self) -> dict[str, Any]:
        return {
            "weights": self.weights_,
            "cv_losses": self.cv_losses_,
            "parts": {m: f.get_state() for m, f in self.fitted_.items()},
        }

    def set_state(self, state: dict[str, Any]) -> CrossFitRobust:
        self.weights_ = dict(state["weights"])
        self.cv_losses_ = dict(state["cv_losses"])
        self.fitted_ = {
            m: self.factories[m]().set_state(part) for m, part in state["parts"].items()
        }
        return self


# ------------------------------------------------------------ the positive-weight network
class MonotoneNetwork(nn.Module):
    """A monotone MLP: every weight is ``softplus(raw) >= 0`` and tanh is increasing, so the
    output is non-decreasing in each input (the neural baseline). [N, d] -> [N]."""

    def __init__(self, in_features: int, hidden: int = 32, layers: int = 2) -> None:
        super().__init__()
        sizes = [in_features] + [hidden] * layers + [1]
        pairs = zip(sizes[:-1], sizes[1:], strict=True)
        self.raw_weights = nn.ParameterList(
            nn.Parameter(torch.randn(b, a) * 0.5 - 1.0) for a, b in pairs
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in sizes[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        last = len(self.raw_weights) - 1
        for i, (raw, bias) in enumerate(zip(self.raw_weights, self.biases, strict=True)):
            h = h @ nn.functional.softplus(raw).T + bias
            if i < last:
                h = torch.tanh(h)
        return h.squeeze(-1)


# --------------------------------------------------------------------- downstream quantities
def excess_error(prediction: np.ndarray, truth: np.ndarray, scale: float) -> np.ndarray:
    """Eq. 7, per item: (f_hat(x_i) - f(x_i))^2 / Var f."""
    return (np.asarray(prediction) - np.asarray(truth)) ** 2 / scale


def top_k_precision(prediction: np.ndarray, truth: np.ndarray, fraction: float = 0.1) -> float:
    """Eq. 8: share of the predicted top ``fraction`` that is in the true top ``fraction``
    (admit the best 10%; ties in the prediction broken by a stable sort of the index)."""
    k = max(1, int(round(fraction * len(truth))))
    chosen = np.argsort(-np.asarray(prediction), kind="stable")[:k]
    best = np.argsort(-np.asarray(truth), kind="stable")[:k]
    return len(np.intersect1d(chosen, best)) / k


def criterion_effects(
    predict: Callable[[np.ndarray], np.ndarray], x: np.ndarray, step: np.ndarray
) -> np.ndarray:
    """Eq. 9, per point and criterion: f(x + step_j e_j) - f(x), shape [n, d]."""
    base = predict(x)
    effects = np.empty(x.shape)
    for j in range(x.shape[1]):
        moved = x.copy()
        moved[:, j] += step[j]
        effects[:, j] = predict(moved) - base
    return effects


def sign_accuracy(estimated: np.ndarray, true: np.ndarray) -> float:
    """Share of criteria whose average effect (Eq. 9, mean over points) has the true sign
    (a zero effect where the truth is non-zero counts as wrong)."""
    return float(np.mean(np.sign(estimated.mean(0)) == np.sign(true.mean(0))))


def advice_agreement(estimated: np.ndarray, true: np.ndarray) -> float:
    """Share of points where "raise the criterion with the largest effect" agrees with the truth
    (counterfactual advice; ties in the estimate count as disagreement unless all agree)."""
    best_true = true.argmax(1)
    top = estimated.max(1, keepdims=True)
    unique_best = (estimated == top).sum(1) == 1
    return float(np.mean(unique_best & (estimated.argmax(1) == best_true)))


def ordered_pairs(x: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``count`` random pairs (x, x') with x <= x' coordinatewise: x' = x + |delta|."""
    base = x[rng.integers(0, len(x), count)]
    spread = x.std(0) + 1e-12
    return base, base + np.abs(rng.normal(size=base.shape)) * 0.3 * spread


def violation_rate(
    predict: Callable[[np.ndarray], np.ndarray],
    lower: np.ndarray,
    upper: np.ndarray,
    tol: float = 1e-9,
) -> float:
    """Eq. 10: share of ordered pairs (x <= x') with f_hat(x) > f_hat(x') + tol."""
    return float(np.mean(predict(lower) > predict(upper) + tol))
