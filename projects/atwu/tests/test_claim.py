import pytest

from atwu.claim import HEURISTICS, run_claim_experiment
from atwu.model import PROBABILITY_WEIGHTED, SAMPLE_LEVEL


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    atwu = metrics["atwu"]
    for baseline in (*SAMPLE_LEVEL, *PROBABILITY_WEIGHTED):
        assert atwu["tradeoff_fq"] > metrics[baseline]["tradeoff_fq"], baseline
    best_heuristic = max(
        max(metrics[m].get("span_auroc", 0.0), metrics[m].get("span_auroc_start", 0.0))
        for m in HEURISTICS
    )
    assert atwu["span_auroc"] >= best_heuristic + 0.05
