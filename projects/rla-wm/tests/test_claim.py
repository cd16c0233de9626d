import pytest

from rlawm.claim import run_claim_experiment
from papers_eval import load_claim


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert all(control["behaved"] for control in record["controls"]), record["verdict_reason"]
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    assert record["verdict"] == ("held" if method_passed else "did not hold")
    assert outcome["verdict"] == record["verdict"]
