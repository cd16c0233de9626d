"""The claim experiment's studies (plumbing around core/fitting/transfer/baselines).

- ``simulation_study``: known truth; every estimator's target timely risk at several target
  windows; bias and RMSE over replications; MCEM vs direct on the first replications.
- ``consistency_study``: parameter RMSE of the joint fit as n grows.
- ``bootstrap_interval``: nonparametric bootstrap (both stages resampled) of the timely risk.
- ``rossi_study``: semi-synthetic study on lifelines' ``load_rossi`` (real covariates and arrest
  times; simulated enrolment calendar and reporting delays).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from papers_eval import bootstrap_ci
from survival_delay import baselines
from survival_delay.core import Cohort, JointModel
from survival_delay.fitting import Blocks, MCEMSchedule, fit_direct
from survival_delay.simulate import Truth, observe, simulate_cohort
from survival_delay.transfer import fit_joint, mean_risk, transfer

PRACTICAL = ("naive", "naive_transfer", "ipw", "target_only", "source_only", "transfer")
ESTIMATORS = (*PRACTICAL, "oracle")


def _safe(fn: Callable[[], float]) -> float:
    """An estimator that fails numerically (e.g. no events in a tiny window) counts as NaN."""
    try:
        value = float(fn())
    except (RuntimeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def estimate_all(
    model: JointModel,
    source: Cohort,
    target: Cohort,
    oracle_cohort: Cohort,
    horizon: float,
    source_blocks: Blocks,
    naive_source: Blocks,
) -> dict[str, float]:
    """Every estimator's mean timely risk of the target cohort (source fits given)."""
    x = target.x

    def risk(blocks_fn):
        return lambda: mean_risk(model, blocks_fn(), x, horizon)

    def naive_transfer():
        ones = torch.ones(len(target), dtype=torch.float64)
        return baselines._event_only_fit(model, target, ones, naive_source, ("gamma",))

    fitted = transfer(model, source, target, horizon, source_blocks=source_blocks)
    out = {
        "naive": _safe(risk(lambda: baselines.naive(model, target))),
        "naive_transfer": _safe(risk(naive_transfer)),
        "ipw": _safe(risk(lambda: baselines.ipw(model, target, source_blocks["phi"]))),
        "target_only": _safe(risk(lambda: baselines.target_only(model, target))),
        "source_only": _safe(risk(lambda: source_blocks)),
        "transfer": fitted.mean_risk,
        "oracle": _safe(risk(lambda: baselines.oracle(model, oracle_cohort))),
    }
    out["transfer_ibnr"] = fitted.ibnr
    out["transfer_gamma"] = float(fitted.target["gamma"])
    return out


def summarise(errors: dict[str, list[float]], seed: int = 0) -> dict[str, dict]:
    """Bias and RMSE (with percentile-bootstrap intervals over replications) per estimator."""
    out = {}
    for name, values in errors.items():
        e = np.asarray(values, dtype=float)
        ok = e[np.isfinite(e)]
        if ok.size == 0:
            out[name] = {"bias": math.nan, "rmse": math.nan, "failed": int(e.size)}
            continue
        bias_ci = bootstrap_ci(ok, seed=seed, n_resamples=1000)
        rmse_ci = bootstrap_ci(
            ok, lambda v: float(np.sqrt(np.mean(v**2))), seed=seed, n_resamples=1000
        )
        out[name] = {
            "bias": {"mean": float(ok.mean()), "ci": list(bias_ci)},
            "rmse": {"mean": float(np.sqrt(np.mean(ok**2))), "ci": list(rmse_ci)},
            "failed": int(e.size - ok.size),
        }
    return out


def simulation_study(
    reps: int,
    windows: tuple[float, ...],
    truth: Truth,
    n_source: int = 3000,
    n_target: int = 1000,
    mcem_reps: int = 0,
    schedule: MCEMSchedule | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict:
    """Replications with one source and one target per window; errors vs the true mean risk."""
    model = JointModel.build(len(truth.beta))
    errors = {w: {e: [] for e in ESTIMATORS} for w in windows}
    ibnr = {w: [] for w in windows}
    agreement = {w: [] for w in windows}
    theta_gap, mcem_seconds = [], []
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        source = simulate_cohort(n_source, (1.0, 3.0), truth, 0.0, rng)
        source_blocks = fit_direct(model, source.cohort)
        naive_source = baselines.naive(model, source.cohort)
        mcem_source = None
        if r < mcem_reps:
            start = time.perf_counter()
            mcem_source = fit_joint(model, source.cohort, "mcem", schedule=schedule, seed=r)
            mcem_seconds.append(time.perf_counter() - start)
            theta_gap.append(
                max(
                    float((mcem_source[b] - source_blocks[b]).abs().max()) for b in ("theta", "phi")
                )
            )
        for w in windows:
            target = simulate_cohort(n_target, (0.0, w), truth, truth.gamma, rng)
            truth_risk = float(target.true_risk.mean())
            est = estimate_all(
                model,
                source.cohort,
                target.cohort,
                target.oracle_cohort(truth.horizon),
                truth.horizon,
                source_blocks,
                naive_source,
            )
            for e in ESTIMATORS:
                errors[w][e].append(est[e] - truth_risk)
            ibnr[w].append(est["transfer_ibnr"] - target.ibnr)
            if mcem_source is not None:
                mc = transfer(
                    model,
                    source.cohort,
                    target.cohort,
                    truth.horizon,
                    "mcem",
                    mcem_source,
                    schedule,
                    seed=r,
                )
                agreement[w].append(mc.mean_risk - est["transfer"])
        log(f"replication {r + 1}/{reps} done")
    result = {}
    for w in windows:
        result[w] = {
            "estimators": summarise(errors[w], seed),
            "ibnr_error": {"mean": float(np.mean(ibnr[w])), "mae": float(np.mean(np.abs(ibnr[w])))},
            "mcem_minus_direct_risk": [float(v) for v in agreement[w]],
        }
    return {
        "windows": result,
        "mcem_source_param_gap": theta_gap,
        "mcem_source_seconds": mcem_seconds,
        "raw_errors": {str(w): errors[w] for w in windows},
    }


def consistency_study(
    sizes: tuple[int, ...], reps: int, truth: Truth, seed: int = 0
) -> dict[int, float]:
    """Root mean squared error of (theta, phi) of the direct joint fit, per cohort size n.

    Cohorts have windows U(0, 3) years, so every subject type (short and long windows, reported
    and unreported) is present; the estimator is the MLE of Eq. (M1), consistent as n grows.
    """
    model = JointModel.build(len(truth.beta))
    target = torch.cat([truth.theta(), truth.phi()])
    out = {}
    for n in sizes:
        sq = []
        for r in range(reps):
            sim = simulate_cohort(n, (0.0, 3.0), truth, 0.0, np.random.default_rng([seed, n, r]))
            b = fit_direct(model, sim.cohort)
            sq.append(float((torch.cat([b["theta"], b["phi"]]) - target).square().mean()))
        out[n] = float(np.sqrt(np.mean(sq)))
    return out


def bootstrap_interval(
    model: JointModel,
    source: Cohort,
    target: Cohort,
    horizon: float,
    resamples: int,
    seed: int = 0,
    source_blocks: Blocks | None = None,
) -> tuple[float, float, float]:
    """Point estimate and 95% percentile interval of the transfer timely risk.

    Both stages are refitted on each resample (subjects drawn with replacement within the
    source and within the target), warm-started at the full-data fit.
    """
    full = transfer(model, source, target, horizon, source_blocks=source_blocks)
    g = torch.Generator().manual_seed(seed)
    draws = []
    for _ in range(resamples):
        s_idx = torch.randint(len(source), (len(source),), generator=g)
        t_idx = torch.randint(len(target), (len(target),), generator=g)
        src_b = fit_direct(model, source.subset(s_idx), full.source)
        draws.append(
            _safe(
                lambda src_b=src_b, t_idx=t_idx: (
                    transfer(
                        model, source, target.subset(t_idx), horizon, source_blocks=src_b
                    ).mean_risk
                )
            )
        )
    ok = np.asarray([d for d in draws if math.isfinite(d)])
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return full.mean_risk, float(lo), float(hi)


def bootstrap_coverage(
    reps: int,
    window: float,
    resamples: int,
    truth: Truth,
    n_source: int = 3000,
    n_target: int = 1000,
    seed: int = 0,
) -> dict:
    """Share of replications whose bootstrap 95% interval covers the true mean timely risk."""
    model = JointModel.build(len(truth.beta))
    covered, widths = [], []
    for r in range(reps):
        rng = np.random.default_rng([seed, 7, r])
        source = simulate_cohort(n_source, (1.0, 3.0), truth, 0.0, rng)
        target = simulate_cohort(n_target, (0.0, window), truth, truth.gamma, rng)
        _, lo, hi = bootstrap_interval(
            model, source.cohort, target.cohort, truth.horizon, resamples, seed + r
        )
        risk = float(target.true_risk.mean())
        covered.append(lo <= risk <= hi)
        widths.append(hi - lo)
    return {
        "window": window,
        "replications": reps,
        "resamples": resamples,
        "coverage": float(np.mean(covered)),
        "mean_width": float(np.mean(widths)),
    }


# ---------------------------------------------------------------- semi-synthetic: rossi
ROSSI_COVARIATES = ("fin", "age", "race", "wexp", "mar", "paro", "prio")


def rossi_cohorts(
    draw: int,
    target_window: float = 13.0,
    horizon: float = 52.0,
    delay_shape: float = 1.2,
    delay_scale: float = 6.0,
) -> dict:
    """One draw of the semi-synthetic calendar on lifelines' rossi data (times in weeks).

    Enrolment order follows prio + noise (later enrollees have more prior convictions, a cohort
    drift); the first 3/4 are the source, enrolled uniformly in calendar weeks [0, 65]; the last
    1/4 are the target, enrolled uniformly in the ``target_window`` weeks before tau = 130.
    Reporting delays are Weibull(shape 1.2, scale 6 weeks). T = the real arrest week (events
    after week 52 are not observed in rossi, which matches coverage L = 52).
    """
    from lifelines.datasets import load_rossi

    df = load_rossi()
    rng = np.random.default_rng([2024, draw])
    x = df[list(ROSSI_COVARIATES)].to_numpy(float)
    x = (x - x.mean(0)) / x.std(0)
    prio = x[:, ROSSI_COVARIATES.index("prio")]
    order = np.argsort(prio + 0.5 * rng.standard_normal(len(df)))
    n_target = len(df) // 4
    source_idx, target_idx = order[:-n_target], order[-n_target:]
    t = np.where(df["arrest"].to_numpy() == 1, df["week"].to_numpy(float), np.inf)
    d = delay_scale * rng.weibull(delay_shape, len(df))
    tau = 130.0
    enrol = np.empty(len(df))
    enrol[source_idx] = rng.uniform(0, 65, len(source_idx))
    enrol[target_idx] = rng.uniform(tau - target_window, tau, n_target)
    window = tau - enrol
    exposure = np.minimum(window, horizon)
    t_obs = np.where(np.isfinite(t), t, 1e9)

    def cohort(idx):
        return observe(x[idx], t_obs[idx], d[idx], window[idx], exposure[idx])

    full = Cohort(
        torch.as_tensor(x[target_idx]),
        torch.full((n_target,), 1e6, dtype=torch.float64),
        torch.full((n_target,), horizon, dtype=torch.float64),
        torch.as_tensor(np.isfinite(t[target_idx])),
        torch.as_tensor(np.where(np.isfinite(t[target_idx]), t[target_idx], np.nan)),
        torch.as_tensor(np.where(np.isfinite(t[target_idx]), 0.0, np.nan)),
    )
    return {
        "source": cohort(source_idx),
        "target": cohort(target_idx),
        "oracle": full,
        "observed_risk": float(np.isfinite(t[target_idx]).mean()),
        "frame": df,
        "x": x,
        "source_idx": source_idx,
        "target_idx": target_idx,
    }


def _cox_naive(data: dict, horizon: float) -> float:
    """lifelines Cox PH on the target's reported events, others censored at c' (reference)."""
    import pandas as pd

    target = data["target"]
    frame = pd.DataFrame(target.x.numpy(), columns=list(ROSSI_COVARIATES))
    rep = target.reported.numpy()
    frame["duration"] = np.where(rep, target.event_time.numpy(), target.exposure.numpy())
    frame["event"] = rep.astype(int)
    frame = frame[frame["duration"] > 0]
    x_pred = pd.DataFrame(target.x.numpy(), columns=list(ROSSI_COVARIATES))
    return baselines.cox_mean_risk(frame, x_pred, horizon, "duration", "event")


def rossi_study(
    draws: int,
    windows: tuple[float, ...] = (13.0, 26.0),
    horizon: float = 52.0,
    mcem_draws: int = 0,
    schedule: MCEMSchedule | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Errors of each estimator's target risk vs the target's observed 52-week arrest rate."""
    model = JointModel.build(len(ROSSI_COVARIATES))
    names = (*ESTIMATORS, "cox_naive", "transfer_mcem")
    result = {}
    for w in windows:
        errors = {e: [] for e in names}
        observed = []
        for k in range(draws):
            data = rossi_cohorts(k, w, horizon)
            source_blocks = fit_direct(model, data["source"])
            naive_source = baselines.naive(model, data["source"])
            est = estimate_all(
                model,
                data["source"],
                data["target"],
                data["oracle"],
                horizon,
                source_blocks,
                naive_source,
            )
            est["cox_naive"] = _safe(lambda data=data: _cox_naive(data, horizon))
            est["transfer_mcem"] = math.nan
            if k < mcem_draws:
                est["transfer_mcem"] = _safe(
                    lambda data=data: (
                        transfer(
                            model,
                            data["source"],
                            data["target"],
                            horizon,
                            "mcem",
                            schedule=schedule,
                            seed=k,  # noqa: B023 (called at once, inside the loop)
                        ).mean_risk
                    )
                )
            for e in names:
                if e != "transfer_mcem" or k < mcem_draws:
                    errors[e].append(est[e] - data["observed_risk"])
            observed.append(data["observed_risk"])
        summary = summarise(errors)
        if mcem_draws == 0:
            summary.pop("transfer_mcem")
        result[w] = {"estimators": summary, "observed_risk_mean": float(np.mean(observed))}
        log(f"rossi window {w:g} weeks done")
    return result
