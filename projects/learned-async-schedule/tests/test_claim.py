import pytest

from async_schedule.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_claim_experiment(tmp_path):
    """The full miniature (about 12 minutes on 2 cores): LAS matches the best hand-tuned schedule
    (within 5%) and, probe included, reaches the synchronous seed-mean final FD-digit in fewer
    steps than the synchronous baseline (which reaches it within its budget by definition). The
    second part did not hold in the committed run (results/claim.md) and is reported as xfail."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    budget = record["config"]["main_steps"]
    las, sync = metrics["learned (LAS)"], metrics["synchronous"]
    hand = min(
        metrics["sfd (best of grid)"]["fd_digit"], metrics["power (best of grid)"]["fd_digit"]
    )
    assert las["fd_digit"] <= 1.05 * hand
    assert sync["steps_to_sync_final"] <= budget
    faster_than_sync = las["steps_to_sync_final"] < sync["steps_to_sync_final"]
    assert faster_than_sync == record["holds"]
    if not faster_than_sync:
        pytest.xfail("LAS ties synchronous but never reaches its final FD-digit (claim.md)")
