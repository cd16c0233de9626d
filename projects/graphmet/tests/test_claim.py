import json

import pytest

from graphmet import claim
from graphmet.claim import run_claim_experiment
from papers_eval import load_claim


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    """The full claim experiment (43 minutes on one core): the controls behave (else the
    verdict is "not shown") and the verdict follows from the method's checks."""
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]


@pytest.mark.slow  # about 2 minutes: two quick claim runs and a cached one
def test_two_workers_give_the_record_of_one_and_a_rerun_comes_from_the_cache(tmp_path, monkeypatch):
    """``--jobs 2`` (spawned workers, one torch thread each) writes the record ``--jobs 1``
    writes, wall times aside; a third run loads every training from the runner's cache."""
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    records = []
    for name, flags in (("two", ["--jobs", "2"]), ("one", ["--jobs", "1", "--fresh"]),
                        ("cached", ["--jobs", "2"])):  # fmt: skip
        run_claim_experiment(["--quick", *flags, "--out", str(tmp_path / name)])
        records.append(load_claim(tmp_path / name / "claim.json"))
    two, one, cached = records
    assert two["jobs"]["ran"] == one["jobs"]["ran"] == two["jobs"]["jobs"] > 0
    assert cached["jobs"]["cached"] == cached["jobs"]["jobs"] == two["jobs"]["jobs"]
    for record in (two, cached):
        assert without_wall_times(record) == without_wall_times(one)


def without_wall_times(record: dict) -> str:
    """The record's results as JSON, without what measures time."""
    metrics = {
        subject: {k: v for k, v in values.items() if k != "seconds_per_step_member"}
        for subject, values in record["metrics"].items()
    }
    evidence = {
        subject: {k: v for k, v in values.items() if k != "train_seconds"}
        for subject, values in record["evidence"].items()
    }
    return json.dumps([metrics, evidence, record["tuning"], record["outcomes"]], sort_keys=True)
