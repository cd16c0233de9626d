import pytest

from atwu.claim import HEURISTICS, run_claim_experiment
from atwu.model import PROBABILITY_WEIGHTED, SAMPLE_LEVEL
from papers_eval import load_results


@pytest.mark.slow
def test_claim_experiment(tmp_path):
    """The full claim experiment (~7 minutes on 2 cores). Asserts the run is complete and that the
    recorded verdict is the criterion applied to the recorded metrics, then the claim itself: it
    did not hold in the committed run (results/claim.md), which is reported as xfail."""
    metrics = run_claim_experiment(["--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    reference = record["extra"]["reference"]
    full, retain = reference["full model"], reference["retain model"]
    assert full["forget_rouge"] > 0.9, "the full model must have memorised the forget authors"
    assert retain["forget_quality"] == pytest.approx(1.0)
    baselines = (*SAMPLE_LEVEL, *PROBABILITY_WEIGHTED)
    atwu = metrics["atwu"]
    best_heuristic = max(
        max(metrics[m].get("span_auroc", 0.0), metrics[m].get("span_auroc_start", 0.0))
        for m in HEURISTICS
    )
    claim = (
        all(atwu["tradeoff_fq"] > metrics[b]["tradeoff_fq"] for b in baselines)
        and atwu["span_auroc"] >= best_heuristic + 0.05
    )
    assert claim == record["holds"]
    if not claim:
        pytest.xfail("ATWU ties WGA on the trade-off and its weights miss the spans (claim.md)")
