"""Baselines, each with ``fit(x, y)`` / ``predict(x)`` like the core estimators.

OLS, NNLS (core.NonNegativeLinear), logistic and ordinal-logit (linear utility for decisions and
grades), an additive monotone model by isotonic backfitting, gradient boosting with and without
``monotonic_cst``, plain multivariate isotonic regression (core.IsotonicRegressor), the L(1,1)
ERM of Noothigattu, Shah & Procaccia (JAIR 2021: least absolute deviations over all monotone
functions, an LP), and the positive control (NNLS on the family's true features).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linprog, minimize
from scipy.special import expit
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from monotone_preferences.core import (
    IsotonicRegressor,
    MonotoneNetwork,
    NonNegativeLinear,
    reduced_edges,
)
from monotone_preferences.simulate import family_features


class OLS:
    """Unconstrained least squares with an intercept."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> OLS:
        design = np.c_[np.ones(len(x)), x]
        beta = np.linalg.lstsq(design, y, rcond=None)[0]
        self.intercept_, self.coef_ = float(beta[0]), beta[1:]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, float) @ self.coef_ + self.intercept_


class Logistic:
    """Logistic regression for yes/no decisions (predicts P(yes)); nearly unpenalised."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> Logistic:
        labels = np.asarray(y)
        if set(np.unique(labels)) - {0, 1}:
            raise ValueError("logistic regression needs 0/1 decisions")
        self.model_ = LogisticRegression(C=1e4, max_iter=2000).fit(x, labels.astype(int))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(x)[:, 1]


class OrdinalLogit:
    """Cumulative-logit model P(y <= k | x) = sigmoid(c_k - w^T x) over the sorted grades;
    predicts the expected grade. Cut-points are c_1 + cumsum(exp(delta)) so they stay ordered."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> OrdinalLogit:
        self.levels_ = np.unique(y)
        codes = np.searchsorted(self.levels_, y)
        k, d = len(self.levels_), x.shape[1]
        if k < 2:
            raise ValueError("ordinal logit needs at least two grades")
        self.mean_, self.scale_ = x.mean(0), x.std(0) + 1e-12
        z = (x - self.mean_) / self.scale_

        def nll(params: np.ndarray) -> float:
            probs = self._probs(z, params, k, d)
            return -np.log(np.clip(probs[np.arange(len(codes)), codes], 1e-12, None)).sum()

        start = np.r_[np.zeros(d), -1.0, np.zeros(k - 2)]
        self.params_ = minimize(nll, start, method="L-BFGS-B").x
        self.k_, self.d_ = k, d
        return self

    @staticmethod
    def _probs(z: np.ndarray, params: np.ndarray, k: int, d: int) -> np.ndarray:
        w, first, deltas = params[:d], params[d], params[d + 1 :]
        cuts = np.r_[first, first + np.cumsum(np.exp(deltas))]
        cumulative = expit(cuts[None, :] - (z @ w)[:, None])  # [n, k-1]
        cumulative = np.c_[np.zeros(len(z)), cumulative, np.ones(len(z))]
        return np.diff(cumulative, axis=1)

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, float) - self.mean_) / self.scale_
        return self._probs(z, self.params_, self.k_, self.d_) @ self.levels_


class AdditiveIsotonic:
    """Additive monotone model f = b + sum_j g_j(x_j), each g_j non-decreasing, fitted by
    backfitting 1-D isotonic regressions (``sweeps`` passes over the criteria)."""

    def __init__(self, sweeps: int = 10) -> None:
        self.sweeps = sweeps

    def fit(self, x: np.ndarray, y: np.ndarray) -> AdditiveIsotonic:
        x, y = np.asarray(x, float), np.asarray(y, float)
        self.intercept_ = float(y.mean())
        parts = np.zeros_like(x)
        self.models_ = [IsotonicRegression(out_of_bounds="clip") for _ in range(x.shape[1])]
        for _ in range(self.sweeps):
            for j, model in enumerate(self.models_):
                partial = y - self.intercept_ - parts.sum(1) + parts[:, j]
                parts[:, j] = model.fit(x[:, j], partial).predict(x[:, j])
                shift = parts[:, j].mean()
                parts[:, j] -= shift
                self.intercept_ += shift
        self.shifts_ = [float(m.predict(x[:, j]).mean()) for j, m in enumerate(self.models_)]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, float)
        out = np.full(len(x), self.intercept_)
        for j, model in enumerate(self.models_):
            out += model.predict(x[:, j]) - self.shifts_[j]
        return out


class Boosting:
    """sklearn HistGradientBoostingRegressor, with ``monotonic_cst=+1`` on every (flipped)
    criterion when ``monotone`` (else the unconstrained accuracy reference)."""

    def __init__(self, monotone: bool, learning_rate: float = 0.1, seed: int = 0) -> None:
        self.monotone, self.learning_rate, self.seed = monotone, learning_rate, seed

    def fit(self, x: np.ndarray, y: np.ndarray) -> Boosting:
        self.model_ = HistGradientBoostingRegressor(
            learning_rate=self.learning_rate,
            max_iter=100,
            early_stopping=False,
            monotonic_cst=[1] * x.shape[1] if self.monotone else None,
            random_state=self.seed,
        ).fit(x, y)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.model_.predict(x)


class L11ERM(IsotonicRegressor):
    """Noothigattu et al.'s L(1,1) ERM: min sum_i |y_i - f(x_i)| over monotone f. An LP on the
    reduced dominance edges (HiGHS); predictions by the same envelope rule as the isotonic LSE."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> L11ERM:
        x, y = np.asarray(x, float), np.asarray(y, float)
        self.points_, inverse = np.unique(x, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        g, n = len(self.points_), len(y)
        edges = reduced_edges(self.points_, self.block)
        # variables [theta (g), r_plus (n), r_minus (n)]: y_i = theta_g(i) + r+_i - r-_i
        eq = sp.hstack(
            [sp.csr_matrix((np.ones(n), (np.arange(n), inverse)), shape=(n, g)),
             sp.eye(n), -sp.eye(n)]
        )  # fmt: skip
        e = len(edges)
        ub = sp.csr_matrix(
            (np.tile([1.0, -1.0], e), (np.repeat(np.arange(e), 2), edges.reshape(-1))),
            shape=(e, g + 2 * n),
        )
        cost = np.r_[np.zeros(g), np.ones(2 * n)]
        bounds = [(None, None)] * g + [(0, None)] * (2 * n)
        result = linprog(
            cost, A_ub=ub if e else None, b_ub=np.zeros(e) if e else None,
            A_eq=eq, b_eq=y, bounds=bounds, method="highs",
        )  # fmt: skip
        if result.status != 0:
            raise RuntimeError(f"L(1,1) LP failed: {result.message}")
        self.theta_ = result.x[:g]
        self.edges_ = edges
        return self


class FamilyOracle:
    """Positive control: the correctly specified monotone model of a simulated family, i.e.
    NNLS on the features in which the family is linear (simulate.family_features)."""

    def __init__(self, family: str) -> None:
        self.family = family

    def fit(self, x: np.ndarray, y: np.ndarray) -> FamilyOracle:
        self.linear_ = NonNegativeLinear().fit(family_features(self.family, x), y)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.linear_.predict(family_features(self.family, np.asarray(x, float)))


class MonotoneNetRegressor:
    """The positive-weight monotone network (core.MonotoneNetwork) fitted full-batch with Adam
    on standardised targets; the claim's fast path (``uv run train`` trains the same network
    with Lightning on mini-batches)."""

    def __init__(
        self, hidden: int = 16, layers: int = 2, lr: float = 0.02, steps: int = 300, seed: int = 0
    ) -> None:
        self.hidden, self.layers, self.lr, self.steps, self.seed = hidden, layers, lr, steps, seed

    def fit(self, x: np.ndarray, y: np.ndarray) -> MonotoneNetRegressor:
        torch.manual_seed(self.seed)
        self.net_ = MonotoneNetwork(x.shape[1], self.hidden, self.layers)
        self.shift_, self.scale_ = float(y.mean()), float(y.std() + 1e-12)
        inputs = torch.as_tensor(x, dtype=torch.float32)
        target = torch.as_tensor((y - self.shift_) / self.scale_, dtype=torch.float32)
        optimizer = torch.optim.Adam(self.net_.parameters(), lr=self.lr)
        for _ in range(self.steps):
            optimizer.zero_grad()
            loss = torch.mean((self.net_(inputs) - target) ** 2)
            loss.backward()
            optimizer.step()
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.net_(torch.as_tensor(np.asarray(x, float), dtype=torch.float32))
        return out.double().numpy() * self.scale_ + self.shift_
