"""Two-stage transfer for administrative censoring (the proposed procedure).

Stage 1 (source: long-followed cohorts, windows >= L + the delay tail): fit the joint model,
giving the event baseline and covariate effects theta_S and the delay law phi_S.
Stage 2 (target: newly enrolled, window << L): keep theta_S and phi_S and estimate only the
cohort's proportional-hazards risk shift gamma by maximising the target's marginal likelihood
(Eq. M1 with theta, phi fixed):

    gamma_hat = argmax_gamma l_tgt(theta_S, phi_S, gamma) - gamma^2 / (2 s^2)           (T1)
    F_tgt(L | x) = 1 - exp(-e^gamma_hat H_S(L | x))                                     (T2)
    IBNR_tgt = sum_{unreported target i} pi_i(theta_S, phi_S, gamma_hat)                (T3)

Uncertainty (two-step sandwich, Murphy & Topel 1985): gamma_hat solves the target's score
equation at the *estimated* source parameters eta_S = (theta_S, phi_S), so its variance adds
the source's uncertainty carried through the cross-curvature. With H the Hessian of the
target's objective of Eq. (T1) and s_i the per-subject target scores in gamma,

    Var(gamma_hat)        = H_gg^-1 (sum_i s_i^2 + H_ge V_S H_eg) H_gg^-1                (T4)
    Cov(gamma_hat, eta_S) = -H_gg^-1 H_ge V_S

where V_S is the source fit's sandwich covariance (Eq. V of fitting.py); source and target
are independent samples, so their scores do not covary.

Why these pieces are transferred: a short window sees only the early part of the event-time
distribution and delays censored at a few months, so the baseline shape, the covariate effects
and the delay law are (nearly) unidentified in the target alone; one scalar level is what the
target's reports can pin down, and it is the quantity a new cohort is most likely to shift.

The N(0, s^2) term (s = 1 by default; ``None`` gives the plain MLE) is this implementation's
choice: a target with no report yet has MLE gamma = -inf (zero risk); the prior shrinks it to
the source instead and is negligible once the target has a dozen reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from survival_delay.core import Cohort, JointModel
from survival_delay.fitting import (
    Blocks,
    MCEMSchedule,
    fit_direct,
    fit_mcem,
    flatten_blocks,
    log_prior,
    unflatten_blocks,
)

GAMMA_PRIOR_SD = 1.0


@dataclass
class TransferFit:
    source: Blocks
    target: Blocks  # source theta/phi with the target's gamma
    mean_risk: float  # mean of Eq. (T2) over the target subjects
    ibnr: float  # Eq. (T3)


def fit_joint(
    model: JointModel,
    cohort: Cohort,
    method: str = "direct",
    start: Blocks | None = None,
    free: tuple[str, ...] = ("theta", "phi"),
    schedule: MCEMSchedule | None = None,
    seed: int = 0,
    gamma_prior_sd: float | None = None,
) -> Blocks:
    """Either estimator of Eq. (M1): ``direct`` (quadrature + L-BFGS) or ``mcem``."""
    if method == "direct":
        return fit_direct(model, cohort, start, free, gamma_prior_sd=gamma_prior_sd)
    if method == "mcem":
        return fit_mcem(
            model, cohort, start, free, schedule, seed, gamma_prior_sd=gamma_prior_sd
        ).blocks
    raise ValueError(f"unknown fitting method {method!r}; use 'direct' or 'mcem'")


def transfer(
    model: JointModel,
    source: Cohort,
    target: Cohort,
    horizon: float,
    method: str = "direct",
    source_blocks: Blocks | None = None,
    schedule: MCEMSchedule | None = None,
    seed: int = 0,
    gamma_prior_sd: float | None = GAMMA_PRIOR_SD,
) -> TransferFit:
    """Stage 1 on ``source`` (unless ``source_blocks`` is given), then Eq. (T1)-(T3)."""
    if source_blocks is None:
        source_blocks = fit_joint(model, source, method, schedule=schedule, seed=seed)
    start = {**source_blocks, "gamma": torch.zeros_like(source_blocks["gamma"])}
    target_blocks = fit_joint(
        model, target, method, start, ("gamma",), schedule, seed + 1, gamma_prior_sd
    )
    return TransferFit(
        source_blocks,
        target_blocks,
        mean_risk(model, target_blocks, target.x, horizon),
        float(
            model.expected_ibnr(
                target_blocks["theta"], target_blocks["phi"], target, target_blocks["gamma"]
            )
        ),
    )


def mean_risk(model: JointModel, blocks: Blocks, x: torch.Tensor, horizon: float) -> float:
    """The cohort's timely risk: mean over subjects of Eq. (T2)."""
    return float(model.timely_risk(blocks["theta"], x, horizon, blocks["gamma"]).mean())


def two_step_covariance(
    model: JointModel,
    target: Cohort,
    target_blocks: Blocks,
    source_covariance: torch.Tensor,
    gamma_prior_sd: float | None = GAMMA_PRIOR_SD,
) -> torch.Tensor:
    """Eq. (T4): the covariance of (theta_S, phi_S, gamma_hat), flattened in that order, from
    the source fit's covariance ``source_covariance`` over (theta, phi) and the target."""
    free = ("theta", "phi", "gamma")
    flat = flatten_blocks(target_blocks, free)

    def objective(vector: torch.Tensor) -> torch.Tensor:
        b = unflatten_blocks(vector, target_blocks, free)
        return model.loglik(b["theta"], b["phi"], target, b["gamma"]) + log_prior(b, gamma_prior_sd)

    def per_subject_gamma(gamma: torch.Tensor) -> torch.Tensor:
        b = {**target_blocks, "gamma": gamma}
        return model.loglik(b["theta"], b["phi"], target, b["gamma"], per_subject=True)

    hessian = torch.autograd.functional.hessian(objective, flat)
    h_gg, h_ge = hessian[-1:, -1:], hessian[-1:, :-1]
    scores = torch.autograd.functional.jacobian(
        per_subject_gamma, target_blocks["gamma"], vectorize=True, strategy="forward-mode"
    )  # [N, 1]
    h_gg_inv = torch.linalg.inv(h_gg)
    carried = h_ge @ source_covariance @ h_ge.T
    var_gamma = h_gg_inv @ (scores.T @ scores + carried) @ h_gg_inv
    cov_gamma_source = -h_gg_inv @ h_ge @ source_covariance
    return torch.cat(
        [
            torch.cat([source_covariance, cov_gamma_source.T], dim=1),
            torch.cat([cov_gamma_source, var_gamma], dim=1),
        ]
    )
