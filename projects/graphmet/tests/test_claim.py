import pytest

from graphmet.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_claim_experiment(tmp_path):
    """The full claim experiment (~7 minutes on 2 cores). Asserts the parts that held in the
    committed run (message passing loses activity and small-scale energy; GraphMet is cheaper
    per member); the paper's accuracy claim did not reproduce there and is reported as xfail."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    checks = record["extra"]["checks"]
    assert checks["gnn_activity_decays"] and checks["gnn_r_hi_decays"]
    assert checks["graphmet_cheaper_per_member"]
    accuracy_claim = (
        metrics["graphmet"]["rmse_long"] < metrics["gnn4"]["rmse_long"]
        and checks["graphmet_activity_closer"]
        and checks["graphmet_r_hi_closer"]
    )
    assert accuracy_claim == record["holds"]
    if not accuracy_claim:
        pytest.xfail("GNN-4 still beats GraphMet on long-lead RMSE/activity (results/claim.md)")
