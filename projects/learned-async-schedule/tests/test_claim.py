import pytest

from async_schedule.claim import CLAIM_FILE, METRICS, SUBJECTS, run_claim_experiment
from papers_eval import judge, load_claim, load_claim_spec


@pytest.mark.slow
def test_claim_experiment(tmp_path):
    """The full miniature (about an hour on 2 cores): the record is complete, the verdict is
    the one papers_eval computes from the pre-registered checks, and the controls are judged."""
    outcome = run_claim_experiment(["--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS)
    assert record["verdict"] == judge(spec, outcome["results"]).verdict == outcome["verdict"]
    assert record["seeds"] == [0, 1, 2]
    assert {c["name"] for c in record["controls"]} == {"zero_probe", "in_family_lag"}
    assert set(record["tuning"]["trials"]) >= {"power", "sfd"}
