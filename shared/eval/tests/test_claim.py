"""The claim protocol: spec validation, intervals, verdicts, tuning and the schema-2 record."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from papers_eval import (
    CLAIM_FIELDS,
    ClaimSpecError,
    RecordSchemaError,
    contrast_interval,
    grid_edges,
    judge,
    load_claim,
    load_claim_spec,
    run_seeds,
    tune,
    write_claim,
    write_results,
)
from papers_eval.claim import check_outcome
from papers_eval.tuning import TuningResult

SUBJECTS = ("method", "baseline", "broken", "oracle")
METRICS = ("error", "accuracy")


def spec_text(**overrides) -> dict:
    spec = {
        "claim": "The method has lower error than the baseline.",
        "method": "method",
        "baselines": ["baseline"],
        "controls": {
            "negative": [{"name": "broken", "why": "no mechanism"}],
            "positive": [{"name": "oracle", "why": "knows the answer"}],
        },
        "seeds": [0, 1, 2],
        "checks": [
            {"name": "beats_baseline", "metric": "error", "goal": "lower", "against": "baseline"}
        ],
        "quick": {"seeds": [0]},
    }
    spec.update(overrides)
    return spec


def write_spec(tmp_path, **overrides):
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(spec_text(**overrides)))
    return path


def load(tmp_path, quick=False, **overrides):
    path = write_spec(tmp_path, **overrides)
    return load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, quick=quick)


def results_with(errors: dict[str, float], n_items=50, noise=0.1, seeds=3) -> dict:
    """Per-item errors around each subject's mean; the items are shared across subjects."""
    rng = np.random.default_rng(0)
    out = {}
    for subject, mean in errors.items():
        out[subject] = {
            "error": [mean + noise * rng.standard_normal(n_items) for _ in range(seeds)],
            "accuracy": [1 - mean for _ in range(seeds)],
        }
    return out


# spec validation: clear errors before anything trains


def test_a_valid_spec_loads_with_its_subjects_and_quick_overrides(tmp_path):
    spec = load(tmp_path)
    assert spec.subjects == ("method", "baseline", "broken", "oracle")
    assert spec.seeds == (0, 1, 2) and not spec.quick
    assert load(tmp_path, quick=True).seeds == (0,)
    assert spec.checks[0].describe() == "error below baseline"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "nosuch"}, "method 'nosuch' is not something this project runs"),
        (
            {"checks": [{"name": "c", "metric": "f1", "goal": "higher", "threshold": 0.5}]},
            "metric 'f1', which this project does not compute",
        ),
        ({"seeds": [0, 1]}, "at least 3 seeds"),
        ({"controls": {"negative": ["broken"]}}, "no positive control"),
        ({"controls": {"positive": ["oracle"]}}, "no negative control"),
        (
            {"checks": [{"name": "c", "metric": "error", "goal": "lower"}]},
            "exactly one of 'threshold' or 'against'",
        ),
        (
            {"checks": [{"name": "c", "metric": "error", "goal": "down", "threshold": 1}]},
            "goal: higher or goal: lower",
        ),
        ({"tuning": {"split": "test", "metric": "error", "goal": "lower"}}, "never the test"),
        (
            {
                "tuning": {
                    "split": "val",
                    "metric": "error",
                    "goal": "lower",
                    "grid": {"lr": [1, 2]},
                    "per_subject": {"baseline": {"tau": [1, 2]}},
                }
            },
            "unequal tuning budgets",
        ),
        ({"typo": 1}, "unknown keys"),
    ],
)
def test_bad_specs_are_clear_errors(tmp_path, overrides, message):
    with pytest.raises(ClaimSpecError, match=message):
        load(tmp_path, **overrides)


def test_fewer_seeds_are_allowed_only_for_quick_runs(tmp_path):
    assert load(tmp_path, quick=True, seeds=[0, 1]).seeds == (0,)  # quick overrides
    path = write_spec(tmp_path)
    with pytest.raises(ClaimSpecError, match="at least 3 seeds"):
        load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, seeds=[5])
    assert load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, seeds=[4, 5, 6]).seeds == (
        4,
        5,
        6,
    )


def test_a_missing_spec_file_says_where(tmp_path):
    with pytest.raises(ClaimSpecError, match="missing"):
        load_claim_spec(tmp_path / "nope.yaml", subjects=SUBJECTS, metrics=METRICS)


# the verdict, on hand-made outcomes


@pytest.mark.parametrize(
    ("errors", "verdict"),
    [
        ({"method": 0.5, "baseline": 1.0, "broken": 1.2, "oracle": 0.1}, "held"),
        ({"method": 1.1, "baseline": 1.0, "broken": 1.2, "oracle": 0.1}, "did not hold"),
        # the negative control passes: the check cannot tell broken from working
        ({"method": 0.5, "baseline": 1.0, "broken": 0.5, "oracle": 0.1}, "not shown"),
        # the positive control fails: the miniature cannot reward the mechanism
        ({"method": 0.5, "baseline": 1.0, "broken": 1.2, "oracle": 1.3}, "not shown"),
        # a method that fails does not turn "not shown" into "did not hold"
        ({"method": 1.5, "baseline": 1.0, "broken": 0.2, "oracle": 0.1}, "not shown"),
    ],
)
def test_verdict_follows_the_checks_and_the_controls(tmp_path, errors, verdict):
    judgement = judge(load(tmp_path), results_with(errors))
    assert judgement.verdict == verdict
    if verdict == "not shown":
        assert "control" in judgement.reason


PRECONDITION = [
    {
        "name": "baseline_struggles",
        "subject": "baseline",
        "metric": "error",
        "goal": "higher",
        "threshold": 0.8,
        "where": "the task is not already solved",
    }
]


@pytest.mark.parametrize(
    ("baseline", "verdict"), [(1.0, "held"), (0.7, "not shown")], ids=["met", "failed"]
)
def test_a_failed_precondition_means_not_shown_whatever_the_checks_say(tmp_path, baseline, verdict):
    spec = load(tmp_path, precondition=PRECONDITION)
    assert "baseline" in spec.subjects and spec.preconditions[0].subject == "baseline"
    errors = {"method": 0.3, "baseline": baseline, "broken": 1.2, "oracle": 0.1}
    judgement = judge(spec, results_with(errors))
    assert judgement.verdict == verdict
    assert judgement.precondition_met == (verdict == "held")
    assert judgement.method_passed and judgement.controls_behaved  # the checks alone would hold
    if verdict == "not shown":
        assert "precondition 'baseline_struggles'" in judgement.reason
        assert "baseline's error above 0.8" in judgement.reason


def test_a_precondition_may_name_a_subject_that_is_not_judged(tmp_path):
    """e.g. the same baseline on a clean stream: run for every seed, judged only there."""
    spec = load_claim_spec(
        write_spec(
            tmp_path,
            precondition=[
                {
                    "name": "noise_hurts",
                    "subject": "baseline",
                    "metric": "error",
                    "goal": "higher",
                    "against": "clean",
                    "margin": 0.1,
                }
            ],
        ),  # fmt: skip
        subjects=(*SUBJECTS, "clean"),
        metrics=METRICS,
    )
    assert spec.subjects[-1] == "clean"
    errors = {"method": 0.3, "baseline": 1.0, "broken": 1.2, "oracle": 0.1, "clean": 0.95}
    judgement = judge(spec, results_with(errors))
    assert judgement.verdict == "not shown" and not judgement.precondition_met
    with pytest.raises(ClaimSpecError, match="no results for 'clean'"):
        judge(spec, results_with({k: v for k, v in errors.items() if k != "clean"}))


@pytest.mark.parametrize(("rule", "met"), [("interval", False), ("estimate", True)])
def test_a_point_rule_precondition_judges_the_estimate_and_still_reports_the_interval(
    tmp_path, rule, met
):
    """The baseline's mean error sits just above the bar: the estimate clears it, the interval
    does not; only a precondition registered with `rule: estimate` passes."""
    spec = load(tmp_path, precondition=[{**PRECONDITION[0], "rule": rule}])
    errors = {"method": 0.3, "baseline": 0.82, "broken": 1.2, "oracle": 0.1}
    judgement = judge(spec, results_with(errors, noise=0.3, n_items=20))
    outcome = judgement.preconditions["baseline_struggles"]
    assert outcome.advantage.estimate > 0 > outcome.advantage.low
    assert outcome.passed == met and judgement.precondition_met == met
    assert judgement.verdict == ("held" if met else "not shown")
    assert ("mean error" in spec.preconditions[0].describe()) == met


@pytest.mark.parametrize(
    ("precondition", "message"),
    [
        ([{**PRECONDITION[0], "subject": None}], "needs the subject"),
        ([{**PRECONDITION[0], "subject": "nobody"}], "subject 'nobody' is not something"),
        ([{**PRECONDITION[0], "metric": "loss"}], "precondition 'baseline_struggles' names"),
        (PRECONDITION * 2, "precondition names repeat"),
        ([{**PRECONDITION[0], "rule": "median"}], "rule: interval or rule: estimate"),
    ],
)
def test_bad_preconditions_are_clear_errors(tmp_path, precondition, message):
    with pytest.raises(ClaimSpecError, match=message):
        load(tmp_path, precondition=precondition)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("subject", "method", "unknown keys \\['subject'\\]"),
        ("rule", "estimate", "rule: estimate is for preconditions only"),
        ("rule", "median", "check 'c' needs rule: interval or rule: every_seed"),
    ],
)
def test_a_check_cannot_name_a_subject_or_a_point_rule(tmp_path, key, value, message):
    checks = [{"name": "c", "metric": "error", "goal": "lower", "against": "baseline",
               key: value}]  # fmt: skip
    with pytest.raises(ClaimSpecError, match=message):
        load(tmp_path, checks=checks)


def _bound_check(tmp_path, rule, **extra):
    check = {"name": "flat", "metric": "error", "goal": "lower", "threshold": 0.05, "rule": rule}
    return load(tmp_path, checks=[{**check, **extra}])


@pytest.mark.parametrize(
    ("per_seed", "interval_passes", "every_seed_passes"),
    [
        ([0.0, 0.03, 0.0], False, True),  # every seed under the bar; t over 3 means is not
        ([0.08, 0.08, 0.08], False, False),  # a control far above it at every seed
        ([0.0, 0.0, 0.06], False, False),  # one seed above it
        ([0.01, 0.012, 0.011], True, True),
    ],
)
def test_an_every_seed_rule_bounds_each_seed_and_still_reports_the_interval(
    tmp_path, per_seed, interval_passes, every_seed_passes
):
    results = {"method": {"error": per_seed}}
    by_interval_spec = _bound_check(tmp_path, "interval")
    by_interval = check_outcome(by_interval_spec, by_interval_spec.checks[0], "method", results)
    spec = _bound_check(tmp_path, "every_seed")
    outcome = check_outcome(spec, spec.checks[0], "method", results)
    assert by_interval.passed == interval_passes
    assert outcome.passed == every_seed_passes
    assert outcome.advantage == by_interval.advantage  # the same interval, whichever rule decides
    assert spec.checks[0].describe() == "every seed's error below 0.05"


def test_an_every_seed_rule_against_references_takes_each_seeds_seed_means(tmp_path):
    """Per seed: the subject's mean over items against each reference's, less the margin; the
    check passes only if every seed clears every reference."""
    check = {"name": "c", "metric": "error", "goal": "lower", "against": ["baseline", "broken"],
             "margin": 0.1, "rule": "every_seed"}  # fmt: skip
    spec = load(tmp_path, checks=[check])
    method = [np.array([0.2, 0.4]), np.array([0.3, 0.3]), np.array([0.1, 0.5])]  # means 0.3
    results = {
        "method": {"error": method},
        "baseline": {"error": [np.full(2, 0.5), np.full(2, 0.5), np.full(2, 0.41)]},
        "broken": {"error": [np.full(2, 0.9)] * 3},
    }  # seed 2 clears the baseline by 0.11 - 0.1 = 0.01 only
    assert check_outcome(spec, spec.checks[0], "method", results).passed
    results["baseline"]["error"][2] = np.full(2, 0.39)  # seed 2: 0.09 < the margin
    assert not check_outcome(spec, spec.checks[0], "method", results).passed


def test_a_check_passes_only_when_the_whole_interval_clears_the_bar(tmp_path):
    spec = load(tmp_path)
    # a small true advantage drowned in item noise: the interval straddles 0
    judgement = judge(spec, results_with({**dict.fromkeys(SUBJECTS, 1.0), "method": 0.99}, 20, 1))
    outcome = judgement.outcomes["method"]["beats_baseline"]
    assert outcome.advantage.low < 0 < outcome.advantage.high and not outcome.passed


def test_threshold_ratio_and_margin_checks(tmp_path):
    checks = [
        {"name": "accurate", "metric": "accuracy", "goal": "higher", "threshold": 0.4},
        {
            "name": "halves_error",
            "metric": "error",
            "goal": "lower",
            "against": ["baseline"],
            "ratio": 0.5,
            "margin": 0.05,
        },
    ]
    spec = load(tmp_path, checks=checks)
    errors = {"method": 0.4, "baseline": 1.0, "broken": 1.0, "oracle": 0.1}
    results = results_with(errors, noise=0.01)
    results["method"]["accuracy"] = [0.6, 0.61, 0.59]
    outcome = judge(spec, results).outcomes["method"]
    assert outcome["accurate"].advantage.estimate == pytest.approx(0.2)
    # 0.5 * 1.0 - 0.4 - 0.05 = 0.05 advantage
    assert outcome["halves_error"].advantage.estimate == pytest.approx(0.05, abs=0.01)
    assert outcome["accurate"].passed and outcome["halves_error"].passed


def test_against_several_references_reports_the_closest(tmp_path):
    checks = [
        {
            "name": "beats_all",
            "metric": "error",
            "goal": "lower",
            "against": ["baseline", "broken"],
        }
    ]
    spec = load(tmp_path, checks=checks, controls={"negative": ["broken"], "positive": ["oracle"]})
    results = results_with({"method": 0.5, "baseline": 1.0, "broken": 0.6, "oracle": 0.1})
    outcome = judge(spec, results).outcomes["method"]["beats_all"]
    assert outcome.advantage.estimate == pytest.approx(0.1, abs=0.03)


def test_results_missing_a_subject_or_a_seed_are_refused(tmp_path):
    spec = load(tmp_path)
    results = results_with(dict.fromkeys(SUBJECTS, 1.0))
    del results["oracle"]
    with pytest.raises(ClaimSpecError, match="no results for 'oracle'"):
        judge(spec, results)
    results = results_with(dict.fromkeys(SUBJECTS, 1.0), seeds=2)
    with pytest.raises(ClaimSpecError, match="2 values of 'error' for 3 seeds"):
        judge(spec, results)


# intervals


def coverage(draw, truth, replications=300) -> float:
    return np.mean([lo <= truth <= hi for lo, hi in (draw(r) for r in range(replications))])


def test_t_interval_over_three_seeds_covers_at_the_nominal_rate():
    def draw(r):
        values = np.random.default_rng(r).normal(2.0, 1.0, size=3)
        interval = contrast_interval([(1.0, list(values))])
        assert interval.method == "t over seeds"
        return interval.low, interval.high

    assert 0.91 <= coverage(draw, 2.0) <= 0.99


def test_per_item_values_get_the_wider_of_the_bootstrap_and_the_t_interval():
    """Protocol v3: neither interval alone is calibrated in every regime (test_coverage.py)."""
    rng = np.random.default_rng(0)
    seeds = [0.5 + 0.02 * rng.standard_normal() + rng.standard_normal(100) for _ in range(3)]
    combined = contrast_interval([(1.0, seeds)], n_resamples=400)
    means = [float(np.mean(s)) for s in seeds]
    t_only = contrast_interval([(1.0, means)])
    assert combined.method == "t over seed means"
    assert (combined.low, combined.high) == pytest.approx((t_only.low, t_only.high))
    # Seeds whose item means agree almost exactly while the items spread: the t interval on the
    # seed means is nearly empty, the bootstrap is the wider one and is kept.
    spread = [rng.standard_normal(50) for _ in range(3)]
    agreeing = [a - a.mean() + 0.5 + 1e-6 * i for i, a in enumerate(spread)]
    wide = contrast_interval([(1.0, agreeing)], n_resamples=400)
    narrow = contrast_interval([(1.0, [float(a.mean()) for a in agreeing])])
    assert wide.method == "item bootstrap"
    assert wide.high - wide.low > 100 * (narrow.high - narrow.low)


def test_paired_intervals_are_narrower_when_items_are_shared():
    rng = np.random.default_rng(0)
    difficulty = [rng.normal(0, 1.0, 200) for _ in range(3)]  # what every method shares
    a = [d + 0.1 + 0.05 * rng.standard_normal(200) for d in difficulty]
    b = [d + 0.05 * rng.standard_normal(200) for d in difficulty]
    paired = contrast_interval([(1.0, a), (-1.0, b)], paired=True)
    unpaired = contrast_interval([(1.0, a), (-1.0, b)], paired=False)
    assert paired.estimate == pytest.approx(unpaired.estimate)
    assert paired.low > 0  # the shared difficulty cancels
    assert unpaired.low < 0 < unpaired.high  # it does not when resampled separately
    assert (paired.high - paired.low) < 0.2 * (unpaired.high - unpaired.low)


def test_paired_needs_the_same_items():
    with pytest.raises(ValueError, match="same items"):
        contrast_interval([(1.0, [np.zeros(3)]), (-1.0, [np.zeros(4)])], paired=True)


def test_one_seed_gives_no_interval_and_cannot_pass(tmp_path):
    spec = load(tmp_path, quick=True)
    results = {
        s: {"error": [e], "accuracy": [0.5]} for s, e in zip(SUBJECTS, [0.1, 1, 2, 0], strict=True)
    }
    judgement = judge(spec, results)
    assert judgement.outcomes["method"]["beats_baseline"].advantage.method.startswith("one seed")
    assert not judgement.method_passed and judgement.verdict == "not shown"


# tuning


def test_tune_gives_every_subject_the_same_grid_and_keeps_the_best(tmp_path):
    spec = load(
        tmp_path,
        tuning={"split": "val", "metric": "error", "goal": "lower", "grid": {"lr": [1, 2, 3]}},
    )
    calls = []

    def score(subject, params, seed):
        calls.append((subject, params["lr"], seed))
        return float("nan") if params["lr"] == 1 else abs(params["lr"] - 2.2)

    result = tune(spec, score)
    assert len(calls) == 3 * len(SUBJECTS) and {c[2] for c in calls} == {0}
    assert all(best == {"lr": 2} for best in result.best.values())
    assert result.as_dict()["trials"]["oracle"][0]["params"] == {"lr": 1}
    assert "ties" not in result.as_dict()  # no tie rule declared: records as before


def test_grid_edges_say_where_each_choice_sits_and_need_three_values():
    result = TuningResult(split="val", metric="error", goal="lower", seed=0, trials={},
                          best={"low": {"lr": 1}, "mid": {"lr": 2}, "high": {"lr": 3, "k": 9},
                                "pair": {"lr": 2}, "untuned": {}})  # fmt: skip
    grids = {
        "low": [{"lr": v} for v in (3, 1, 2)],  # unsorted on purpose
        "mid": [{"lr": v} for v in (1, 2, 3)],
        "high": [{"lr": v, "k": 9} for v in (1, 2, 3)] + [{"lr": 3, "k": 8}],  # lr 3 twice
        "pair": [{"lr": 1}, {"lr": 2}],
        "untuned": [{}],
    }
    edges = grid_edges(result, grids, "lr")
    assert set(edges) == {"low", "mid", "high", "pair"}  # no lr chosen: left out
    assert edges["low"] == {"param": "lr", "chosen": 1, "low": 1, "high": 3, "values": 3,
                            "at_edge": True}  # fmt: skip
    assert edges["mid"]["at_edge"] is False
    assert edges["high"]["at_edge"] is True and edges["high"]["values"] == 3
    assert edges["pair"]["at_edge"] is None and edges["pair"]["values"] == 2


def test_a_near_tie_keeps_the_registered_default_and_the_record_says_so(tmp_path):
    """Scores within the tolerance of the best keep the preferred configuration; a preferred
    configuration further away, or a failed one (NaN), loses to the best."""
    tuning = {"split": "val", "metric": "error", "goal": "lower", "grid": {"lr": [1, 2, 3]},
              "tie": {"tolerance": 0.01, "prefer": {"method": {"lr": 2}, "baseline": {"lr": 2},
                                                    "broken": {"lr": 1}}}}  # fmt: skip
    spec = load(tmp_path, tuning=tuning)
    scores = {
        "method": {1: 0.5, 2: 0.305, 3: 0.300},  # 2 is within 0.01 of the best (3): kept
        "baseline": {1: 0.5, 2: 0.32, 3: 0.30},  # 2 is 0.02 away: the best wins
        "broken": {1: float("nan"), 2: 0.4, 3: 0.3},  # the preferred one failed
        "oracle": {1: 0.1, 2: 0.1 + 1e-9, 3: 0.2},  # no preference: the best
    }
    result = tune(spec, lambda subject, params, seed: scores[subject][params["lr"]])
    assert result.best == {"method": {"lr": 2}, "baseline": {"lr": 3}, "broken": {"lr": 3},
                           "oracle": {"lr": 1}}  # fmt: skip
    ties = result.as_dict()["ties"]
    assert set(ties) == {"method", "baseline", "broken"}
    assert ties["method"] == {"best": {"lr": 3}, "best_score": 0.3, "preferred": {"lr": 2},
                              "preferred_score": 0.305, "chosen": "preferred"}  # fmt: skip
    assert ties["baseline"]["chosen"] == ties["broken"]["chosen"] == "best"
    goal_higher = load(tmp_path, tuning={**tuning, "goal": "higher"})
    flipped = tune(goal_higher, lambda subject, params, seed: -scores[subject][params["lr"]])
    assert flipped.best == result.best
    results = results_with({"method": 0.3, "baseline": 1.0, "broken": 1.2, "oracle": 0.1})
    judgement = judge(spec, results)
    write_claim(tmp_path / "out", project="demo", spec=spec, results=results,
                judgement=judgement, config={}, wall_time_s=1.0, tuning=result)  # fmt: skip
    md = (tmp_path / "out" / "claim.md").read_text()
    assert "- tie rule, `method`: best {'lr': 3} (0.3), preferred {'lr': 2} (0.305): kept" in md
    assert "- tie rule, `broken`: best {'lr': 3} (0.3), preferred {'lr': 1} (failed): chose" in md
    stored = load_claim(tmp_path / "out" / "claim.json")["tuning"]["ties"]
    assert stored["method"] == ties["method"] and stored["broken"]["preferred_score"] is None


@pytest.mark.parametrize(
    ("tie", "message"),
    [
        ({"tolerance": 0.01}, "exactly 'tolerance' and 'prefer'"),
        ({"tolerance": -1, "prefer": {}}, "tolerance must be a number >= 0"),
        ({"tolerance": 0.1, "prefer": {"nobody": {"lr": 1}}}, "names 'nobody'"),
        ({"tolerance": 0.1, "prefer": {"method": {"lr": 5}}}, "not a configuration of 'method'"),
    ],
)
def test_a_bad_tie_rule_is_a_clear_error(tmp_path, tie, message):
    tuning = {"split": "val", "metric": "error", "goal": "lower", "grid": {"lr": [1, 2]}}
    with pytest.raises(ClaimSpecError, match=message):
        load(tmp_path, tuning={**tuning, "tie": tie})


# the record


def test_write_claim_round_trips_and_renders_every_part(tmp_path):
    spec = load(tmp_path, precondition=PRECONDITION)
    results = run_seeds(
        spec,
        lambda subject, seed: {
            "error": {"method": 0.5, "baseline": 1.0, "broken": 1.2, "oracle": 0.1}[subject]
            + 0.01 * np.random.default_rng(seed).standard_normal(30),
            "accuracy": 0.5,
        },
    )
    judgement = judge(spec, results)
    path = write_claim(
        tmp_path / "out",
        project="demo",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"lr": 0.1},
        wall_time_s=1.0,
        evidence={"weights_moved": 0.3},
        notes=["first note", "second note"],
    )
    record = load_claim(path)
    assert set(CLAIM_FIELDS) <= set(record)
    assert record["notes"] == "- first note\n- second note"
    # held on the registered seeds; no replication was run, and the record says so
    assert record["verdict"] == "held, not replicated" and record["seeds"] == [0, 1, 2]
    assert record["judgements"]["registered"]["verdict"] == "held"
    assert record["replication"] == {"run": False}
    assert len(record["metrics"]["method"]["error"]["per_seed"]) == 3
    assert {c["name"]: c["behaved"] for c in record["controls"]} == {
        "broken": True,
        "oracle": True,
    }
    assert (
        record["headline"].startswith("error: method 0.49")
        and "vs baseline 0.99" in record["headline"]
    )
    md = (tmp_path / "out" / "claim.md").read_text()
    for text in (
        "**Verdict: held, not replicated.**",
        "(replication not run)",
        "| beats_baseline | error below baseline |",
        "broken",
    ):
        assert text in md
    assert "weights_moved" in md
    assert "## Notes\n\n- first note\n- second note" in md
    (precondition,) = record["preconditions"]
    assert precondition["name"] == "baseline_struggles" and precondition["passed"]
    assert (
        "| baseline_struggles | baseline's error above 0.8 (the task is not already solved)" in md
    )


def test_the_record_names_the_revision_the_run_started_from(tmp_path, tmp_path_factory):
    """A commit made while a long run trains must not relabel the record."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                       cwd=tmp_path, check=True, capture_output=True)  # fmt: skip

    def head():
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "claim.yaml").write_text(yaml.safe_dump(spec_text()))
    (tmp_path / "core.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "the code the run measures")
    started = head()
    spec = load_claim_spec(tmp_path / "configs" / "claim.yaml", subjects=SUBJECTS, metrics=METRICS)
    assert spec.started_at_revision == started
    results = results_with({"method": 0.3, "baseline": 1.0, "broken": 1.2, "oracle": 0.1})

    def record_revision():
        path = write_claim(tmp_path / "results", project="demo", spec=spec, results=results,
                           judgement=judge(spec, results), config={}, wall_time_s=1.0)  # fmt: skip
        return load_claim(path)["git_revision"]

    assert record_revision() == started  # the record it writes is not a code change
    # `reproduce --out` outside the repository: HEAD is still read where the spec lives
    elsewhere = tmp_path_factory.mktemp("outside")
    outside = write_claim(elsewhere, project="demo", spec=spec, results=results,
                          judgement=judge(spec, results), config={}, wall_time_s=1.0)  # fmt: skip
    assert load_claim(outside)["git_revision"] == started
    (tmp_path / "core.py").write_text("x = 2\n")
    git("commit", "-qam", "a commit during the run")
    assert record_revision() == f"{started} (HEAD at write: {head()})"


def test_load_claim_refuses_a_schema_1_record_naming_the_change(tmp_path):
    write_results(
        tmp_path,
        project="old",
        experiment="x",
        claim="c",
        criterion="a > b",
        holds=True,
        metrics={"m": {"a": 1.0}},
        config={},
        seeds=[0],
        wall_time_s=0.0,
    )
    with pytest.raises(
        RecordSchemaError, match="schema-1 record; schema 1 .* replaced by schema 2"
    ):
        load_claim(tmp_path / "claim.json")
    (tmp_path / "partial.json").write_text(json.dumps({"schema_version": 2}))
    with pytest.raises(ValueError, match="missing fields"):
        load_claim(tmp_path / "partial.json")
