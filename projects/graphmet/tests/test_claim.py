import pytest

from graphmet.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    """The full claim experiment (~10 minutes on 2 cores); asserts direction, not numbers."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    checks = record["extra"]["checks"]
    assert checks["graphmet_cheaper_per_member"]
    assert metrics["graphmet"]["rmse_long"] < metrics["gnn4"]["rmse_long"]
    assert checks["gnn_activity_decays"] and checks["graphmet_activity_closer"]
    assert checks["gnn_r_hi_decays"] and checks["graphmet_r_hi_closer"]
    assert record["holds"]
