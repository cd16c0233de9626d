import pytest

from permflow.cli import run_claim_experiment


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    for task in ("sorting", "slap"):
        flow, sink = metrics[f"{task}: permflow"], metrics[f"{task}: sinkhorn"]
        assert flow["both_modes"] >= 0.8 and sink["both_modes"] <= 0.05
        assert flow["violation"] < 1e-4 < sink["violation"]
    best = max(
        metrics[f"sorting: {b}"]["unambiguous_accuracy"]
        for b in ("sinkhorn", "gumbel_sinkhorn (noiseless)", "gumbel_sinkhorn (noisy)")
    )
    assert metrics["sorting: permflow"]["unambiguous_accuracy"] >= best - 0.05
