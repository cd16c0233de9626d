import pytest

from tcwm.claim import run_claim_experiment
from papers_eval import load_claim


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls_and_replicates(tmp_path):
    outcome = run_claim_experiment(["--replicate", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json", require_v3=True)
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    registered = record["judgements"]["registered"]["verdict"]
    replicated = record["judgements"]["replication"]["verdict"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert registered == ("held" if method_passed else "did not hold")
    both = {registered, replicated}
    assert record["verdict"] == (both.pop() if len(both) == 1 else "mixed")
    assert outcome["verdict"] == record["verdict"]
