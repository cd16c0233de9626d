import json

import numpy as np
import pytest

from dual_dgo import claim
from dual_dgo.claim import grid_edges, run_claim_experiment
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
    edges = grid_edges(tuning, grids)
    assert set(edges) == {"dual", "single_reference", "fixed_prior"}  # thresholds not checked
    assert edges["dual"]["at_edge"] is False and edges["single_reference"]["at_edge"] is True
    assert edges["fixed_prior"]["at_edge"] is None
    assert (edges["single_reference"]["low"], edges["single_reference"]["high"]) == (0.02, 0.5)
    assert np.isclose(edges["single_reference"]["chosen"], 0.02)
