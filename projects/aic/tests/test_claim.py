import pytest

from aic.cli import run_claim_experiment


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    assert metrics["method"]["val_mse"] < 0.5 * metrics["mean_baseline"]["val_mse"]
