import math
import re
from pathlib import Path

import pytest

from aic import claim
from aic.claim import run_claim_experiment
from papers_eval import load_claim

CLAIM_YAML = Path(__file__).resolve().parents[1] / "configs" / "claim.yaml"

# What a run records beside its numbers: times, dates, the machine, the job summary (and the
# training times, which the evidence keeps).
RUN_FACTS = ("wall_time_s", "created", "command", "hardware", "provenance", "jobs")


def numbers(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in RUN_FACTS}
    out["evidence"] = {k: v for k, v in record["evidence"].items() if k != "train_seconds"}
    return out


def test_reproduce_quick_replicate_writes_a_judged_protocol_3_record(tmp_path):
    """The claim pipeline end to end (--quick --replicate, about 30 s): a protocol-3 record whose
    verdict papers_eval computed on both seed sets, the controls with their kinds, and, since the
    quick run fails a check, the budget evidence (1x and 2x training) and a diagnosis whose every
    citation resolves to a recorded number."""
    outcome = run_claim_experiment(["--quick", "--replicate", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json", require_v3=True)
    assert record["project"] == "aic" and record["quick"] and record["protocol"] == 3
    assert record["judgements"]["registered"]["verdict"] == outcome["verdict"]
    assert record["replication"]["run"] and record["replication"]["seeds"] == [3]
    assert {c["name"]: c["kind"] for c in record["controls"]} == {
        "one_step": "negative",
        "random_halting": "negative",
        "oracle_halting": "oracle",
    }
    assert record["budget"]["multipliers"] == [1.0, 2.0]
    assert set(record["budget"]["points"]) == {"aic", record["budget"]["rival"]}
    assert record["diagnosis"] and all(
        math.isfinite(c["value"]) for f in record["diagnosis"] for c in f["evidence"]
    )
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "frontier.png").is_file()
    assert "precondition" in record["evidence"] and "replication" in record["evidence"]


def _bad_claim(tmp_path, monkeypatch, pattern: str, replacement: str) -> None:
    spec, count = re.subn(pattern, replacement, CLAIM_YAML.read_text())
    assert count == 1, pattern  # the line was found and changed
    bad = tmp_path / "claim.yaml"
    bad.write_text(spec)
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "run_jobs", lambda *a, **k: pytest.fail("trained first"))


@pytest.mark.parametrize(
    "pattern, replacement, message",
    [
        (r"(?m)^seeds: \[.*\]$", "seeds: [0]", "at least 3 seeds"),
        (r"(?m)^  seeds: \[3, 4, 5\]$", "  seeds: [2, 3, 4]", "overlap"),
        (r"(?m)^      kind: oracle$", "", "kind: oracle"),
        (r"(?m)^      pipeline: model$", "", "pipeline"),
        (r"(?m)^protocol: 3$", "protocol: 4", "protocol"),
    ],
    ids=["one_seed", "replication_overlaps", "oracle_without_kind", "no_pipeline", "protocol"],
)
def test_a_bad_claim_file_stops_before_any_fit(
    tmp_path, monkeypatch, pattern, replacement, message
):
    _bad_claim(tmp_path, monkeypatch, pattern, replacement)
    with pytest.raises(ValueError, match=message):
        run_claim_experiment(["--allow-dirty", "--out", str(tmp_path / "out")])


def test_the_registered_claim_is_protocol_3_with_disjoint_replication_and_pilot_seeds():
    from papers_cli import reproduce_parser
    from papers_eval import load_claim_spec

    args = reproduce_parser("x", project_file=claim.CLAIM_FILE).parse_args(["--allow-dirty"])
    spec = load_claim_spec(
        claim.CLAIM_FILE, subjects=claim.SUBJECTS, metrics=claim.METRICS, args=args
    )
    pilots = {10, 11, 12}  # results/pilots/ (budget_pilot.py, head_quality.py)
    assert spec.protocol == 3 and len(spec.seeds) >= 3 and len(spec.replication_seeds) >= 3
    assert not (set(spec.seeds) | set(spec.replication_seeds)) & pilots
    assert spec.settings["budget_multipliers"] == [1, 2]


def test_budget_scales_only_the_epochs():
    settings = {"budget": {"trainer.max_epochs": 12, "data.n_train": 12000}, "episodes": 200}
    doubled = claim.scaled_budget(settings, 2.0)
    assert doubled["budget"] == {"trainer.max_epochs": 24, "data.n_train": 12000}
    assert settings["budget"]["trainer.max_epochs"] == 12  # not edited in place
    assert claim.scaled_budget(settings, 1.0) is settings


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
