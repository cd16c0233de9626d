import pytest

from survival_delay.cli import run_claim_experiment


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    """The full claim experiment (~10 min on 2 cores): direction and margin, not exact numbers."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    for w in ("0.25", "0.5"):
        transfer = metrics["transfer"][f"rmse_w{w}"]["mean"]
        for other in ("naive", "naive_transfer", "ipw", "target_only", "source_only"):
            assert transfer < metrics[other][f"rmse_w{w}"]["mean"], (w, other)
        assert metrics["naive"][f"bias_w{w}"]["mean"] < -0.05
        assert metrics["transfer_mcem"][f"abs_gap_to_direct_w{w}"] < 0.01
