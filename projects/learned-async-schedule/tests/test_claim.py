from types import SimpleNamespace

import pytest

from async_schedule.claim import CLAIM_FILE, METRICS, SUBJECTS, diagnose, run_claim_experiment
from papers_eval import judge, load_claim, load_claim_spec
from papers_eval.diagnosis import resolve


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


def _record(in_family_passes=True, las_passes=False, same_f_star=True, precondition=True):
    """A record with the fields ``diagnose`` reads (values of the shape a run writes)."""

    def outcome(passed, estimate):
        return {"passed": passed, "advantage": {"estimate": estimate, "ci": [0, 0]}}

    check = "beats_synchronous"
    return {
        "verdict": "held" if las_passes else "did not hold",
        "outcomes": {
            "las": {check: outcome(las_passes, 0.3), "matches_best_hand_tuned": outcome(False, -2)},
            "zero_probe": {check: outcome(False, -0.5)},
            "in_family_lag": {check: outcome(in_family_passes, 4.0 if in_family_passes else -20)},
        },
        "controls": [
            {"name": "zero_probe", "role": "negative", "behaved": True},
            {"name": "in_family_lag", "role": "positive", "behaved": in_family_passes},
        ],
        "preconditions": [{"name": "asynchrony_pays", "passed": precondition,
                           "advantage": {"estimate": 5.0 if precondition else -1.0}}],
        "evidence": {
            "reach": {"in_family_member_to_its_sfd_path": 0.078, "best_member_to_winner": 0.09},
            "long_probe": {
                "steps": 1000,
                "f_star_sup_distance": 0.004 if same_f_star else 0.2,
                "starts": {
                    "identity_start": {"max_lag_frozen": 0.001},
                    "strong_lag_start": {"max_lag_frozen": 0.003 if same_f_star else 0.2},
                },
            },
            "tuning_edges": {
                "power": {"param": "power_exponent", "chosen": 5.0, "low": 2.0, "high": 10.0,
                          "at_edge": False},
                "sfd": {"param": "sfd_delta", "chosen": 0.95, "low": 0.6, "high": 0.95,
                        "at_edge": True},
            },
        },
        "budget": {"gap": {"1": -0.5, "2": -0.4}},
    }  # fmt: skip


SPEC = SimpleNamespace(
    method="las",
    controls=[
        SimpleNamespace(name="zero_probe", checks=("beats_synchronous",)),
        SimpleNamespace(name="in_family_lag", checks=("beats_synchronous",)),
    ],
)


def _causes(record):
    findings = diagnose(record, spec=SPEC)
    for f in findings:  # every cite resolves to a number of the record
        for cite in f.evidence:
            assert isinstance(resolve(record, cite.path), int | float), cite.path
    return [(f.cause, f.summary) for f in findings]


def test_diagnosis_rules_cite_the_record():
    assert diagnose(_record(las_passes=True), spec=SPEC) == []
    # the in-family control fails: one check finding for it, no verdict on the idea
    causes = _causes(_record(in_family_passes=False))
    assert [c for c, _ in causes] == ["check", "check"]
    assert causes[0][1].startswith("the in-family control failed beats_synchronous:")
    assert "sfd's tuned sfd_delta (0.95) sits at an end" in causes[1][1]
    # the control passes, both long probes land on the same f* at synchrony: idea
    causes = _causes(_record())
    assert causes[0][0] == "idea" and "lands on the same f*, at synchrony" in causes[0][1]
    # ... landing apart: undetermined (the probe has not converged)
    causes = _causes(_record(same_f_star=False))
    assert causes[0][0] == "undetermined" and "different f*" in causes[0][1]
    # a failed precondition is a check finding citing its advantage
    causes = _causes(_record(precondition=False))
    assert causes[0][0] == "check" and "precondition asynchrony_pays failed" in causes[0][1]
