"""Simulator with known truth: cohorts enrolled on a calendar, event and reporting times drawn
from the joint model, everything observed at the as-of date tau = 0 (times in years).

Event:  Weibull PH, H_T(t | x) = (t / alpha)^rho exp(x'beta + gamma)   (gamma = 0 in the source)
Delay:  Weibull (shape k, scale s) or log-normal (median s, log-sd sigma), independent of T.
A subject enrolled ``w`` years before tau has window c = w and exposure c' = min(w, L).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from survival_delay.core import Cohort


@dataclass
class Truth:
    """The data-generating parameters (defaults: the design note's simulation)."""

    rho: float = 1.2
    alpha: float = 3.0
    beta: tuple[float, ...] = (0.5,)
    gamma: float = 0.4  # target cohort's log risk shift
    delay_family: str = "weibull"
    delay_shape: float = 1.0  # Weibull shape, or log-normal sigma
    delay_scale: float = 0.15  # Weibull scale, or log-normal median
    horizon: float = 1.0  # coverage L

    def theta(self) -> torch.Tensor:
        """Event parameters in the layout of hazards.Weibull + PH coefficients."""
        values = [math.log(self.alpha), math.log(self.rho), *self.beta]
        return torch.tensor(values, dtype=torch.float64)

    def phi(self) -> torch.Tensor:
        """Delay parameters (no delay covariates): (log scale, log shape) is the layout of both
        hazards.Weibull (log alpha, log rho) and hazards.LogNormal (mu = log median, log sigma)."""
        scale, shape = math.log(self.delay_scale), math.log(self.delay_shape)
        return torch.tensor([scale, shape], dtype=torch.float64)


@dataclass
class Simulated:
    """An observed cohort plus what only the simulator knows."""

    cohort: Cohort
    true_time: np.ndarray  # T for everyone (inf-free)
    true_delay: np.ndarray
    true_risk: np.ndarray  # F(L | x_i) under the truth
    shift: float
    extra: dict = field(default_factory=dict)

    @property
    def ibnr(self) -> int:
        """Events that occurred within exposure but were not reported by tau."""
        c = self.cohort
        occurred = self.true_time <= c.exposure.numpy()
        return int((occurred & ~c.reported.numpy()).sum())

    def oracle_cohort(self, horizon: float) -> Cohort:
        """Full information: T observed up to L for every subject, no delays, no tau."""
        n = len(self.cohort)
        seen = self.true_time <= horizon
        t = torch.as_tensor(np.where(seen, self.true_time, np.nan))
        full = torch.full((n,), float(horizon), dtype=torch.float64)
        return Cohort(
            self.cohort.x,
            full + 1e6,  # reports arrive at once: window far beyond any event
            full,
            torch.as_tensor(seen),
            t,
            torch.where(torch.as_tensor(seen), torch.zeros(n, dtype=torch.float64), torch.nan),
        )


def draw_delay(truth: Truth, n: int, rng: np.random.Generator) -> np.ndarray:
    if truth.delay_family == "weibull":
        return truth.delay_scale * rng.weibull(truth.delay_shape, n)
    if truth.delay_family == "lognormal":
        return truth.delay_scale * np.exp(truth.delay_shape * rng.standard_normal(n))
    raise ValueError(f"unknown delay family {truth.delay_family!r}")


def observe(
    x: np.ndarray, t: np.ndarray, d: np.ndarray, window: np.ndarray, exposure: np.ndarray
) -> Cohort:
    """What is seen at tau: a report iff T <= c' and T + D <= c (module docstring of core)."""
    reported = (t <= exposure) & (t + d <= window)
    return Cohort(
        torch.as_tensor(x, dtype=torch.float64),
        torch.as_tensor(window, dtype=torch.float64),
        torch.as_tensor(exposure, dtype=torch.float64),
        torch.as_tensor(reported),
        torch.as_tensor(np.where(reported, t, np.nan), dtype=torch.float64),
        torch.as_tensor(np.where(reported, d, np.nan), dtype=torch.float64),
    ).check()


def simulate_cohort(
    n: int,
    window_range: tuple[float, float],
    truth: Truth,
    shift: float,
    rng: np.random.Generator,
) -> Simulated:
    """n subjects enrolled uniformly between window_range[1] and window_range[0] years
    before tau."""
    x = rng.standard_normal((n, len(truth.beta)))
    lp = x @ np.asarray(truth.beta) + shift
    t = truth.alpha * (rng.exponential(size=n) * np.exp(-lp)) ** (1 / truth.rho)
    d = draw_delay(truth, n, rng)
    window = rng.uniform(*window_range, size=n)
    exposure = np.minimum(window, truth.horizon)
    risk = 1 - np.exp(-((truth.horizon / truth.alpha) ** truth.rho) * np.exp(lp))
    return Simulated(observe(x, t, d, window, exposure), t, d, risk, shift)


def simulate_study(
    seed: int,
    truth: Truth,
    n_source: int = 3000,
    n_target: int = 1000,
    source_windows: tuple[float, float] = (1.0, 3.0),
    target_window: float = 0.5,
) -> tuple[Simulated, Simulated]:
    """Source (long-followed, gamma = 0) and target (enrolled in the last ``target_window``)."""
    rng = np.random.default_rng(seed)
    source = simulate_cohort(n_source, source_windows, truth, 0.0, rng)
    target = simulate_cohort(n_target, (0.0, target_window), truth, truth.gamma, rng)
    return source, target
