import pytest

from graphmet.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_what_held_still_holds(tmp_path):
    """The full claim experiment (~7 minutes on 2 cores): the parts that held in the committed
    run (message passing loses activity and small-scale energy; GraphMet is cheaper per member)."""
    run_claim_experiment(["--out", str(tmp_path)])
    checks = load_results(tmp_path / "claim.json")["extra"]["checks"]
    assert checks["gnn_activity_decays"] and checks["gnn_r_hi_decays"]
    assert checks["graphmet_cheaper_per_member"]


@pytest.mark.slow
@pytest.mark.xfail(
    raises=AssertionError,
    strict=False,
    reason="did not reproduce in the miniature: GNN-4 beats GraphMet on long-lead RMSE, "
    "activity and small-scale energy (results/claim.md); an XPASS means it now does",
)
def test_paper_claim_holds_in_the_miniature(tmp_path):
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    checks = record["extra"]["checks"]
    assert metrics["graphmet"]["rmse_long"] < metrics["gnn4"]["rmse_long"]
    assert checks["graphmet_activity_closer"] and checks["graphmet_r_hi_closer"]
    assert record["holds"]
