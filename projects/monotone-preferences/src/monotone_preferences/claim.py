"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

Claim: the reconstructed robust estimator (cross-fitted choice between NNLS and multivariate
isotonic LSE) stays within a stated factor of OLS/NNLS when evaluators are linear, beats them on
non-linear monotone evaluators at the largest n while its error still falls with n, selects the
top 10% and signs criterion importance better than OLS there, and is never worse than OLS on
real tables beyond a tolerance.

Each seed draws the whole simulation grid (family x n x d x rho; test points scored against the
noiseless f) and one 5-fold cross-validation split of every real table. Subjects:

- ``robust`` (the method), baselines ``ols``, ``nnls``, ``additive`` (isotonic backfitting),
  ``hgb_monotone``, ``monotone_net`` (positive weights, torch), ``isotonic``, ``hgb``
  (unconstrained accuracy reference), ``l11_erm`` (Noothigattu et al.);
- negative controls: each branch alone (``nnls`` on the non-linear checks, ``isotonic`` on the
  linear one); positive control ``oracle``: NNLS on the family's true features (on real tables,
  where no truth is known, it is OLS and is not judged there).

Precondition (shown first, computed): OLS's excess error on non-linear families at the largest n
stays above the oracle's by ``settings.precondition_floor``; otherwise the verdict is not shown.
Logistic and ordinal-logit are scored in a side study of decisions and grades (evidence).
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from threadpoolctl import threadpool_limits

from monotone_preferences.baselines import (
    L11ERM,
    OLS,
    AdditiveIsotonic,
    Boosting,
    FamilyOracle,
    Logistic,
    MonotoneNetRegressor,
    OrdinalLogit,
)
from monotone_preferences.core import (
    CrossFitRobust,
    IsotonicRegressor,
    NonNegativeLinear,
    advice_agreement,
    criterion_effects,
    excess_error,
    fold_ids,
    ordered_pairs,
    top_k_precision,
    violation_rate,
)
from monotone_preferences.data import load_rdataset
from monotone_preferences.simulate import FAMILIES, preference, reference_sd, simulate
from papers_cli import project_dir_of, reproduce_parser
from papers_eval import judge, load_claim_spec, run_seeds, tune, write_claim
from papers_eval.stats import contrast_interval

CLAIM_FILE = project_dir_of(__file__) / "configs" / "claim.yaml"
SUBJECTS = (
    "robust", "ols", "nnls", "additive", "hgb_monotone", "monotone_net", "isotonic", "hgb",
    "l11_erm", "oracle",
)  # fmt: skip
REAL = ("satgpa", "usjudgeratings", "creditcard")
METRICS = (
    "linear_excess",
    "nonlinear_excess_nmax",
    "nonlinear_decline",
    "top10_precision",
    "sign_flip_rate",
    *(f"real_sq_error_{name}" for name in REAL),
    "val_mse",
)


def make_subject(
    subject: str, params: dict[str, Any], seed: int, family: str | None, net_steps: int = 200
) -> Any:
    """A fresh estimator for ``subject`` with its tuned ``params``."""
    if subject == "robust":
        return CrossFitRobust(folds=5, seed=seed, **params)
    if subject == "ols":
        return OLS()
    if subject == "nnls":
        return NonNegativeLinear()
    if subject == "isotonic":
        return IsotonicRegressor()
    if subject == "additive":
        return AdditiveIsotonic(**params)
    if subject == "hgb_monotone":
        return Boosting(monotone=True, seed=seed, **params)
    if subject == "hgb":
        return Boosting(monotone=False, seed=seed, **params)
    if subject == "monotone_net":
        return MonotoneNetRegressor(seed=seed, steps=net_steps, **params)
    if subject == "l11_erm":
        return L11ERM()
    if subject == "oracle":
        return FamilyOracle(family) if family else OLS()
    raise KeyError(subject)


def fit_all(
    x: np.ndarray,
    y: np.ndarray,
    best: dict[str, dict],
    seed: int,
    family: str | None,
    net_steps: int,
) -> dict[str, Any]:
    """Every subject fitted on (x, y); both branches are shared with the robust fit (NNLS and
    isotonic refitted on all rows are exactly the negative controls)."""
    fitted = {"robust": make_subject("robust", best["robust"], seed, family).fit(x, y)}
    fitted["nnls"] = fitted["robust"].fitted_["linear"]
    fitted["isotonic"] = fitted["robust"].fitted_["isotonic"]
    for subject in SUBJECTS:
        if subject not in fitted:
            model = make_subject(subject, best.get(subject, {}), seed, family, net_steps)
            fitted[subject] = model.fit(x, y)
    return fitted


# --------------------------------------------------------------------------- one grid cell
def run_cell(
    family: str, n: int, d: int, rho: float, seed: int, settings: dict, best: dict
) -> dict[str, dict[str, Any]]:
    """Fit every subject on one simulated evaluator; score on fresh test points vs the truth."""
    sd = reference_sd(family, d, rho)
    cell_seed = seed * 1_000_003 + zlib.crc32(f"{family}|{n}|{d}|{rho}".encode()) % 100_000
    sim = simulate(family, n + settings["n_test"], d, rho, settings["noise"], cell_seed, sd_f=sd)
    x, y = sim.x[:n], sim.y[:n]
    x_test, f_test = sim.x[n:], sim.f[n:]
    fitted = fit_all(x, y, best, seed, family, settings["net_steps"])
    step = np.full(d, settings["effect_step"])
    true_effects = criterion_effects(lambda z: preference(family, z), x_test, step)
    low, high = ordered_pairs(x_test, 2000, np.random.default_rng(cell_seed))
    out = {}
    for subject, model in fitted.items():
        prediction = model.predict(x_test)
        effects = criterion_effects(model.predict, x_test, step)
        out[subject] = {
            "excess": excess_error(prediction, f_test, sd**2),
            "top10": top_k_precision(prediction, f_test, 0.1),
            "sign_flip": float(np.mean(np.sign(effects.mean(0)) == -np.sign(true_effects.mean(0)))),
            "advice": advice_agreement(effects, true_effects),
            "importance_order": _rank_corr(effects.mean(0), true_effects.mean(0)),
            "violations": violation_rate(model.predict, low, high),
        }
    out["robust"]["weight_linear"] = fitted["robust"].weights_["linear"]
    return out


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


# ------------------------------------------------------------------------------ real tables
def real_table_errors(
    name: str, seed: int, settings: dict, best: dict
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """K-fold held-out squared errors per row (y standardised) of every subject on one table,
    plus the robust fit's weight on the linear branch averaged over folds."""
    table = load_rdataset(name)
    x, y = table.x, (table.y - table.y.mean()) / table.y.std()
    limit = settings.get("real_max_rows")
    if limit and len(y) > limit:
        keep = np.sort(np.random.default_rng(0).choice(len(y), limit, replace=False))
        x, y = x[keep], y[keep]
    x = (x - x.mean(0)) / (x.std(0) + 1e-12)  # monotone per column: the order is unchanged
    folds = settings["real_folds"]
    ids = fold_ids(len(y), folds, seed)
    errors = {s: np.zeros(len(y)) for s in SUBJECTS}
    weights = []
    for k in range(folds):
        train, held = ids != k, ids == k
        fitted = fit_all(x[train], y[train], best, seed, None, settings["net_steps"])
        weights.append(fitted["robust"].weights_["linear"])
        for subject, model in fitted.items():
            errors[subject][held] = (model.predict(x[held]) - y[held]) ** 2
    extra = {"weight_linear": float(np.mean(weights)), "n": len(y), "d": x.shape[1]}
    if table.kind == "binary":  # the logistic baseline on decisions (Brier score)
        brier = np.zeros(len(y))
        labels = table.y if not limit or len(table.y) <= limit else table.y[keep]
        for k in range(folds):
            train, held = ids != k, ids == k
            p = Logistic().fit(x[train], labels[train]).predict(x[held])
            brier[held] = (p - labels[held]) ** 2
        extra["logistic_brier"] = float(brier.mean())
        extra["robust_brier"] = float(errors["robust"].mean() * table.y.var())
    return errors, extra


# ------------------------------------------------------------- decisions and grades (side)
def outcome_side_study(seed: int, settings: dict, best: dict) -> dict[str, dict[str, float]]:
    """Threshold evaluator (n = settings.side_n, d = 2, rho = 0.6) whose output is a yes/no
    decision y ~ Bernoulli(f) or a 5-level grade round(4 f): excess error of each learner's
    estimate of E[y | x] (logistic / ordinal-logit vs robust vs OLS)."""
    n, m = settings["side_n"], settings["n_test"]
    rng = np.random.default_rng(seed + 77)
    sim = simulate("threshold", n + m, 2, 0.6, 0.0, seed + 77)
    p = 0.05 + 0.9 * sim.f  # a probability in (0, 1), monotone in x
    out = {}
    decision = (rng.uniform(size=n + m) < p).astype(float)
    grade = np.clip(np.round(4 * p + rng.normal(0, 0.5, n + m)), 0, 4)
    expected_grade = sum(
        k * _grade_prob(4 * p, k) for k in range(5)
    )  # E[grade | x] under the rounding noise
    for kind, y, target, linear_model in (
        ("decision", decision, p, Logistic()),
        ("grade", grade, expected_grade, OrdinalLogit()),
    ):
        scale = float(target.var())
        x_train, x_test = sim.x[:n], sim.x[n:]
        models = {
            "robust": make_subject("robust", best["robust"], seed, None),
            "ols": OLS(),
            "linear_link": linear_model,
        }
        out[kind] = {
            name: float(
                excess_error(model.fit(x_train, y[:n]).predict(x_test), target[n:], scale).mean()
            )
            for name, model in models.items()
        }
    return out


def _grade_prob(mean: np.ndarray, k: int, sd: float = 0.5) -> np.ndarray:
    """P(clip(round(mean + N(0, sd^2)), 0, 4) == k)."""
    from scipy.stats import norm

    lo = -np.inf if k == 0 else (k - 0.5 - mean) / sd
    hi = np.inf if k == 4 else (k + 0.5 - mean) / sd
    return norm.cdf(hi) - norm.cdf(lo)


# -------------------------------------------------------------------------- the whole seed
def run_seed_grid(seed: int, settings: dict, best: dict) -> dict[str, Any]:
    """Every cell and every real table for one seed; returns per-subject metrics + diagnostics."""
    grid = [
        (family, n, d, rho)
        for family in settings["families"]
        for n in settings["n"]
        for d in settings["d"]
        for rho in settings["rho"]
    ]
    cells = {key: run_cell(*key, seed, settings, best) for key in grid}
    n_max, n_prev = settings["n"][-1], settings["n"][-2]
    nonlinear = [f for f in settings["families"] if f != "linear"]

    def gather(subject: str, what: str, keep: Callable) -> list:
        return [cells[key][subject][what] for key in grid if keep(key)]

    metrics: dict[str, dict[str, Any]] = {}
    for subject in SUBJECTS:
        at_max = lambda k: k[0] in nonlinear and k[1] == n_max  # noqa: E731
        at_prev = lambda k: k[0] in nonlinear and k[1] == n_prev  # noqa: E731
        excess_max = np.concatenate(gather(subject, "excess", at_max))
        excess_prev = np.concatenate(gather(subject, "excess", at_prev))
        metrics[subject] = {
            "linear_excess": np.concatenate(gather(subject, "excess", lambda k: k[0] == "linear")),
            "nonlinear_excess_nmax": excess_max,
            "nonlinear_decline": float(excess_max.mean() / excess_prev.mean()),
            "top10_precision": np.array(gather(subject, "top10", at_max)),
            "sign_flip_rate": np.array(gather(subject, "sign_flip", lambda k: k[0] in nonlinear)),
            "advice_agreement": np.array(gather(subject, "advice", at_max)),
            "violation_rate": np.array(gather(subject, "violations", lambda k: True)),
        }
    real_extra = {}
    for name in settings["real"]:
        errors, extra = real_table_errors(name, seed, settings, best)
        real_extra[name] = extra
        for subject in SUBJECTS:
            source = "ols" if subject == "oracle" else subject
            metrics[subject][f"real_sq_error_{name}"] = errors[source]
    per_cell = {
        "|".join(map(str, key)): {s: float(v["excess"].mean()) for s, v in cells[key].items()}
        for key in grid
    }
    weights = {"|".join(map(str, key)): cells[key]["robust"]["weight_linear"] for key in grid}
    importance = {
        s: float(np.nanmean(gather(s, "importance_order", lambda k: k[0] in nonlinear)))
        for s in SUBJECTS
    }
    return {
        "metrics": metrics,
        "per_cell_excess": per_cell,
        "robust_weight_linear": weights,
        "importance_order": importance,
        "real": real_extra,
        "side": outcome_side_study(seed, settings, best),
    }


# ---------------------------------------------------------------------------------- tuning
def validation_score(subject: str, params: dict, seed: int, settings: dict) -> float:
    """Mean over families of held-out MSE on observed y / Var f (a validation draw at
    n = settings.tuning_n, d = 4, rho = 0.6, from a seed no test cell uses)."""
    scores = []
    for i, family in enumerate(FAMILIES):
        sd = reference_sd(family, 4, 0.6)
        sim = simulate(family, 2 * settings["tuning_n"], 4, 0.6, settings["noise"],
                       10_000 + seed * 10 + i, sd_f=sd)  # fmt: skip
        n = settings["tuning_n"]
        model = make_subject(subject, params, seed, family, settings["net_steps"])
        model = model.fit(sim.x[:n], sim.y[:n])
        scores.append(np.mean((model.predict(sim.x[n:]) - sim.y[n:]) ** 2) / sd**2)
    return float(np.mean(scores))


# -------------------------------------------------------------------------------- the claim
def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every seed's grid, check the precondition, judge, write."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    settings = dict(spec.settings)
    # Small fits: one thread each is fastest (and does not fight the other process on 2 cores).
    torch.set_num_threads(1)
    limits = threadpool_limits(1)
    tuning = tune(spec, lambda s, p, seed: validation_score(s, p, seed, settings))
    best = {s: dict(tuning.best.get(s, {})) for s in SUBJECTS}
    per_seed: dict[int, dict[str, Any]] = {}
    val_scores = {s: validation_score(s, best[s], spec.seeds[0], settings) for s in SUBJECTS}

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        if seed not in per_seed:
            per_seed[seed] = run_seed_grid(seed, settings, best)
        values = per_seed[seed]["metrics"][subject]
        return {**values, "val_mse": val_scores[subject]}

    results = run_seeds(spec, run_one)
    judgement = judge(spec, results)
    precondition = check_precondition(spec, results, settings["precondition_floor"])
    if not precondition["held"]:
        judgement = dataclasses.replace(
            judgement,
            verdict="not shown",
            reason=f"precondition failed: {precondition['text']}; " + judgement.reason,
        )
    limits.unregister()
    figures = make_plots(args.out, per_seed, settings, results)
    evidence = summarise_evidence(per_seed, settings, precondition)
    write_claim(
        args.out,
        project="monotone-preferences",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence=evidence,
        notes=notes_text(evidence),
        figures=figures,
    )
    return {"verdict": judgement.verdict, "results": results, "evidence": evidence}


def check_precondition(spec, results, floor: float) -> dict[str, Any]:
    """OLS's non-linear excess error at the largest n minus the oracle's: its interval's lower
    bound must exceed ``floor`` (OLS stays above what a correctly specified model reaches)."""
    interval = contrast_interval(
        [(1.0, results["ols"]["nonlinear_excess_nmax"]),
         (-1.0, results["oracle"]["nonlinear_excess_nmax"])],
        confidence=spec.confidence,
    )  # fmt: skip
    held = bool(np.isfinite(interval.low) and interval.low > floor)
    text = (
        f"OLS minus oracle excess error on non-linear families at the largest n = "
        f"{interval.estimate:.4f} [{interval.low:.4f}, {interval.high:.4f}] vs floor {floor}"
    )
    return {"held": held, "text": text, "interval": interval.as_dict()}


def summarise_evidence(per_seed: dict, settings: dict, precondition: dict) -> dict[str, Any]:
    """Diagnostics averaged over seeds: the branch weight per family and n, violation rates,
    importance order, counterfactual advice, the real tables' choices, the side study."""
    seeds = list(per_seed)
    weight = {}
    for family in settings["families"]:
        for n in settings["n"]:
            values = [
                w
                for s in seeds
                for key, w in per_seed[s]["robust_weight_linear"].items()
                if key.startswith(f"{family}|{n}|")
            ]
            weight[f"{family} n={n}"] = round(float(np.mean(values)), 3)
    mean_over = lambda f: {  # noqa: E731
        subject: round(float(np.mean([f(per_seed[s], subject) for s in seeds])), 4)
        for subject in SUBJECTS
    }
    real = {
        name: {
            key: round(float(np.mean([per_seed[s]["real"][name][key] for s in seeds])), 4)
            for key in per_seed[seeds[0]]["real"][name]
        }
        for name in settings["real"]
    }
    side = {
        kind: {
            m: round(float(np.mean([per_seed[s]["side"][kind][m] for s in seeds])), 4)
            for m in per_seed[seeds[0]]["side"][kind]
        }
        for kind in per_seed[seeds[0]]["side"]
    }
    return {
        "precondition": precondition,
        "robust_weight_on_linear_branch": weight,
        "violation_rate": mean_over(lambda r, s: r["metrics"][s]["violation_rate"].mean()),
        "advice_agreement_nmax": mean_over(lambda r, s: r["metrics"][s]["advice_agreement"].mean()),
        "importance_rank_corr": mean_over(lambda r, s: r["importance_order"][s]),
        "real_tables": real,
        "decisions_and_grades_excess": side,
    }


def notes_text(evidence: dict) -> str:
    lines = [
        "Precondition: "
        + ("held" if evidence["precondition"]["held"] else "FAILED")
        + " ("
        + evidence["precondition"]["text"]
        + ").",
        "Robust estimator is a RECONSTRUCTION (cross-fitted choice NNLS vs isotonic LSE); the "
        "paper's algorithm was not readable.",
        "Weight on the linear branch (mean over seeds, d, rho): "
        + ", ".join(f"{k}: {v}" for k, v in evidence["robust_weight_on_linear_branch"].items()),
        "Monotonicity-violation rate on random ordered pairs: "
        + ", ".join(f"{k}: {v}" for k, v in evidence["violation_rate"].items()),
        "Decisions / grades side study (excess error of E[y|x], threshold evaluator): "
        + "; ".join(
            f"{kind}: " + ", ".join(f"{m} {v}" for m, v in vals.items())
            for kind, vals in evidence["decisions_and_grades_excess"].items()
        ),
        "Real tables (robust weight on linear, sizes, logistic vs robust Brier on decisions): "
        + "; ".join(f"{k}: {v}" for k, v in evidence["real_tables"].items()),
    ]
    return "\n".join(lines)


def make_plots(out: str | Path, per_seed: dict, settings: dict, results: dict) -> list[str]:
    """error_vs_n.png (per family, method) and selection_signs.png (top-10%, sign flips)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shown = ("robust", "ols", "nnls", "isotonic", "hgb_monotone", "additive", "oracle")
    families = settings["families"]
    fig, axes = plt.subplots(1, len(families), figsize=(4 * len(families), 3.4), squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        for subject in shown:
            means = []
            for n in settings["n"]:
                values = [
                    cell[subject]
                    for s in per_seed
                    for key, cell in per_seed[s]["per_cell_excess"].items()
                    if key.startswith(f"{family}|{n}|")
                ]
                means.append(np.mean(values))
            ax.plot(settings["n"], means, marker="o", label=subject)
        ax.set(xscale="log", yscale="log", title=family, xlabel="n", ylabel="excess error / Var f")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "error_vs_n.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    names = list(SUBJECTS)
    for ax, metric, label in (
        (axes[0], "top10_precision", "top-10% precision (non-linear, largest n)"),
        (axes[1], "sign_flip_rate", "share of criteria with a flipped sign (non-linear)"),
    ):
        values = [np.mean([np.mean(v) for v in results[s][metric]]) for s in names]
        ax.bar(names, values)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "selection_signs.png", dpi=110)
    plt.close(fig)
    return ["error_vs_n.png", "selection_signs.png"]


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()
