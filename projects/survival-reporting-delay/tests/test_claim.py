import pytest

from papers_eval import judge, load_claim, load_claim_spec, reproducible_part
from survival_delay.claim import CLAIM_FILE, METRICS, SUBJECTS, run_claim_experiment


def numbers(record: dict) -> dict:
    return reproducible_part(record)  # no run facts, no budget timings


@pytest.mark.slow  # about 90 s: three --quick runs, one on two spawned workers
def test_two_workers_give_the_one_worker_record_and_a_rerun_is_cached(tmp_path):
    """The shared job runner: --jobs 2 writes the record --jobs 1 writes, number for number,
    and a second run loads every job from the cache instead of running it."""
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
def test_the_full_claim_run_is_judged_by_its_pre_registered_checks(tmp_path):
    """The full claim experiment (about 10 minutes on 2 cores): the controls behave (naive
    fails, full information passes), and the recorded verdict is the one papers_eval computes from
    the per-seed results again."""
    out = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert all(control["behaved"] for control in record["controls"]), record["controls"]
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS)
    assert judge(spec, out["results"]).verdict == record["verdict"]
    assert record["seeds"] == list(range(10))
    sweep = record["evidence"]["misspecified_delay_sweep"]
    assert set(sweep) == {"lognormal_fitted_weibull", "weibull_fitted_lognormal"}
