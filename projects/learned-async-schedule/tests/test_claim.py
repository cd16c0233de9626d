import pytest

from async_schedule.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    """The full miniature (about 12 minutes on 2 cores): LAS matches the best hand-tuned schedule
    (within 5%) and, probe included, reaches the synchronous seed-mean final FD-digit in fewer
    steps than the synchronous baseline (which reaches it within its budget by definition)."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    budget = load_results(tmp_path / "claim.json")["config"]["main_steps"]
    las, sync = metrics["learned (LAS)"], metrics["synchronous"]
    hand = min(
        metrics["sfd (best of grid)"]["fd_digit"], metrics["power (best of grid)"]["fd_digit"]
    )
    assert las["fd_digit"] <= 1.05 * hand
    assert sync["steps_to_sync_final"] <= budget
    assert las["steps_to_sync_final"] < sync["steps_to_sync_final"]
