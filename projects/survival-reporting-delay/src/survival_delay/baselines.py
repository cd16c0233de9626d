"""Baselines for the target cohort's timely risk F(L | x); each returns fitted parameter blocks.

- naive:            delays ignored; unreported subjects right-censored at c' (event model only)
- naive transfer:   naive fit on the source, then the target's PH shift gamma, delays ignored
- IPW/chain-ladder: each reported target event weighted by 1 / F_D(c_i - T_i) (the chance it had
                    been reported by tau; delay law from the source), then a weighted PH fit
- IPW transfer:     the same source fit as the transfer (theta_S, phi_S); only the target's shift
                    gamma is fitted, from the IPW-weighted target events (the fair rival of the
                    transfer: same stage 1, a different stage 2)
- target-only:      the joint model (Eq. M1) fitted on the target alone, no transfer
- source-only:      the source's joint fit applied to the target (gamma = 0)
- oracle:           the target's true event times up to L (no delays, no administrative censoring)
- Cox (reference):  lifelines' CoxPHFitter, for the real-data study
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from survival_delay.core import Cohort, JointModel
from survival_delay.fitting import Blocks, default_start, fit_direct, lbfgs_maximize, log_prior
from survival_delay.transfer import GAMMA_PRIOR_SD


def _event_only_fit(
    model: JointModel,
    cohort: Cohort,
    weights: torch.Tensor,
    start: Blocks | None,
    free: tuple[str, ...],
    gamma_prior_sd: float | None = GAMMA_PRIOR_SD,
) -> Blocks:
    """Weighted right-censored fit (Eq. H4): reported events exact (weight w), others censored."""
    rep = cohort.reported
    t = torch.where(rep, cohort.event_time, cohort.exposure)
    w = torch.where(rep, weights, torch.ones_like(weights))
    start = start or default_start(model, cohort)

    def objective(b: Blocks) -> torch.Tensor:
        ll = model.event.weighted_loglik(b["theta"], t, rep.double(), w, cohort.x, b["gamma"])
        prior = log_prior(b, gamma_prior_sd) if "gamma" in free else 0.0
        return (ll + prior) / len(cohort)

    return lbfgs_maximize(objective, start, free)


def naive(model: JointModel, target: Cohort) -> Blocks:
    """Delays ignored: a standard right-censored fit of the target's reported events."""
    return _event_only_fit(model, target, torch.ones_like(target.window), None, ("theta",))


def naive_transfer(
    model: JointModel,
    source: Cohort,
    target: Cohort,
    gamma_prior_sd: float | None = GAMMA_PRIOR_SD,
    source_blocks: Blocks | None = None,
) -> Blocks:
    """Naive fit on the source (unless given), then only gamma on the target (isolates the
    delay model; the same N(0, s^2) prior on gamma as the transfer estimator)."""
    source_blocks = source_blocks or naive(model, source)
    ones = torch.ones_like(target.window)
    start = {**source_blocks, "gamma": torch.zeros_like(source_blocks["gamma"])}
    return _event_only_fit(model, target, ones, start, ("gamma",), gamma_prior_sd)


def ipw_weights(
    model: JointModel, target: Cohort, delay_params: torch.Tensor, max_weight: float = 20.0
) -> torch.Tensor:
    """1 / F_D(c_i - T_i) for reported subjects (the chance the event had been reported by
    tau), capped at ``max_weight``; 1 for the others (their weight is unused)."""
    rep = target.reported
    lag = torch.where(rep, target.window - target.event_time, torch.ones_like(target.window))
    report_prob = model.delay.cdf(delay_params, lag, target.x)
    return (1 / report_prob.clamp_min(1 / max_weight)).detach()


def ipw(
    model: JointModel, target: Cohort, delay_params: torch.Tensor, max_weight: float = 20.0
) -> Blocks:
    """Chain-ladder style inflation: weight 1 / F_D(c_i - T_i), capped at ``max_weight``."""
    weights = ipw_weights(model, target, delay_params, max_weight)
    return _event_only_fit(model, target, weights, None, ("theta",))


def ipw_transfer(
    model: JointModel,
    target: Cohort,
    source_blocks: Blocks,
    gamma_prior_sd: float | None = GAMMA_PRIOR_SD,
    max_weight: float = 20.0,
) -> Blocks:
    """The transfer's stage 1 (theta_S, phi_S), then gamma from the IPW-weighted target events
    (reported events weighted by 1 / F_D(c - T) under phi_S; the others censored at c')."""
    weights = ipw_weights(model, target, source_blocks["phi"], max_weight)
    start = {**source_blocks, "gamma": torch.zeros_like(source_blocks["gamma"])}
    return _event_only_fit(model, target, weights, start, ("gamma",), gamma_prior_sd)


def target_only(model: JointModel, target: Cohort) -> Blocks:
    """The joint model on the target alone (theta and phi free, gamma = 0)."""
    return fit_direct(model, target)


def oracle(model: JointModel, full_information: Cohort) -> Blocks:
    """Event-only fit on the target's full information (true T up to L)."""
    return naive(model, full_information)


def cox_mean_risk(
    train: pd.DataFrame, predict_x: pd.DataFrame, horizon: float, duration: str, event: str
) -> float:
    """lifelines CoxPH fitted on ``train``; mean predicted F(horizon | x) over ``predict_x``.

    Beyond the last observed event time the Breslow baseline is flat, so a short window gives a
    Cox model no information about later risk: that is the point of showing it.
    """
    from lifelines import CoxPHFitter

    fitter = CoxPHFitter(penalizer=1e-4).fit(train, duration_col=duration, event_col=event)
    survival = fitter.predict_survival_function(predict_x, times=[horizon])
    return float(np.mean(1 - survival.to_numpy()[0]))
