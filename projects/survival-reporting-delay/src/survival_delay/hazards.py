"""Parametric hazard families in proportional-hazards form (pure torch, float64).

Every family is a baseline hazard h0(t; b) with cumulative hazard H0(t; b). Covariates enter
in proportional-hazards form, with an optional cohort offset gamma (the "risk shift"):

    h(t | x) = h0(t; b) * exp(x'beta + gamma)                                   (H1)
    H(t | x) = H0(t; b) * exp(x'beta + gamma)                                   (H2)
    S(t | x) = exp(-H(t | x)),   f(t | x) = h(t | x) S(t | x)                   (H3)

A time recorded to a day is interval-censored on [t, t + w) (w = one day):
    P(t <= T < t + w | x) = S(t | x) - S(t + w | x)                             (H5)

A component's parameters are one flat vector ``params = [b (n_baseline), beta (n_coef)]``.
Baselines (all parameters unconstrained):

    Weibull      b = (log alpha, log rho):  H0 = (t / alpha)^rho                (W)
    Gompertz     b = (log a, c):            H0 = a (e^{ct} - 1) / c             (G)
    Piecewise    b = log lambda_k on fixed cuts s_0=0 < s_1 < ...:
                 H0 = sum_k lambda_k |[s_k, s_{k+1}) ∩ [0, t)|                  (P)
    Log-normal   b = (mu, log sigma):       H0 = -log Phi(-(log t - mu) / sigma) (LN)

Time arguments may have any shape [N, ...]; the linear predictor [N] is broadcast over the
trailing dimensions (e.g. quadrature nodes [N, K] or Monte Carlo draws [N, M]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

TINY = 1e-12  # times are clamped away from 0 where the log-hazard has log t


class Family:
    """A baseline hazard: ``log_hazard0`` and ``cumhaz0`` of times [...] given baseline b [P]."""

    name: str = ""
    n_baseline: int = 0

    def log_hazard0(self, t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cumhaz0(self, t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_baseline(self, time_scale: float) -> torch.Tensor:
        """A starting point whose mean time is of the order of ``time_scale``."""
        raise NotImplementedError


class Weibull(Family):
    """Eq. (W): H0 = (t/alpha)^rho, log h0 = log rho - log alpha + (rho - 1) log(t/alpha)."""

    name, n_baseline = "weibull", 2

    def log_hazard0(self, t, b):
        log_alpha, log_rho = b[0], b[1]
        log_ratio = torch.log(t.clamp_min(TINY)) - log_alpha
        return log_rho - log_alpha + (log_rho.exp() - 1) * log_ratio

    def cumhaz0(self, t, b):
        log_alpha, log_rho = b[0], b[1]
        ratio = t.clamp_min(0) / log_alpha.exp()
        return ratio.clamp_min(TINY).pow(log_rho.exp()) * (t > 0)

    def init_baseline(self, time_scale):
        return torch.tensor([math.log(time_scale), 0.0], dtype=torch.float64)


class Gompertz(Family):
    """Eq. (G): h0 = a e^{ct}, H0 = a t * expm1(ct)/(ct) (the c -> 0 limit is a t)."""

    name, n_baseline = "gompertz", 2

    def log_hazard0(self, t, b):
        return b[0] + b[1] * t

    def cumhaz0(self, t, b):
        ct = b[1] * t
        small = ct.abs() < 1e-6
        safe = torch.where(small, torch.ones_like(ct), ct)
        ratio = torch.where(small, 1 + ct / 2, torch.expm1(safe) / safe)
        return b[0].exp() * t * ratio

    def init_baseline(self, time_scale):
        return torch.tensor([-math.log(time_scale), 0.0], dtype=torch.float64)


@dataclass
class PiecewiseExponential(Family):
    """Eq. (P): constant hazards lambda_k = exp(b_k) between fixed cuts (last piece open)."""

    cuts: tuple[float, ...] = (0.25, 0.5, 1.0)
    name: str = field(default="piecewise", init=False)

    @property
    def n_baseline(self) -> int:  # type: ignore[override]
        return len(self.cuts) + 1

    def _edges(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.tensor((0.0, *self.cuts), dtype=like.dtype, device=like.device)  # [K]
        widths = torch.cat([starts.diff(), starts.new_tensor([math.inf])])  # [K]
        return starts, widths

    def log_hazard0(self, t, b):
        starts, _ = self._edges(t)
        piece = torch.bucketize(t.clamp_min(0).contiguous(), starts[1:], right=True)
        return b[piece]

    def cumhaz0(self, t, b):
        starts, widths = self._edges(t)
        exposure = (t.unsqueeze(-1) - starts).clamp(min=0)  # [..., K]
        exposure = torch.minimum(exposure, widths)
        return (exposure * b.exp()).sum(-1)

    def init_baseline(self, time_scale):
        return torch.full((self.n_baseline,), -math.log(time_scale), dtype=torch.float64)


class LogNormal(Family):
    """Eq. (LN): log T ~ N(mu, sigma^2) at x = 0; H0 = -log S0, log h0 = log f0 - log S0."""

    name, n_baseline = "lognormal", 2

    def _z(self, t, b):
        return (torch.log(t.clamp_min(TINY)) - b[0]) / b[1].exp()

    def log_hazard0(self, t, b):
        z = self._z(t, b)
        log_f0 = (
            -torch.log(t.clamp_min(TINY)) - b[1] - 0.5 * z.square() - 0.5 * math.log(2 * math.pi)
        )
        return log_f0 - torch.special.log_ndtr(-z)

    def cumhaz0(self, t, b):
        return -torch.special.log_ndtr(-self._z(t, b)) * (t > 0)

    def init_baseline(self, time_scale):
        return torch.tensor([math.log(time_scale), 0.0], dtype=torch.float64)


FAMILIES = {"weibull": Weibull, "gompertz": Gompertz, "piecewise": PiecewiseExponential}
DELAY_FAMILIES = {"weibull": Weibull, "lognormal": LogNormal}
EventFamily = Literal["weibull", "gompertz", "piecewise"]  # the keys of FAMILIES
DelayFamily = Literal["weibull", "lognormal"]  # the keys of DELAY_FAMILIES


def make_family(name: str, cuts: tuple[float, ...] | None = None) -> Family:
    """Build a family by name (``weibull``, ``gompertz``, ``piecewise``, ``lognormal``)."""
    if name == "piecewise":
        return PiecewiseExponential(cuts=tuple(cuts)) if cuts else PiecewiseExponential()
    table = {**FAMILIES, **DELAY_FAMILIES}
    if name not in table:
        raise ValueError(f"unknown hazard family {name!r}; choose from {sorted(table)}")
    return table[name]()


@dataclass
class PHComponent:
    """A family with ``n_coef`` proportional-hazards coefficients: params = [b, beta]."""

    family: Family
    n_coef: int

    @property
    def n_params(self) -> int:
        return self.family.n_baseline + self.n_coef

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return params[: self.family.n_baseline], params[self.family.n_baseline :]

    def linear_predictor(self, params, x, offset=0.0) -> torch.Tensor:
        """x'beta + gamma: x [N, F] (only the first n_coef columns are used) -> [N]."""
        _, beta = self.split(params)
        lp = x[:, : self.n_coef] @ beta if self.n_coef else x.new_zeros(x.shape[0])
        return lp + offset

    @staticmethod
    def _expand(lp: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return lp.reshape(lp.shape + (1,) * (t.dim() - lp.dim()))

    def log_hazard(self, params, t, x, offset=0.0) -> torch.Tensor:
        """Eq. (H1) in logs: t [N, ...] -> [N, ...]."""
        b, _ = self.split(params)
        lp = self._expand(self.linear_predictor(params, x, offset), t)
        return self.family.log_hazard0(t, b) + lp

    def cumhaz(self, params, t, x, offset=0.0) -> torch.Tensor:
        """Eq. (H2): t [N, ...] -> [N, ...]."""
        b, _ = self.split(params)
        lp = self._expand(self.linear_predictor(params, x, offset), t)
        return self.family.cumhaz0(t, b) * lp.exp()

    def log_survival(self, params, t, x, offset=0.0) -> torch.Tensor:
        """Eq. (H3): log S = -H."""
        return -self.cumhaz(params, t, x, offset)

    def log_density(self, params, t, x, offset=0.0) -> torch.Tensor:
        """Eq. (H3): log f = log h - H."""
        return self.log_hazard(params, t, x, offset) - self.cumhaz(params, t, x, offset)

    def cdf(self, params, t, x, offset=0.0) -> torch.Tensor:
        """F = 1 - S = -expm1(-H)."""
        return -torch.expm1(-self.cumhaz(params, t, x, offset))

    def init_params(self, time_scale: float) -> torch.Tensor:
        return torch.cat(
            [self.family.init_baseline(time_scale), torch.zeros(self.n_coef, dtype=torch.float64)]
        )

    def log_interval_prob(self, params, t, width, x, offset=0.0) -> torch.Tensor:
        """log P(t <= T < t + width) = -H(t) + log(1 - exp(-(H(t + width) - H(t))))   (H5).

        The likelihood of a time known to a day (interval-censored on [t, t + width)); it stays
        finite at t = 0 (a same-day report, an event on the enrolment date). ``width`` > 0.
        """
        lower = self.cumhaz(params, t, x, offset)
        upper = self.cumhaz(params, t + width, x, offset)
        return -lower + torch.log((-torch.expm1(lower - upper)).clamp_min(1e-300))

    def log_observed(self, params, t, width, x, offset=0.0) -> torch.Tensor:
        """log f(t) where ``width`` is 0 (an exact time), Eq. (H5) where it is > 0."""
        log_f = self.log_density(params, t, x, offset)
        if width is None:
            return log_f
        interval = width > 0
        safe = torch.where(interval, width, torch.ones_like(width))
        return torch.where(interval, self.log_interval_prob(params, t, safe, x, offset), log_f)

    def weighted_loglik(self, params, t, event, weight, x, offset=0.0, width=None) -> torch.Tensor:
        """Weighted right-censored log-likelihood sum_j w_j [d_j log h(t_j) - H(t_j)]  (H4).

        Rows j are [J] (or [J, M] with x [J, F]); ``event`` is 0/1; weights are >= 0. An event
        row with ``width`` > 0 is interval-censored on [t, t + width): its d log h(t) becomes
        log(1 - exp(-(H(t + width) - H(t)))), so that the row contributes Eq. (H5).
        """
        log_h = self.log_hazard(params, t, x, offset)
        cumhaz = self.cumhaz(params, t, x, offset)
        if width is not None:
            interval = (event > 0) & (width > 0)
            safe = torch.where(interval, width, torch.ones_like(width))
            step = self.cumhaz(params, t + safe, x, offset) - cumhaz
            log_step = torch.log((-torch.expm1(-step)).clamp_min(1e-300))
            log_h = torch.where(interval, log_step, log_h)
        log_h = torch.where(event > 0, log_h, torch.zeros_like(log_h))
        return (weight * (event * log_h - cumhaz)).sum()
