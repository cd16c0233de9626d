import pytest

from ibci_fewshot.claim import run_claim_experiment
from papers_eval import load_claim

# What a run records beside its numbers: times, dates, the machine, the job summary (and the
# training times, which the evidence keeps).
RUN_FACTS = ("wall_time_s", "created", "command", "hardware", "provenance", "jobs")


def numbers(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in RUN_FACTS}
    out["evidence"] = {k: v for k, v in record["evidence"].items() if k != "train_time_s"}
    return out


@pytest.mark.slow  # about 2 min: three --quick runs, one on two spawned workers
def test_two_workers_give_the_one_worker_record_and_a_rerun_is_cached(tmp_path):
    """The shared job runner: --jobs 2 (backbones trained, adapted and decoded in two worker
    processes) writes the record --jobs 1 writes, number for number, and a second run loads
    every job from the cache instead of running it."""
    run_claim_experiment(["--quick", "--jobs", "1", "--out", str(tmp_path / "one")])
    run_claim_experiment(["--quick", "--jobs", "2", "--fresh", "--out", str(tmp_path / "two")])
    one, two = (load_claim(tmp_path / name / "claim.json") for name in ("one", "two"))
    assert numbers(two) == numbers(one)
    assert one["jobs"]["ran"] == two["jobs"]["ran"] == one["jobs"]["jobs"] > 1
    run_claim_experiment(["--quick", "--jobs", "2", "--out", str(tmp_path / "again")])
    again = load_claim(tmp_path / "again" / "claim.json")
    assert again["jobs"]["cached"] == again["jobs"]["jobs"] and again["jobs"]["ran"] == 0
    assert numbers(again) == numbers(one)


@pytest.mark.slow
def test_the_claim_run_judges_method_and_controls(tmp_path):
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert len(record["seeds"]) >= 3 and not record["quick"]
    behaved = all(control["behaved"] for control in record["controls"])
    met = all(p["passed"] for p in record["preconditions"])
    method_passed = all(o["passed"] for o in record["outcomes"][record["method"]].values())
    if behaved and met:
        assert record["verdict"] == ("held" if method_passed else "did not hold")
    else:
        assert record["verdict"] == "not shown", record["verdict_reason"]
    if record["verdict"] != "held":
        assert record["diagnosis"], "a verdict that is not held carries a diagnosis"
    assert outcome["verdict"] == record["verdict"]
