import numpy as np
import pytest
import yaml

from lrrf import claim
from lrrf.claim import CLAIM_FILE, run_all, run_claim_experiment
from papers_eval import load_claim


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]


@pytest.mark.slow  # about a minute: two spawned workers import torch and train
def test_two_workers_give_the_results_of_one_and_a_rerun_comes_from_the_cache(
    tmp_path, monkeypatch
):
    """The shared job runner with --jobs 2 gives bit for bit what --jobs 1 gives (one torch
    thread a job either way), and a rerun loads every job from the cache instead of training."""
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    spec = yaml.safe_load(CLAIM_FILE.read_text())
    settings = {**spec["settings"], **spec["quick"]["settings"]}
    runs = [("lrrf", (("lam_ctir", 1.0), ("lam_drm", 1.0)), 0), ("seq_at", (("lr", 0.05),), 0)]
    options = {"fresh": False, "scheduler": None}
    parallel = run_all(runs, settings, {**options, "workers": 2}, stage="test")
    sequential = run_all(runs, settings, {**options, "workers": 1, "fresh": True}, stage="test")
    assert not any(result.cached for result in parallel + sequential)
    for mine, theirs in zip(parallel, sequential, strict=True):
        assert_same_outcome(mine.value, theirs.value)
    rerun = run_all(runs, settings, {**options, "workers": 2}, stage="test")
    assert all(result.cached for result in rerun)
    for mine, theirs in zip(rerun, sequential, strict=True):
        assert_same_outcome(mine.value, theirs.value)


def assert_same_outcome(mine: dict, theirs: dict) -> None:
    assert mine.keys() == theirs.keys()
    for key in ("aa", "forgetting", "bwt", "clean_acc", "_r"):
        assert np.array_equal(mine[key], theirs[key]), key
    for key in ("val_aa", "_square", "_diagnostics", "_tasks"):
        assert mine[key] == theirs[key], key
