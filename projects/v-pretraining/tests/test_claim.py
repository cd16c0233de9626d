import pytest

from papers_eval import load_claim
from vpretrain.claim import run_claim_experiment


def verdict_follows(record) -> str:
    if not all(p["passed"] for p in record["preconditions"]):
        return "not shown"
    if not all(c["behaved"] for c in record["controls"]):
        return "not shown"
    method = record["outcomes"][record["method"]].values()
    return "held" if all(o["passed"] for o in method) else "did not hold"


def test_reproduce_quick_writes_a_judged_record(tmp_path):
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "v-pretraining" and record["quick"]
    assert record["verdict"] == outcome["verdict"] == verdict_follows(record)
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    metrics = record["metrics"]
    assert {"vpretrain", "plain", "fixed_soft", "oracle", "random_gradient"} <= set(metrics)
    assert metrics["vpretrain"]["steps"]["mean"] < metrics["plain"]["steps"]["mean"]  # wall-clock
    assert "mass_auroc" in record["evidence"]["designer"]["vpretrain"]
    for figure in record["figures"]:
        assert (tmp_path / figure).is_file()


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    assert record["verdict"] == outcome["verdict"] == verdict_follows(record)
