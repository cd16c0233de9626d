"""The claim experiment: the --quick pipeline (fast lane) and the full run (slow)."""

import copy
import json
from pathlib import Path

import pytest

from papers_eval import load_claim, load_claim_spec
from papers_eval.diagnosis import validate
from rlawm import claim
from rlawm.claim import SUBJECTS, run_claim_experiment

PROJECT = Path(__file__).resolve().parents[1]


def test_reproduce_quick_writes_a_judged_record(tmp_path, monkeypatch):
    # a cache of its own: under a dirty revision the project's cache could hold older code's runs
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    monkeypatch.setattr(claim, "INPUTS_DIR", tmp_path / "inputs")
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "rla-wm" and record["quick"]
    assert record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    assert [c["name"] for c in record["ceilings"]] == ["rla_ceiling"]
    assert set(record["metrics"]) == set(SUBJECTS)
    metrics = record["metrics"]
    # persistence predicts no spread; the oracle and every model see the same truth
    assert metrics["persistence"]["collapse_ratio"]["mean"] == 0.0
    truth = metrics["oracle"]["truth_spread"]["mean"]
    assert all(metrics[s]["truth_spread"]["mean"] == truth for s in SUBJECTS)
    # the oracle draws true trajectories: its best sample per outcome is often the outcome itself
    assert (
        metrics["oracle"]["feature_l1_best"]["mean"]
        < metrics["persistence"]["feature_l1_best"]["mean"]
    )
    assert (
        metrics["oracle"]["energy_distance"]["mean"]
        < metrics["persistence"]["energy_distance"]["mean"]
    )
    # the decoder's applied change is the ceiling's metric alone
    assert metrics["rla_ceiling"]["applied_change_ratio"]["mean"] > 0
    assert metrics["rla_wm"]["applied_change_ratio"]["mean"] is None
    assert [p["name"] for p in record["preconditions"]] == [
        "truth_is_multimodal", "regression_collapses", "decoder_applies_the_change",
        "pixel_beats_persistence", "bc_beats_random",
    ]  # fmt: skip
    if record["verdict"] != "held":  # every finding cites numbers of the record
        assert record["diagnosis"] and all(f["evidence"] for f in record["diagnosis"])
    check_diagnosis_rules(record)
    assert (
        metrics["pixel"]["flops_per_frame"]["mean"] > metrics["rla_wm"]["flops_per_frame"]["mean"]
    )
    details = outcome["details"]
    assert set(details["simulator_success"][0]) == {
        "bc",
        "wam",
        "rl_rla_wm",
        "rl_regression",
        "random",
        "bc_all",
    }
    # the same flows at the registered and the check's Euler steps
    assert set(details["sample_steps"]["rla_wm"][0]) == {"2 steps", "4 steps"}
    evidence = record["evidence"]
    assert set(evidence["rla_ceiling"]) == {"rolled_out", "teacher_forced"}
    assert (
        0
        < evidence["applied_change_ratio"]
        == pytest.approx(metrics["rla_ceiling"]["applied_change_ratio"]["mean"])
    )
    assert len(details["ablations_seed0"]) == 4
    for name in ("claim.md", "uses_and_ablations.png", "details.json"):
        assert (tmp_path / name).is_file()
    # what later jobs read, by digest: the world, the tuned RLA-WM and regression models
    stored = sorted(path.name.split("-")[0] for path in (tmp_path / "inputs").iterdir())
    assert stored == ["model", "model", "world"]
    assert record["jobs"]["per_stage"]["tune"]["ran"] == len(claim.TRAINED)


def check_diagnosis_rules(record: dict) -> None:
    """The diagnosis rules on the quick record's numbers, edited: the ceiling above or below the
    energy bar, the sampler's spread inside the band at more steps, a tuned rate on a grid end;
    every finding's cites resolve to numbers of the record (papers_eval.diagnosis.validate)."""
    spec = load_claim_spec(claim.CLAIM_FILE, subjects=SUBJECTS, metrics=claim.METRICS,
                           allow_dirty=True)  # fmt: skip
    base = copy.deepcopy(record)
    base["verdict"] = "did not hold"
    for name in ("energy_below_regression_and_token_flow", "spread_not_collapsed"):
        base["outcomes"]["rla_wm"][name]["passed"] = False
    steps = base["evidence"]["sample_steps"]["rla_wm"]
    registered, more = (f"{spec.settings[k]}_steps" for k in ("sample_steps", "sample_steps_check"))
    steps[registered], steps[more] = steps.pop("2_steps"), steps.pop("4_steps")

    def causes(edit) -> list[tuple[str, str]]:
        edited = copy.deepcopy(base)
        edit(edited)
        findings = validate(claim.diagnose(edited, spec=spec), edited)
        return [(f["cause"], f["summary"]) for f in findings]

    def ceiling_at(energy, spread_more=-5.0, edge=False):
        def edit(r):
            r["metrics"]["rla_ceiling"]["energy_distance"]["mean"] = energy
            r["evidence"]["sample_steps"]["rla_wm"][more]["collapse_log_ratio"] = spread_more
            r["evidence"]["tuning_edges"]["token_flow"]["at_edge"] = edge

        return edit

    above = causes(ceiling_at(1e9))
    assert any(c == "implementation" and "autoencoder, not the flow" in t for c, t in above)
    below = causes(ceiling_at(0.0))
    assert any(c == "undetermined" and "ceiling clears the bar" in t for c, t in below)
    sampler = causes(ceiling_at(0.0, spread_more=-0.1))
    assert any(c == "implementation" and "under-disperse" in t for c, t in sampler)
    assert not any("under-disperse" in t for _, t in below)
    edged = causes(ceiling_at(0.0, edge=True))
    assert any(c == "check" and "token_flow's tuned lr" in t for c, t in edged)
    assert not any("token_flow's tuned lr" in t for _, t in below)
    held = copy.deepcopy(base)
    held["verdict"] = "held"
    assert claim.diagnose(held, spec=spec) == []


def test_a_bad_claim_file_stops_before_any_world_is_built(tmp_path, monkeypatch):
    bad = tmp_path / "claim.yaml"
    bad.write_text((PROJECT / "configs" / "claim.yaml").read_text().replace("[0, 1, 2]", "[0]", 1))
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "build_world", lambda *a, **k: pytest.fail("built first"))
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    if record["verdict"] != "not shown":
        assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]


@pytest.mark.slow  # 2-3 minutes: two quick claim runs and a cached one
def test_two_workers_give_the_record_of_one_and_a_rerun_comes_from_the_cache(tmp_path, monkeypatch):
    """``--jobs 2`` (spawned workers, one torch thread each) gives the results of ``--jobs 1``,
    wall times aside; a third run loads every job from the runner's cache. The worlds and models
    stay in the project's runs/rla-wm/inputs: the workers find them there by digest."""
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    outcomes, records = [], []
    for name, flags in (("two", ["--jobs", "2"]), ("one", ["--jobs", "1", "--fresh"]),
                        ("cached", ["--jobs", "2"])):  # fmt: skip
        outcomes.append(run_claim_experiment(["--quick", *flags, "--out", str(tmp_path / name)]))
        records.append(load_claim(tmp_path / name / "claim.json"))
    two, one, cached = records
    assert two["jobs"]["ran"] == one["jobs"]["ran"] == two["jobs"]["jobs"] > 0
    assert cached["jobs"]["cached"] == cached["jobs"]["jobs"] == two["jobs"]["jobs"]
    for record, outcome in ((two, outcomes[0]), (cached, outcomes[2])):
        assert without_wall_times(record, outcome) == without_wall_times(one, outcomes[1])


def without_wall_times(record: dict, outcome: dict) -> str:
    """The record's and details' results as JSON, without what measures time."""
    metrics = {
        subject: {k: v for k, v in values.items() if k != "wall_ms_per_frame"}
        for subject, values in record["metrics"].items()
    }
    details = {
        k: v
        for k, v in outcome["details"].items()
        if k not in ("timings", "train_s", "wall_ms_per_frame")
    }
    results = [metrics, record["evidence"], record["tuning"], record["outcomes"], details]
    return json.dumps(results, sort_keys=True, default=float)
