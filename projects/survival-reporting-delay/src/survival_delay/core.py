"""Joint event/reporting hazards with right-censored reporting delays: the marginal likelihood.

Notation (times are measured from enrolment, in one unit throughout):
    x_i     covariates [F];  L the coverage length (an event counts only if T <= L)
    c_i     window = as-of date tau - enrolment date (time available for a report)
    c'_i    exposure = min(c_i, L, lapse_i - enrolment)  (time in which a counted event can occur)
    T_i     event time,  T ~ lambda(t | x; theta) e^gamma   (PH, hazards.py; gamma = cohort shift)
    D_i     reporting delay since the event,  D ~ mu(d | x; phi),  D independent of T given x

Observation: subject i is *reported* iff T_i <= c'_i and T_i + D_i <= c_i; then (T_i, D_i) are
exact. Otherwise nothing is seen and the event status Z_i = 1{T_i <= c'_i} is latent (Z_i = 1 is
an occurred-but-unreported event, "IBNR"). The marginal log-likelihood is

    l(theta, phi) = sum_rep [log f_T(T_i | x_i) + log f_D(D_i | x_i)]
                  + sum_unrep log[S_T(c'_i | x_i) + I_i]                                (M1)
    I_i = int_0^{c'_i} f_T(t | x_i) S_D(c_i - t | x_i) dt                              (M2)

I_i is computed by Gauss-Legendre quadrature on [0, c'_i] in log space (M2q). The posterior
of the latent status and time of an unreported subject, used by the MCEM E-step, is

    pi_i = P(Z_i = 1 | no report) = I_i / (S_T(c'_i) + I_i)                            (E1)
    p(T_i = t | Z_i = 1, no report) ∝ f_T(t | x_i) S_D(c_i - t | x_i),  t in [0, c'_i]  (E2)

The timely risk of a subject is F(L | x) = 1 - exp(-e^gamma H_T(L | x)) (R1); the expected
number of occurred-but-unreported events at tau is sum_unrep pi_i (R2).

Dates known to the day. An event dated day e happened at some t in [e, e + w_T); a report dated
day r arrived at some time in [r, r + w_R). The delay r - e in whole days therefore says the
true delay lies in (r - e - w_T, r - e + w_R), a triangular window, not [r - e, r - e + w_R).
A reported subject's term of (M1) is then the event-day x report-day probability

    log int_0^{w_T} f_T(e + u | x) [F_D(r + w_R - e - u | x) - F_D(r - e - u | x)] du       (H6)

(F_D = 0 below 0), computed by Gauss-Legendre over the event's day. The MCEM E-step treats the
time of day u as one more latent variable, with posterior weights proportional to the
integrand of (H6) at the same nodes (E3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from survival_delay.hazards import PHComponent, make_family


@dataclass
class Cohort:
    """One cohort's observed data (float64 tensors, [N] unless noted).

    ``event_time`` and ``delay`` hold NaN for unreported subjects. ``event_width`` and
    ``delay_width`` (optional, >= 0) say a reported time is known only to an interval: the event
    happened in [T, T + event_width) and the report arrived in [T + D, T + D + delay_width)
    (dates known to the day give both widths = 1 day). With an exact event time that is the
    delay interval [D, D + delay_width) (Eq. H5 of hazards.py); with an event known to its day
    the likelihood integrates over the event's time of day (Eq. H6, module docstring). Either
    way an event on the enrolment date (T = 0) or a same-day report (D = 0) has a finite
    likelihood. Width 0 (or None) is an exact time.
    """

    x: torch.Tensor  # [N, F]
    window: torch.Tensor  # c_i
    exposure: torch.Tensor  # c'_i <= c_i
    reported: torch.Tensor  # bool
    event_time: torch.Tensor  # T_i (reported only)
    delay: torch.Tensor  # D_i (reported only)
    event_width: torch.Tensor | None = None  # event in [T_i, T_i + width)
    delay_width: torch.Tensor | None = None  # report in [T_i + D_i, T_i + D_i + width)

    def __len__(self) -> int:
        return self.x.shape[0]

    def subset(self, index) -> Cohort:
        index = torch.as_tensor(index)
        return Cohort(
            *(
                None if getattr(self, f) is None else getattr(self, f)[index]
                for f in self.__dataclass_fields__
            )
        )

    def check(self) -> Cohort:
        """Raise ValueError on inconsistent data (reports after tau, exposure > window, ...)."""
        n = len(self)
        for name in ("window", "exposure", "reported", "event_time", "delay"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"Cohort.{name} must have shape [{n}]")
        for name in ("event_width", "delay_width"):
            width = getattr(self, name)
            if width is not None and (width.shape != (n,) or (width < 0).any()):
                raise ValueError(f"Cohort.{name} must have shape [{n}] and be >= 0")
        if (self.exposure < 0).any() or (self.exposure > self.window + 1e-9).any():
            raise ValueError("need 0 <= exposure (c') <= window (c) for every subject")
        rep = self.reported
        t, d = self.event_time[rep], self.delay[rep]
        if (t < 0).any() or (d < 0).any() or t.isnan().any() or d.isnan().any():
            raise ValueError("reported subjects need non-negative event times and delays")
        if (t > self.exposure[rep] + 1e-9).any() or (t + d > self.window[rep] + 1e-9).any():
            raise ValueError("a reported event lies outside its exposure or its report after tau")
        return self


NEGLIGIBLE = 40.0  # I below e^-40 S_T(c') leaves log(S + I) unchanged in float64


@dataclass
class JointModel:
    """Event component (theta) and delay component (phi), each a PH family (hazards.py)."""

    event: PHComponent
    delay: PHComponent
    quad_nodes: int = 32

    @classmethod
    def build(
        cls,
        n_features: int,
        event_family: str = "weibull",
        delay_family: str = "weibull",
        delay_covariates: bool = False,
        cuts: tuple[float, ...] | None = None,
        quad_nodes: int = 32,
    ) -> JointModel:
        return cls(
            PHComponent(make_family(event_family, cuts), n_features),
            PHComponent(make_family(delay_family), n_features if delay_covariates else 0),
            quad_nodes,
        )

    # -- Eq. (M2q): Gauss-Legendre nodes on [0, c'_i] -------------------------------------
    def quadrature(self, exposure: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Nodes t [N, K] and log weights [N, K] of a K-point Gauss-Legendre rule on [0, c'_i]."""
        u, w = (v.to(exposure.device) for v in _legendre(self.quad_nodes))  # [K], [K]
        half = (exposure / 2).unsqueeze(-1)  # [N, 1]
        nodes = half * (u + 1)  # [N, K]
        log_w = torch.log(w) + torch.log(half.clamp_min(1e-300))  # [N, K]
        return nodes, log_w

    def log_unreported_terms(self, theta, phi, gamma, cohort: Cohort):
        """log S_T(c') and log I (Eq. M2) for every subject: two [N] tensors.

        Quadrature runs only where I can matter. Since S_D is decreasing and c - t >= c - c',
        I <= F_T(c') S_D(c - c') (M2b); where that bound is below e^-40 S_T(c') (a window far
        past the exposure end, e.g. delay-free data), the bound stands in for I, which changes
        log(S_T(c') + I) by less than 1e-17 and skips the [N, K] work for those subjects.
        """
        log_s = self.event.log_survival(theta, cohort.exposure, cohort.x, gamma)  # [N]
        positive = cohort.exposure > 0  # (c' = 0 has I = 0; keep its gradient NaN-free)
        safe_s = torch.where(positive, log_s, torch.full_like(log_s, -1.0))
        log_f_edge = torch.log(-torch.expm1(safe_s))  # log F_T(c')
        slack = (cohort.window - cohort.exposure).clamp_min(0)
        log_bound = log_f_edge + self.delay.log_survival(phi, slack, cohort.x)  # Eq. (M2b), [N]
        need = (log_bound.detach() >= log_s.detach() - NEGLIGIBLE) & positive
        log_i = torch.where(positive, log_bound, torch.full_like(log_s, -torch.inf))
        index = need.nonzero(as_tuple=True)
        if len(index[0]):
            sub = cohort.subset(index[0])
            nodes, log_w = self.quadrature(sub.exposure)  # [U, K]
            log_f = self.event.log_density(theta, nodes, sub.x, gamma)  # [U, K]
            lag = (sub.window.unsqueeze(-1) - nodes).clamp_min(0)  # c - t, [U, K]
            log_sd = self.delay.log_survival(phi, lag, sub.x)  # [U, K]
            log_i = log_i.index_put(index, torch.logsumexp(log_w + log_f + log_sd, dim=-1))
        return log_s, log_i

    # -- Eq. (H6): reports and events known to the day -------------------------------------
    def day_quadrature(self, theta, phi, gamma, cohort: Cohort):
        """Time-of-day nodes u [R, K] and log integrand + log weight [R, K] of Eq. (H6) for the
        subjects whose event is known to an interval (``event_width`` > 0), and their index [R].

        The integrand is f_T(T + u) P(D in [(D_obs - u)^+, D_obs + w_R - u)); with an exact
        report time (w_R = 0) it is f_T(T + u) f_D(D_obs - u), 0 where D_obs - u <= 0.
        """
        width = cohort.event_width
        if width is None:
            empty = cohort.x.new_zeros(0, self.quad_nodes)
            return empty.long()[:, 0], empty, empty
        index = (cohort.reported & (width > 0)).nonzero().squeeze(-1)  # [R]
        sub = cohort.subset(index)
        u, w = (v.to(sub.x.device) for v in _legendre(self.quad_nodes))  # [K]
        half = (sub.event_width / 2).unsqueeze(-1)  # [R, 1]
        offset = half * (u + 1)  # [R, K] time of day since the start of the event's day
        log_w = torch.log(w) + torch.log(half)
        log_f = self.event.log_density(theta, sub.event_time.unsqueeze(-1) + offset, sub.x, gamma)
        delay_width = (
            torch.zeros_like(sub.delay) if sub.delay_width is None else sub.delay_width
        ).unsqueeze(-1)
        lag = sub.delay.unsqueeze(-1) - offset  # [R, K] the delay if the report came at r
        lower = lag.clamp_min(0)
        upper = lag + delay_width
        inside = upper > lower
        interval = (delay_width > 0).expand_as(lag)
        safe_lower = torch.where(inside, lower, torch.zeros_like(lower))
        safe_width = torch.where(inside, upper - lower, torch.ones_like(lower))
        log_p_interval = self.delay.log_interval_prob(phi, safe_lower, safe_width, sub.x)
        exact_lag = torch.where(lag > 0, lag, torch.ones_like(lag))
        log_p_exact = torch.where(
            lag > 0,
            self.delay.log_density(phi, exact_lag, sub.x),
            torch.full_like(lag, -torch.inf),
        )
        log_p = torch.where(
            interval,
            torch.where(inside, log_p_interval, torch.full_like(lag, -torch.inf)),
            log_p_exact,
        )
        return index, offset, log_w + log_f + log_p

    def log_reported_terms(self, theta, phi, gamma, cohort: Cohort) -> torch.Tensor:
        """A reported subject's term of Eq. (M1) [N] (placeholders for unreported subjects).

        Exact times give log f_T(T) + log f_D(D); an exact event with a report known to the day
        gives log f_T(T) + log P(D in [D, D + w_R)) (Eq. H5); an event known to its day gives
        Eq. (H6) by Gauss-Legendre over the event's day.
        """
        rep = cohort.reported
        t = torch.where(rep, cohort.event_time, cohort.exposure)  # NaN-free placeholders
        if cohort.event_width is not None:  # (Eq. H6 rows are replaced below; keep t > 0)
            t = torch.where(rep & (cohort.event_width > 0), t + cohort.event_width / 2, t)
        d = torch.where(rep, cohort.delay, torch.ones_like(cohort.delay))
        terms = self.event.log_density(theta, t, cohort.x, gamma) + self.delay.log_observed(
            phi, d, cohort.delay_width, cohort.x
        )
        index, _, log_integrand = self.day_quadrature(theta, phi, gamma, cohort)
        if len(index):
            terms = terms.index_put((index,), torch.logsumexp(log_integrand, dim=-1))
        return terms

    def loglik(self, theta, phi, cohort: Cohort, gamma=0.0, per_subject=False) -> torch.Tensor:
        """Eq. (M1): the marginal log-likelihood (a scalar, or [N] with ``per_subject``).

        Reported subjects contribute ``log_reported_terms`` (exact times, Eq. H5 or Eq. H6).
        """
        terms = self.log_reported_terms(theta, phi, gamma, cohort)
        unrep = ~cohort.reported
        if unrep.any():
            log_s, log_i = self.log_unreported_terms(theta, phi, gamma, cohort.subset(unrep))
            index = unrep.nonzero(as_tuple=True)
            terms = terms.index_put(index, torch.logaddexp(log_s, log_i))  # [N]
        return terms if per_subject else terms.sum()

    def day_posterior(self, theta, phi, cohort: Cohort, gamma=0.0):
        """Eq. (E3): the posterior of the event's time of day for subjects known to the day.

        Returns their index [R], nodes u [R, K] (offsets into the event's day) and normalised
        weights [R, K]: the Gauss-Legendre rule of Eq. (H6) with each node weighted by the
        integrand, so that sum_k p_k g(u_k) is E[g(u) | data] to quadrature accuracy.
        """
        index, offset, log_integrand = self.day_quadrature(theta, phi, gamma, cohort)
        return index, offset, torch.softmax(log_integrand, dim=-1)

    def posterior_event_prob(self, theta, phi, cohort: Cohort, gamma=0.0) -> torch.Tensor:
        """Eq. (E1): pi_i for every subject [N] (0 for reported subjects)."""
        log_s, log_i = self.log_unreported_terms(theta, phi, gamma, cohort)
        pi = torch.exp(log_i - torch.logaddexp(log_s, log_i))
        return torch.where(cohort.reported, torch.zeros_like(pi), pi)

    def posterior_time_grid(self, theta, phi, cohort: Cohort, gamma=0.0, cells: int = 256):
        """Eq. (E2) on a midpoint grid: cell midpoints [N, G] and cell probabilities [N, G]."""
        edges = torch.linspace(
            0, 1, cells + 1, dtype=cohort.exposure.dtype, device=cohort.exposure.device
        )
        mids = (edges[:-1] + edges[1:]) / 2  # [G]
        t = cohort.exposure.unsqueeze(-1) * mids  # [N, G]
        lag = (cohort.window.unsqueeze(-1) - t).clamp_min(0)
        log_p = self.event.log_density(theta, t, cohort.x, gamma) + self.delay.log_survival(
            phi, lag, cohort.x
        )
        return t, torch.softmax(log_p, dim=-1)

    def timely_risk(self, theta, x, horizon: float, gamma=0.0) -> torch.Tensor:
        """Eq. (R1): F(L | x) = 1 - exp(-e^gamma H_T(L | x)) for x [N, F] -> [N]."""
        t = torch.full((x.shape[0],), float(horizon), dtype=x.dtype, device=x.device)
        return self.event.cdf(theta, t, x, gamma)

    def expected_ibnr(self, theta, phi, cohort: Cohort, gamma=0.0) -> torch.Tensor:
        """Eq. (R2): expected number of occurred-but-unreported events, sum_unrep pi_i."""
        return self.posterior_event_prob(theta, phi, cohort, gamma).sum()


@lru_cache
def _legendre(nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    u, w = np.polynomial.legendre.leggauss(nodes)
    return torch.as_tensor(u, dtype=torch.float64), torch.as_tensor(w, dtype=torch.float64)


def sample_posterior(
    model: JointModel,
    theta,
    phi,
    cohort: Cohort,
    draws: int,
    generator: torch.Generator,
    gamma=0.0,
    cells: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """E-step draws for every subject: status Z [N, M] (Eq. E1) and time T [N, M] (Eq. E2).

    T is drawn by inverse CDF on a G-cell midpoint grid of (E2): a cell by its probability, then
    uniformly inside it. Reported subjects get Z = 0 (their rows are ignored by the M-step).
    Random numbers come from the (CPU) ``generator`` and are moved to the cohort's device.
    """
    n, dtype, device = len(cohort), cohort.window.dtype, cohort.window.device
    z = torch.zeros(n, draws, dtype=torch.bool, device=device)
    t = torch.zeros(n, draws, dtype=dtype, device=device)
    latent = (~cohort.reported & (cohort.exposure > 0)).nonzero().squeeze(-1)  # [U]
    if len(latent) == 0:
        return z, t
    sub = cohort.subset(latent)
    log_s, log_i = model.log_unreported_terms(theta, phi, gamma, sub)
    pi = torch.exp(log_i - torch.logaddexp(log_s, log_i))  # Eq. (E1), [U]
    uniform = torch.rand(len(sub), draws, generator=generator, dtype=dtype).to(device)
    z[latent] = uniform < pi.unsqueeze(-1)
    _, probs = model.posterior_time_grid(theta, phi, sub, gamma, cells)  # [U, G]
    cell = torch.multinomial(probs.cpu(), draws, replacement=True, generator=generator)  # [U, M]
    jitter = torch.rand(len(sub), draws, generator=generator, dtype=dtype)
    cell, jitter = cell.to(device), jitter.to(device)
    t[latent] = (cell + jitter) / cells * sub.exposure.unsqueeze(-1)  # [U, M]
    return z, t
