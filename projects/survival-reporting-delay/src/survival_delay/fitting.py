"""Estimators of the joint model: the direct ML fit (quadrature) and Monte Carlo EM.

Parameters are three blocks: theta (event, [P_T]), phi (delay, [P_D]) and gamma (cohort shift,
[1]); ``free`` names the blocks that are estimated, the others stay at their given values.

Direct ML: maximise Eq. (M1) of core.py with L-BFGS (strong Wolfe line search).

MCEM: iterate
    E-step  draw (Z_i^(m), T_i^(m)), m = 1..M_k, for each unreported i from Eqs. (E1)-(E2);
            for a reported event known only to its day, weight its time-of-day nodes by
            Eq. (E3) (a quadrature E-step, no draws);
    M-step  maximise the Monte Carlo Q-function, which splits into two weighted right-censored
            fits (Eq. H4 of hazards.py), each warm-started at the current estimate:
      Q_T = sum_rep log f_T(T_i) + 1/M sum_unrep sum_m [Z log f_T(T^(m)) + (1 - Z) log S_T(c'_i)]
      Q_D = sum_rep log f_D(D_i) + 1/M sum_unrep sum_m  Z log S_D(c_i - T^(m))          (Q)
with M_k = min(M_max, ceil(M_0 g^k)) growing; stop when the largest parameter change is below
``tol`` for ``patience`` consecutive iterations at M_max (or after ``max_iter``); the estimate is
the average of the last ``average_last`` iterates (which damps the Monte Carlo noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from survival_delay.core import Cohort, JointModel, sample_posterior

Blocks = dict[str, torch.Tensor]


def lbfgs_maximize(
    objective: Callable[[Blocks], torch.Tensor],
    start: Blocks,
    free: tuple[str, ...],
    max_iter: int = 200,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Blocks:
    """Maximise ``objective(blocks)`` over the ``free`` blocks with L-BFGS; returns new blocks.

    ``reduce`` (optional) all-reduces the objective and its gradient across processes, which
    makes the same code a data-parallel fit when each process holds a shard of the subjects.
    """
    variables = {k: v.detach().clone().requires_grad_(k in free) for k, v in start.items()}
    params = [variables[k] for k in free]
    optimizer = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-8,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        optimizer.zero_grad()
        loss = -objective(variables)
        grads = torch.autograd.grad(loss, params)
        if reduce is not None:
            loss = reduce(loss.detach())
            grads = [reduce(g) for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        return loss.detach()

    optimizer.step(closure)
    return {k: v.detach() for k, v in variables.items()}


def default_start(model: JointModel, cohort: Cohort) -> Blocks:
    """Starting values: time scales from the reported data, coefficients 0, gamma 0."""
    rep = cohort.reported
    event_scale = float(cohort.exposure.max().clamp_min(1e-3))
    delay_scale = float(cohort.delay[rep].mean()) if rep.any() else event_scale / 10
    start = {
        "theta": model.event.init_params(4 * event_scale),
        "phi": model.delay.init_params(max(delay_scale, 1e-3)),
        "gamma": torch.zeros(1, dtype=torch.float64),
    }
    return {k: v.to(cohort.x.device) for k, v in start.items()}


def warm_start(model: JointModel, cohort: Cohort) -> Blocks:
    """A start near the joint MLE for a few cheap fits: theta from the event-only fit (reported
    events exact, the rest censored at c', Eq. H4) and phi from the reported delays alone. Both
    ignore the unreported events' mass, so they are exact when reports are prompt relative to
    the windows and close otherwise; the joint L-BFGS then needs a few quadrature evaluations.
    """
    start = default_start(model, cohort)
    rep = cohort.reported
    if not rep.any():
        return start
    t = torch.where(rep, cohort.event_time, cohort.exposure)
    ones = torch.ones_like(cohort.window)
    event_width = (
        None if cohort.event_width is None else torch.where(rep, cohort.event_width, 0 * ones)
    )

    def event_part(b: Blocks) -> torch.Tensor:
        return model.event.weighted_loglik(
            b["theta"], t, rep.double(), ones, cohort.x, b["gamma"], event_width
        ) / len(cohort)

    start = lbfgs_maximize(event_part, start, ("theta",))
    delay_width = None if cohort.delay_width is None else cohort.delay_width[rep]

    def delay_part(b: Blocks) -> torch.Tensor:
        d = cohort.delay[rep]
        flags = torch.ones_like(d)
        return model.delay.weighted_loglik(
            b["phi"], d, flags, flags, cohort.x[rep], 0.0, delay_width
        ) / len(d)

    return lbfgs_maximize(delay_part, start, ("phi",))


def log_prior(b: Blocks, gamma_prior_sd: float | None) -> torch.Tensor:
    """Optional N(0, sd^2) prior on the cohort shift gamma (shrinks a tiny target to the source)."""
    if gamma_prior_sd is None:
        return b["gamma"].new_zeros(())
    return -0.5 * (b["gamma"] / gamma_prior_sd).square().sum()


def fit_direct(
    model: JointModel,
    cohort: Cohort,
    start: Blocks | None = None,
    free: tuple[str, ...] = ("theta", "phi"),
    reduce=None,
    gamma_prior_sd: float | None = None,
) -> Blocks:
    """Direct ML (or MAP in gamma) of Eq. (M1) (quadrature for Eq. M2) over ``free`` blocks,
    from ``start`` or else from ``warm_start``."""
    start = start or warm_start(model, cohort)
    n = len(cohort)

    def objective(b: Blocks) -> torch.Tensor:
        ll = model.loglik(b["theta"], b["phi"], cohort, b["gamma"])
        return (ll + log_prior(b, gamma_prior_sd)) / n

    return lbfgs_maximize(objective, start, free, reduce=reduce)


def flatten_blocks(blocks: Blocks, free: tuple[str, ...]) -> torch.Tensor:
    return torch.cat([blocks[k].reshape(-1) for k in free]).detach()


def unflatten_blocks(vector: torch.Tensor, blocks: Blocks, free: tuple[str, ...]) -> Blocks:
    out, offset = dict(blocks), 0
    for k in free:
        n = blocks[k].numel()
        out[k] = vector[offset : offset + n].reshape(blocks[k].shape)
        offset += n
    return out


def sandwich_covariance(
    model: JointModel, cohort: Cohort, blocks: Blocks, free: tuple[str, ...] = ("theta", "phi")
) -> torch.Tensor:
    """Robust (sandwich) covariance of the ML estimate of Eq. (M1) over the ``free`` blocks,
    flattened in that order:

        V = A^-1 B A^-1,  A = -d^2 l / d v^2 (observed information),  B = sum_i s_i s_i'   (V)

    with s_i the gradient of subject i's term of Eq. (M1). Under a correct model A = B in
    expectation and V is the inverse information; under misspecification V stays valid for
    the pseudo-true parameter. Per-subject scores come from forward-mode AD ([N, P], P passes).
    """
    flat = flatten_blocks(blocks, free)

    def per_subject(vector: torch.Tensor) -> torch.Tensor:
        b = unflatten_blocks(vector, blocks, free)
        return model.loglik(b["theta"], b["phi"], cohort, b["gamma"], per_subject=True)

    scores = torch.autograd.functional.jacobian(
        per_subject, flat, vectorize=True, strategy="forward-mode"
    )  # [N, P]
    hessian = torch.autograd.functional.hessian(lambda v: per_subject(v).sum(), flat)  # [P, P]
    a_inv = torch.linalg.inv(-hessian)
    return a_inv @ (scores.T @ scores) @ a_inv


def delta_method_se(
    function: Callable[[Blocks], torch.Tensor],
    blocks: Blocks,
    covariance: torch.Tensor,
    free: tuple[str, ...] = ("theta", "phi"),
) -> float:
    """Standard error of a scalar ``function(blocks)`` (e.g. a mean timely risk) from the
    covariance of the flattened ``free`` blocks: sqrt(g' V g), g its gradient."""
    flat = flatten_blocks(blocks, free).requires_grad_()
    value = function(unflatten_blocks(flat, blocks, free))
    (grad,) = torch.autograd.grad(value, flat)
    return float((grad @ covariance @ grad).clamp_min(0).sqrt())


@dataclass
class MonteCarloRows:
    """The E-step draws as rows of two weighted right-censored data sets (Eq. Q).

    Event rows: reported events (exact, weight 1); each unreported subject censored at c' with
    weight #{m: Z=0}/M; each draw with Z=1 exact at T^(m) with weight 1/M.
    Delay rows: reported delays (exact, or interval-censored on [D, D + w) when the report is
    known to the day, weight 1); draws with Z=1 censored at c - T^(m), weight 1/M.
    A reported event known only to its day (Eq. H6) becomes K rows of each kind, one per
    time-of-day node u_k with its posterior weight p_k (Eq. E3): the event exact at T + u_k,
    the delay in [(D - u_k)^+, D + w - u_k) (or exact at D - u_k when the report time is).
    Only non-zero rows are kept, so the M-step costs O(N + sum_i pi_i M), not O(N M).
    """

    event_time: torch.Tensor  # [J]
    event_flag: torch.Tensor  # [J] 0/1
    event_weight: torch.Tensor  # [J]
    event_x: torch.Tensor  # [J, F]
    delay_time: torch.Tensor  # [J']
    delay_flag: torch.Tensor
    delay_weight: torch.Tensor
    delay_x: torch.Tensor
    event_width: torch.Tensor | None = None  # [J] (0 = exact), None when all rows are exact
    delay_width: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        cohort: Cohort,
        z: torch.Tensor,
        t: torch.Tensor,
        day: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> MonteCarloRows:
        """Rows from the draws (z, t) [N, M] and, for events known to the day, ``day`` =
        ``JointModel.day_posterior``'s (index [R], offsets u [R, K], weights p [R, K])."""
        rep, unrep, draws = cohort.reported, ~cohort.reported, z.shape[1]
        z = z & unrep.unsqueeze(-1)  # [N, M]
        subj, draw = z.nonzero(as_tuple=True)  # imputed events
        t_imp = t[subj, draw]
        plain = rep.clone()  # reported rows with an exact event time
        if day is not None:
            plain[day[0]] = False
        n_plain, n_unrep, n_imp = int(plain.sum()), int(unrep.sum()), len(subj)
        no_event = (~z[unrep]).sum(-1).double() / draws  # [U]
        one = torch.ones(1, dtype=torch.float64, device=cohort.x.device)
        zeros = lambda n: 0 * one.expand(n)  # noqa: E731
        lag = (cohort.window[subj] - t_imp).clamp_min(0)
        plain_delay_width = (
            zeros(n_plain) if cohort.delay_width is None else cohort.delay_width[plain]
        )

        # Eq. (E3): reported events known to the day, one row per (subject, time-of-day node)
        day_event_time = day_delay_time = day_delay_width = day_weight = zeros(0)
        day_x = cohort.x[:0]
        if day is not None and len(day[0]):
            index, offset, prob = day
            width = (
                torch.zeros_like(offset)
                if cohort.delay_width is None
                else cohort.delay_width[index].unsqueeze(-1).expand_as(offset)
            )
            day_lag = cohort.delay[index].unsqueeze(-1) - offset  # [R, K]
            lower = torch.where(width > 0, day_lag.clamp_min(0), day_lag)
            keep = prob > 0  # nodes the data rule out (report before the event) carry p = 0
            day_event_time = (cohort.event_time[index].unsqueeze(-1) + offset)[keep]
            day_delay_time = lower[keep]
            day_delay_width = torch.where(width > 0, day_lag + width - lower, width)[keep]
            day_weight = prob[keep]
            day_x = cohort.x[index].unsqueeze(1).expand(-1, offset.shape[1], -1)[keep]
        n_day = len(day_weight)

        with_widths = cohort.event_width is not None or cohort.delay_width is not None
        return cls(
            torch.cat([cohort.event_time[plain], day_event_time, cohort.exposure[unrep], t_imp]),
            torch.cat([one.expand(n_plain + n_day), zeros(n_unrep), one.expand(n_imp)]),
            torch.cat([one.expand(n_plain), day_weight, no_event, one.expand(n_imp) / draws]),
            torch.cat([cohort.x[plain], day_x, cohort.x[unrep], cohort.x[subj]]),
            torch.cat([cohort.delay[plain], day_delay_time, lag]),
            torch.cat([one.expand(n_plain + n_day), zeros(n_imp)]),
            torch.cat([one.expand(n_plain), day_weight, one.expand(n_imp) / draws]),
            torch.cat([cohort.x[plain], day_x, cohort.x[subj]]),
            None,  # every event row is exact: day-known events are split into their nodes
            torch.cat([plain_delay_width, day_delay_width, zeros(n_imp)]) if with_widths else None,
        )

    @classmethod
    def concat(cls, parts: list[MonteCarloRows]) -> MonteCarloRows:
        """Rows of several subject chunks as one data set (the M-step sums over rows)."""
        first = parts[0]
        values = {}
        for name in first.__dataclass_fields__:
            pieces = [getattr(p, name) for p in parts]
            values[name] = None if pieces[0] is None else torch.cat(pieces)
        return cls(**values)


E_STEP_CHUNK = 16_384  # subjects per E-step chunk: [chunk, 256] grid + [chunk, M] draws


def e_step_rows(
    model: JointModel,
    blocks: Blocks,
    cohort: Cohort,
    draws: int,
    generator: torch.Generator,
    chunk: int = E_STEP_CHUNK,
) -> MonteCarloRows:
    """The E-step (Eqs. E1-E2) in bounded memory: subjects in chunks of ``chunk``, each chunk's
    draws turned into its Monte Carlo rows at once, so the peak holds one chunk's [chunk, G]
    posterior grid and [chunk, M] draws, never [N, M]. One chunk (N <= chunk) draws exactly
    what the unchunked sampler draws."""
    parts = []
    for begin in range(0, len(cohort), chunk):
        sub = cohort.subset(torch.arange(begin, min(begin + chunk, len(cohort))))
        z, t = sample_posterior(
            model, blocks["theta"], blocks["phi"], sub, draws, generator, blocks["gamma"]
        )
        day = model.day_posterior(blocks["theta"], blocks["phi"], sub, blocks["gamma"])
        parts.append(MonteCarloRows.build(sub, z, t, day))
    return MonteCarloRows.concat(parts)


def q_event(model: JointModel, b: Blocks, rows: MonteCarloRows) -> torch.Tensor:
    """Q_T of Eq. (Q) as a weighted right-censored log-likelihood (Eq. H4)."""
    return model.event.weighted_loglik(
        b["theta"],
        rows.event_time,
        rows.event_flag,
        rows.event_weight,
        rows.event_x,
        b["gamma"],
        rows.event_width,
    )


def q_delay(model: JointModel, b: Blocks, rows: MonteCarloRows) -> torch.Tensor:
    """Q_D of Eq. (Q) as a weighted right-censored log-likelihood (Eq. H4)."""
    return model.delay.weighted_loglik(
        b["phi"],
        rows.delay_time,
        rows.delay_flag,
        rows.delay_weight,
        rows.delay_x,
        0.0,
        rows.delay_width,
    )


@dataclass
class MCEMResult:
    blocks: Blocks
    iterations: int
    converged: bool
    trace: list[dict] = field(default_factory=list)


@dataclass
class MCEMSchedule:
    """Monte Carlo sample size M_k = min(max_draws, ceil(start_draws * growth^k)) and stopping."""

    start_draws: int = 20
    max_draws: int = 500
    growth: float = 1.5
    max_iter: int = 40
    tol: float = 5e-3
    patience: int = 3
    average_last: int = 5
    m_step_iter: int = 50

    def draws(self, k: int) -> int:
        return min(self.max_draws, math.ceil(self.start_draws * self.growth**k))


def mcem_iteration(
    model: JointModel,
    cohort: Cohort,
    blocks: Blocks,
    free: tuple[str, ...],
    draws: int,
    generator: torch.Generator,
    m_step_iter: int = 50,
    reduce=None,
    gamma_prior_sd: float | None = None,
) -> Blocks:
    """One E-step (Eqs. E1-E2) and one M-step (Eq. Q), warm-started at ``blocks``."""
    with torch.no_grad():
        rows = e_step_rows(model, blocks, cohort, draws, generator)
    n = len(cohort)
    event_free = tuple(k for k in free if k in ("theta", "gamma"))
    if event_free:
        blocks = lbfgs_maximize(
            lambda b: (q_event(model, b, rows) + log_prior(b, gamma_prior_sd)) / n,
            blocks,
            event_free,
            m_step_iter,
            reduce,
        )
    if "phi" in free:
        blocks = lbfgs_maximize(
            lambda b: q_delay(model, b, rows) / n, blocks, ("phi",), m_step_iter, reduce
        )
    return blocks


def fit_mcem(
    model: JointModel,
    cohort: Cohort,
    start: Blocks | None = None,
    free: tuple[str, ...] = ("theta", "phi"),
    schedule: MCEMSchedule | None = None,
    seed: int = 0,
    reduce=None,
    gamma_prior_sd: float | None = None,
) -> MCEMResult:
    """Monte Carlo EM for Eq. (M1) (module docstring): growing M, stopping rule, averaging."""
    schedule = schedule or MCEMSchedule()
    generator = torch.Generator().manual_seed(seed)
    blocks = start or default_start(model, cohort)
    history, trace, calm = [], [], 0
    converged = False
    for k in range(schedule.max_iter):
        draws = schedule.draws(k)
        new = mcem_iteration(
            model,
            cohort,
            blocks,
            free,
            draws,
            generator,
            schedule.m_step_iter,
            reduce,
            gamma_prior_sd,
        )
        change = max(float((new[b] - blocks[b]).abs().max()) for b in free)
        blocks = new
        history.append(blocks)
        trace.append({"iteration": k, "draws": draws, "max_change": change})
        calm = calm + 1 if (change < schedule.tol and draws == schedule.max_draws) else 0
        if calm >= schedule.patience:
            converged = True
            break
    last = history[-schedule.average_last :]
    averaged = {b: torch.stack([h[b] for h in last]).mean(0) for b in blocks}
    return MCEMResult(averaged, len(history), converged, trace)
