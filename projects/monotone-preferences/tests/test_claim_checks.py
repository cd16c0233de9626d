"""The claim's statistics and wiring by value: the per-cell log decline, which cells each checked
metric pools, the in-fold standardisation and the logistic rival on the real tables, the
diagnosis, and the job runner (worker count and cache)."""

import math

import numpy as np
import pytest

from monotone_preferences import claim
from monotone_preferences.baselines import OLS, FamilyOracle, Logistic
from monotone_preferences.core import fold_ids
from monotone_preferences.data import load_rdataset
from monotone_preferences.simulate import simulate
from papers_eval import load_claim, load_claim_spec
from papers_eval.diagnosis import validate

SETTINGS = {"families": ["linear", "min", "mild"], "n": [100, 300, 800], "d": [2, 4],
            "rho": [0.0]}  # fmt: skip


def hand_made_cells(error_of) -> dict:
    """Cells whose every subject has the constant per-point error error_of(key)."""
    cells = {}
    for key in claim.grid_of(SETTINGS):
        base = {"excess": np.full(4, error_of(key)), "top10": 0.5, "advice": 0.25,
                "sign_flip": 0.0, "importance_order": 1.0, "violations": 0.0}  # fmt: skip
        cells[key] = {s: dict(base) for s in claim.SUBJECTS}
    return cells


def registered_spec():
    return load_claim_spec(
        claim.CLAIM_FILE, subjects=claim.SUBJECTS, metrics=claim.METRICS, allow_dirty=True
    )


def test_log_decline_is_one_log_ratio_per_nonlinear_cell_by_hand():
    # error halves from n = 300 to n = 800 in min cells, falls by 10% in mild cells
    def error(key):
        family, n, d, _ = key
        scale = {100: 4.0, 300: 2.0, 800: 1.0} if family == "min" else {100: 1, 300: 1, 800: 0.9}
        return scale[n] * (2.0 if d == 4 else 1.0)

    cells = hand_made_cells(error)
    values = claim.log_decline(cells, "robust", 800, 300, ["min", "mild"])
    # sorted (family, d, rho): mild d2, mild d4, min d2, min d4
    np.testing.assert_allclose(values, [math.log(0.9)] * 2 + [math.log(0.5)] * 2)
    # the registered bar is log 0.9: a 10% fall sits exactly on it
    spec = registered_spec()
    check = next(c for c in spec.checks if c.name == "nonlinear_still_falling")
    assert check.threshold == pytest.approx(math.log(0.9), abs=1e-5)


def test_each_checked_metric_pools_the_cells_it_names():
    def error(key):  # encode the cell in its error: family code + n / 1000 + d / 10
        family, n, d, _ = key
        return {"linear": 0, "min": 10, "mild": 20}[family] + n / 1000 + d / 10

    metrics = claim.seed_metrics(hand_made_cells(error), SETTINGS)["robust"]

    def cells_of(metric):
        return set(np.unique(metrics[metric]).round(3).tolist())

    assert cells_of("linear_excess") == {0.3, 0.5, 0.7, 1.0, 1.2}  # every n and d
    assert cells_of("nonlinear_excess_nmax") == {11.0, 11.2, 21.0, 21.2}  # n = 800 only
    assert cells_of("nonlinear_excess_nmax_d4") == {11.2, 21.2}
    assert cells_of("mild_excess_nmax") == {21.0, 21.2}
    assert len(metrics["nonlinear_log_decline"]) == 4  # (min, mild) x (d = 2, 4)
    assert len(metrics["top10_precision"]) == 4 and len(metrics["advice_agreement"]) == 4
    assert len(metrics["sign_flip_rate"]) == 12  # every n of the non-linear cells


def test_the_mild_family_oracle_is_exact_and_ols_is_not():
    sim = simulate("mild", 400, 4, 0.0, 0.0, seed=3)
    oracle = FamilyOracle("mild").fit(sim.x, sim.y)
    np.testing.assert_allclose(oracle.predict(sim.x), sim.f, atol=1e-8)
    residual = OLS().fit(sim.x, sim.y).predict(sim.x) - sim.f
    assert 0.05 < residual.var() / sim.f.var() < 0.25  # linear models keep 5-25% here


def test_real_tables_standardise_inside_each_fold_and_glm_is_logistic_on_decisions():
    settings = {"real_max_rows": 240, "real_folds": 3, "net_steps": 5}
    errors, extra = claim.real_table_errors("creditcard", 0, settings, {"robust": {}})
    table = load_rdataset("creditcard")
    keep = np.sort(np.random.default_rng(0).choice(len(table.y), 240, replace=False))
    x, y = table.x[keep], table.y[keep]
    ids = fold_ids(240, 3, 0)
    ols = np.zeros(240)
    logistic = np.zeros(240)
    for k in range(3):
        train, held = ids != k, ids == k
        sd = y[train].std()
        # OLS on the raw scale, scored on the training fold's standardised scale (affine
        # equivariance): the in-fold standardisation changes nothing for it
        ols[held] = ((OLS().fit(x[train], y[train]).predict(x[held]) - y[held]) / sd) ** 2
        x_mean, x_sd = x[train].mean(0), x[train].std(0)
        p = Logistic().fit((x[train] - x_mean) / x_sd, y[train]).predict((x[held] - x_mean) / x_sd)
        logistic[held] = (p - y[held]) ** 2 / sd**2
    np.testing.assert_allclose(errors["ols"], ols, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(errors["glm"], logistic, rtol=1e-6, atol=1e-9)
    assert 0.05 < extra["logistic_brier"] < 0.25 and not np.allclose(errors["glm"], errors["ols"])


def test_glm_is_ols_on_a_scored_table():
    settings = {"real_max_rows": None, "real_folds": 5, "net_steps": 5}
    errors, _ = claim.real_table_errors("usjudgeratings", 0, settings, {"robust": {}})
    np.testing.assert_array_equal(errors["glm"], errors["ols"])


def fake_record(verdict, budget=None, robust_hgb=0.1):
    metric = {"mean": 0.2}
    return {
        "verdict": verdict,
        "metrics": {"robust": {"mild_excess_nmax": metric},
                    "robust_hgb": {"mild_excess_nmax": {"mean": robust_hgb}}},
        "budget": budget,
    }  # fmt: skip


def test_diagnosis_cites_the_budget_and_the_same_interface_rival():
    spec = registered_spec()
    budget = {
        "check": "mild_beats_linear", "rival": "ols",
        "points": {"robust": {"1": {"metric": 0.2}, "2": {"metric": 0.1}}},
        "bar_at": {"1": 0.15, "2": 0.12}, "clears_bar_at": {"1": False, "2": True},
    }  # fmt: skip
    record = fake_record("did not hold", budget)
    findings = claim.diagnose(record, spec=spec, failed=["mild_beats_linear"])
    assert [f.cause for f in findings] == ["check", "implementation"]
    assert validate(findings, record)  # every cite resolves to a number
    # the rival no better and no budget: undetermined; a held verdict needs no diagnosis
    bare = fake_record("did not hold", None, robust_hgb=0.3)
    assert [f.cause for f in claim.diagnose(bare, spec=spec, failed=["mild_beats_linear"])] == [
        "undetermined"
    ]
    assert claim.diagnose(fake_record("held"), spec=spec, failed=[]) == []


@pytest.mark.slow
def test_quick_run_is_the_same_with_one_or_two_workers_and_then_cached(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setattr(claim, "PROJECT", runs / "a" / "b")  # cache under tmp_path/runs
    one = claim.run_claim_experiment(["--quick", "--jobs", "1", "--out", str(tmp_path / "1")])
    two = claim.run_claim_experiment(
        ["--quick", "--jobs", "2", "--fresh", "--out", str(tmp_path / "2")]
    )
    claim.run_claim_experiment(["--quick", "--out", str(tmp_path / "3")])
    for subject, metrics in one["results"].items():
        for metric, values in metrics.items():
            for a, b in zip(values, two["results"][subject][metric], strict=True):
                np.testing.assert_array_equal(a, b)
    jobs = load_claim(tmp_path / "3" / "claim.json")["jobs"]
    assert jobs["ran"] == 0 and jobs["cached"] == jobs["jobs"]
