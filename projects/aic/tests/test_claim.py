import pytest

from aic.claim import run_claim_experiment
from papers_eval import load_claim


def test_reproduce_quick_writes_a_schema_2_record(tmp_path):
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "aic" and record["quick"]
    assert record["verdict"] == outcome["verdict"]
    assert {c["name"] for c in record["controls"]} == {
        "one_step",
        "random_halting",
        "oracle_halting",
    }
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "frontier.png").is_file()
    assert "precondition" in record["evidence"]


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    if all(control["behaved"] for control in record["controls"]):
        method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
        assert record["verdict"] == ("held" if method_passed else "did not hold")
    else:
        assert record["verdict"] == "not shown"
    assert outcome["verdict"] == record["verdict"]
