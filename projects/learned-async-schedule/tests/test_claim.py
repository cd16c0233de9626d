import pytest

from async_schedule.cli import run_claim_experiment
from papers_eval import load_results


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    """The full miniature (about 12 minutes on 2 cores): LAS matches the best hand-tuned schedule
    (within 5%) and, probe included, reaches the synchronous final FD-digit in fewer steps."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    budget = load_results(tmp_path / "claim.json")["config"]["main_steps"]
    las = metrics["learned (LAS)"]
    hand = min(metrics["sfd (D=0.3)"]["fd_digit"], metrics["power (best of grid)"]["fd_digit"])
    assert las["fd_digit"] <= 1.05 * hand
    assert las["steps_to_sync_final"] < budget
