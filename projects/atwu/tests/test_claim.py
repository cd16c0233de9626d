import json

import pytest

from atwu import claim
from atwu.claim import frontier_area, run_claim_experiment
from papers_eval import load_claim


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    """The full claim experiment (about 15 minutes on 2 cores): 3 seeds, the controls behaved
    (else the verdict is 'not shown' and this fails), and the verdict follows from the method's
    outcomes."""
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]


def test_frontier_area_by_hand():
    """Box [0, 2] x [0.9, 1.0] (full model gap 2, utility 1, floor 0.9). Points (1, 1.0) and
    (0.5, 0.95): gap in [0.5, 1) reaches utility 0.95 (area 0.5 x 0.05), gap in [1, 2) reaches
    1.0 (area 1 x 0.1); 0.125 / 0.2 = 0.625 of the box. Points outside the box add nothing."""
    points = [(1.0, 1.0), (0.5, 0.95), (3.0, 1.0), (0.1, 0.5)]
    area = frontier_area(points, gap_ref=2.0, utility_full=1.0, utility_ratio=0.9)
    assert area == pytest.approx(0.625)
    assert frontier_area([(2.5, 1.0)], gap_ref=2.0, utility_full=1.0, utility_ratio=0.9) == 0.0
    # a dominated point changes nothing; a better one adds
    assert frontier_area(points + [(1.5, 0.92)], 2.0, 1.0, 0.9) == pytest.approx(0.625)
    assert frontier_area(points + [(0.0, 1.0)], 2.0, 1.0, 0.9) > 0.625


@pytest.mark.slow  # 2-3 minutes: two quick claim runs and a cached one
def test_two_workers_give_the_record_of_one_and_a_rerun_comes_from_the_cache(tmp_path, monkeypatch):
    """``--jobs 2`` (spawned workers, one torch thread each) writes the record ``--jobs 1``
    writes, wall times aside; a third run loads every job from the runner's cache. The model
    folders stay in the project's runs/atwu/inputs: the workers find them there by digest."""
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
    """The record's results as JSON, without what measures time (train_s, the overhead)."""
    metrics = {
        subject: {k: v for k, v in values.items() if k != "train_s"}
        for subject, values in record["metrics"].items()
    }
    evidence = dict(record["evidence"])
    evidence.pop("atwu_wall_time_overhead_vs_uniform")
    return json.dumps([metrics, evidence, record["tuning"], record["outcomes"]], sort_keys=True)
