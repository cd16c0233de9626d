import json

import numpy as np
import pytest

from dual_dgo import claim
from dual_dgo.claim import EDGE_CHECKED, grid_edges, run_claim_experiment
from papers_eval import load_claim
from papers_eval.tuning import TuningResult


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]


@pytest.mark.slow  # two quick claim runs and a cached one
def test_two_workers_give_the_record_of_one_and_a_rerun_comes_from_the_cache(tmp_path, monkeypatch):
    """``--jobs 2`` (spawned workers, one torch thread each) writes the record ``--jobs 1``
    writes, wall times aside; a third run loads every job from the runner's cache. The warm
    starts stay under runs/dual-reference-dgo/inputs: the workers find them there by key."""
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    records = []
    for name, flags in (("one", ["--jobs", "1"]), ("two", ["--jobs", "2", "--fresh"]),
                        ("cached", ["--jobs", "2"])):  # fmt: skip
        run_claim_experiment(["--quick", *flags, "--out", str(tmp_path / name)])
        records.append(load_claim(tmp_path / name / "claim.json"))
    one, two, cached = records
    assert one["jobs"]["ran"] == two["jobs"]["ran"] == two["jobs"]["jobs"] > 0
    assert cached["jobs"]["cached"] == cached["jobs"]["jobs"] == two["jobs"]["jobs"]
    for record in (two, cached):
        assert results_only(record) == results_only(one)


def results_only(record: dict) -> str:
    """What the runs measured, without what measures time."""
    budget = record["budget"]
    if budget:
        budget = {k: v for k, v in budget.items() if "time" not in k}
        budget["points"] = {
            s: {m: p["metric"] for m, p in points.items()} for s, points in budget["points"].items()
        }
    keep = [record["metrics"], record["evidence"], record["tuning"], record["outcomes"], budget]
    return json.dumps(keep, sort_keys=True)


def test_grid_edges_flag_a_choice_at_either_end_and_say_nothing_for_short_grids():
    grids = {
        "dual": [{"beta": b} for b in (0.02, 0.05, 0.1, 0.2, 0.5)],
        "single_reference": [{"beta": b} for b in (0.02, 0.05, 0.1, 0.2, 0.5)],
        "fixed_prior": [{"beta": 0.1}],
        "oracle_router": [{"threshold": t} for t in range(1, 6)],
    }
    best = {
        "dual": {"beta": 0.1},
        "single_reference": {"beta": 0.02},
        "fixed_prior": {"beta": 0.1},
        "oracle_router": {"threshold": 1},
    }
    tuning = TuningResult(split="val", metric="val_reward", goal="higher", seed=0, trials={},
                          best=best)  # fmt: skip
    edges = grid_edges(tuning, grids, EDGE_CHECKED)  # papers_eval's, on the beta
    assert set(edges) == {"dual", "single_reference", "fixed_prior"}  # thresholds not checked
    assert edges["dual"]["at_edge"] is False and edges["single_reference"]["at_edge"] is True
    assert edges["fixed_prior"]["at_edge"] is None
    assert (edges["single_reference"]["low"], edges["single_reference"]["high"]) == (0.02, 0.5)
    assert np.isclose(edges["single_reference"]["chosen"], 0.02)


def judgement_stub(spec, method_fails=(), control_fails=()):
    """What ``diagnose`` reads of a judgement: every check passed except the named ones; the
    negative control fails its first check (it behaved)."""
    from types import SimpleNamespace

    subjects = [spec.method, *(c.name for c in spec.judged_controls)]
    outcomes = {s: {c.name: SimpleNamespace(passed=True) for c in spec.checks} for s in subjects}
    for name in method_fails:
        outcomes[spec.method][name].passed = False
    for subject, name in control_fails:
        outcomes[subject][name].passed = False
    outcomes["fixed_prior"]["keeps_fast_mode"].passed = False
    preconditions = {c.name: SimpleNamespace(passed=True) for c in spec.preconditions}
    return SimpleNamespace(outcomes=outcomes, preconditions=preconditions)


def record_stub(spec, **means):
    metrics = {s: {m: {"mean": 0.5} for m in claim.METRICS} for s in claim.SUBJECTS}
    for path, value in means.items():
        subject, metric = path.split("/")
        metrics[subject][metric]["mean"] = value
    edges = {"single_reference": {"param": "beta", "chosen": 0.1, "at_edge": False}}
    return {"verdict": "did not hold", "metrics": metrics, "budget": None,
            "evidence": {"tuning_edges": edges}}  # fmt: skip


def test_the_diagnosis_names_the_cause_a_failed_gain_check_has():
    from papers_eval import load_claim_spec

    spec = load_claim_spec(claim.CLAIM_FILE, subjects=claim.SUBJECTS, metrics=claim.METRICS,
                           quick=True)  # fmt: skip
    failing = judgement_stub(spec, method_fails=["beats_single_reference_at_matched_tokens"])
    # routing by the true digit count does not clear the margin either: the check decides
    record = record_stub(spec, **{"oracle_router/gain_vs_single_reference": 0.01})
    (only,) = claim.diagnose(record, spec=spec, judgements=[failing])
    assert only.cause == "check" and "true digit count" in only.summary
    assert {c.path for c in only.evidence} == {
        "metrics.dual.gain_vs_single_reference.mean",
        "metrics.oracle_router.gain_vs_single_reference.mean",
    }
    # the oracle clears it, the blind switch flatters the rival: the gain was the operating point
    record = record_stub(spec, **{"oracle_router/gain_vs_single_reference": 0.1,
                                  "dual/gain_vs_single_reference_random": 0.09})  # fmt: skip
    (only,) = claim.diagnose(record, spec=spec, judgements=[failing])
    assert only.cause == "idea" and "operating point" in only.summary
    # neither: undetermined; and a rival's beta at its grid's edge is a finding of its own
    record = record_stub(spec, **{"oracle_router/gain_vs_single_reference": 0.1,
                                  "dual/gain_vs_single_reference_random": 0.0})  # fmt: skip
    record["evidence"]["tuning_edges"]["single_reference"]["at_edge"] = True
    causes = [f.cause for f in claim.diagnose(record, spec=spec, judgements=[failing])]
    assert causes == ["undetermined", "check"]
    # a positive control that fails, or a negative one that passes everything, is named
    misbehaved = judgement_stub(spec, control_fails=[("exact_partition", "routes_by_difficulty")])
    misbehaved.outcomes["fixed_prior"]["keeps_fast_mode"].passed = True
    summaries = [f.summary for f in claim.diagnose(record_stub(spec), spec=spec,
                                                   judgements=[misbehaved])]  # fmt: skip
    assert any("exact_partition (oracle) fails routes_by_difficulty" in s for s in summaries)
    assert any("fixed_prior passes every check" in s for s in summaries)
    held = record_stub(spec) | {"verdict": "held"}
    assert claim.diagnose(held, spec=spec, judgements=[failing]) == []


class _Item:
    def __init__(self, difficulty: int) -> None:
        self.difficulty = difficulty


class _Module:
    """Solves every prompt by the forced-slow decode once ``learned`` epochs have passed."""

    def __init__(self, learned: int) -> None:
        self.learned, self.epoch, self.seen = learned, 0, []

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def evaluate_prompts(self, items):
        self.seen.append([i.difficulty for i in items])
        return {"slow_correct": np.full(len(items), float(self.epoch >= self.learned))}


class _Trainer:
    def __init__(self) -> None:
        self.current_epoch, self.should_stop = 0, False
        self.datamodule = type("D", (), {"splits": {"val": [_Item(k) for k in range(1, 9)]}})()


@pytest.mark.parametrize(("learned", "stops_at"), [(10, 60), (75, 80), (500, None)])
def test_the_warm_start_rule_trains_the_minimum_then_stops_once_the_slow_trace_is_learned(
    learned, stops_at
):
    rule = claim.SlowTraceConverged(
        min_epochs=60, every=10, max_epochs=150, slow_accuracy=0.85, digits_from=5
    )
    trainer, module = _Trainer(), _Module(learned)
    stopped = None
    for epoch in range(150):
        module.epoch, trainer.current_epoch = epoch + 1, epoch
        rule.on_train_batch_end(trainer, module, {"loss": 2.0 - epoch / 100}, None, 0)
        rule.on_train_epoch_end(trainer, module)
        if trainer.should_stop:
            stopped = epoch + 1
            break
    assert stopped == stops_at
    assert all(seen == [5, 6, 7, 8] for seen in module.seen)  # validation prompts of 5+ digits
    assert [c["epoch"] for c in rule.checks][:2] == [10, 20]
    assert len(rule.losses) == (stopped or 150)
    assert rule.losses[0] == pytest.approx(2.0)
