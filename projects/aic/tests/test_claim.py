import pytest

from aic.claim import run_claim_experiment
from papers_eval import load_claim

# What a run records beside its numbers: times, dates, the machine, the job summary (and the
# training times, which the evidence keeps).
RUN_FACTS = ("wall_time_s", "created", "command", "hardware", "provenance", "jobs")


def numbers(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in RUN_FACTS}
    out["evidence"] = {k: v for k, v in record["evidence"].items() if k != "train_seconds"}
    return out


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


@pytest.mark.slow  # about 90 s: three --quick runs, one training on two spawned workers
def test_two_workers_give_the_one_worker_record_and_a_rerun_is_cached(tmp_path):
    """The shared job runner: training AIC and the fixed network in two worker processes gives
    the record training them here gives, number for number, and a second run loads both fits
    from the cache instead of training again."""
    run_claim_experiment(["--quick", "--jobs", "1", "--out", str(tmp_path / "one")])
    run_claim_experiment(["--quick", "--jobs", "2", "--fresh", "--out", str(tmp_path / "two")])
    one, two = (load_claim(tmp_path / name / "claim.json") for name in ("one", "two"))
    assert numbers(two) == numbers(one)
    assert one["jobs"]["ran"] == two["jobs"]["ran"] == one["jobs"]["jobs"] == 2
    run_claim_experiment(["--quick", "--jobs", "2", "--out", str(tmp_path / "again")])
    again = load_claim(tmp_path / "again" / "claim.json")
    assert again["jobs"]["cached"] == 2 and again["jobs"]["ran"] == 0
    assert numbers(again) == numbers(one)


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
