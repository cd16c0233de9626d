"""Claim protocol v3 on hand-made outcomes: replication and the combined verdict, zero seed
variation, control kinds and pipelines, ceilings, provenance (dirty tree, command line),
re-specification history, diagnosis citing recorded numbers, schema 3 beside schema 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from papers_eval import (
    ClaimSpecError,
    DiagnosisError,
    RecordSchemaError,
    Replication,
    attach_diagnosis,
    combined_verdict,
    finding,
    judge,
    load_claim,
    load_claim_spec,
    rediagnose,
    write_claim,
)
from papers_eval.stats import NO_SEED_VARIATION

SUBJECTS = ("method", "baseline", "broken", "oracle", "true_latent")
METRICS = ("error",)


def v3_spec(**overrides) -> dict:
    spec = {
        "protocol": 3,
        "claim": "The method has lower error than the baseline.",
        "method": "method",
        "baselines": ["baseline"],
        "controls": {
            "negative": [{"name": "broken", "why": "no mechanism"}],
            "positive": [
                {
                    "name": "oracle",
                    "kind": "oracle",
                    "pipeline": "model",
                    "why": "the method's estimator fitted on the true labels",
                }
            ],
            "ceiling": [{"name": "true_latent", "why": "the decoder fed the true latent"}],
        },
        "seeds": [0, 1, 2],
        "replication": {"seeds": [10, 11, 12]},
        "checks": [
            {"name": "beats_baseline", "metric": "error", "goal": "lower", "against": "baseline"}
        ],
        "quick": {"seeds": [0]},
    }
    spec.update(overrides)
    return spec


def load(tmp_path, quick=False, **overrides):
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(v3_spec(**overrides)))
    return load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, quick=quick)


def results(errors: dict[str, float], seeds=(0, 1, 2), n_items=40) -> dict:
    out = {}
    for subject, mean in errors.items():
        out[subject] = {
            "error": [
                mean + 0.05 * np.random.default_rng(seed).standard_normal(n_items) for seed in seeds
            ]
        }
    return out


GOOD = {"method": 0.3, "baseline": 1.0, "broken": 1.2, "oracle": 0.1, "true_latent": 2.0}
BAD = {**GOOD, "method": 1.1}


def write(tmp_path, spec, main, replication=None, out="results", **kwargs):
    judgement = judge(spec, main)
    rep = None
    if replication is not None:
        rspec = spec.for_replication()
        rep = Replication(rspec, replication, judge(rspec, replication))
    return write_claim(
        tmp_path / out,
        project="demo",
        spec=spec,
        results=main,
        judgement=judgement,
        config={},
        wall_time_s=kwargs.pop("wall_time_s", 1.0),
        replication=rep,
        **kwargs,
    )


# replication and the combined verdict


def test_a_replication_that_agrees_keeps_the_verdict_and_one_that_disagrees_is_mixed(tmp_path):
    spec = load(tmp_path)
    rseeds = spec.for_replication().seeds
    assert rseeds == (10, 11, 12)
    held = load_claim(write(tmp_path, spec, results(GOOD), results(GOOD, rseeds)))
    assert held["verdict"] == "held"
    assert held["judgements"]["replication"]["verdict"] == "held"
    assert held["replication"]["seeds"] == [10, 11, 12]
    flipped = load_claim(write(tmp_path, spec, results(GOOD), results(BAD, rseeds), out="b"))
    assert flipped["verdict"] == "mixed"
    assert "did not hold on the replication seeds [10, 11, 12]" in flipped["verdict_reason"]
    md = (tmp_path / "b" / "claim.md").read_text()
    assert "## Replication on seeds [10, 11, 12]: did not hold" in md
    other_way = load_claim(write(tmp_path, spec, results(BAD), results(GOOD, rseeds), out="c"))
    assert other_way["verdict"] == "mixed"
    unreplicated = load_claim(write(tmp_path, spec, results(GOOD), out="d"))
    assert unreplicated["verdict"] == "held, not replicated"
    assert "(replication not run)" in unreplicated["verdict_reason"]


def test_not_shown_on_either_seed_set_wins(tmp_path):
    spec = load(tmp_path)
    main = judge(spec, results(GOOD))
    rspec = spec.for_replication()
    broken_oracle = judge(rspec, results({**GOOD, "oracle": 1.5}, rspec.seeds))
    assert broken_oracle.verdict == "not shown"
    verdict, reason = combined_verdict(main, broken_oracle)
    assert verdict == "not shown" and "replication seeds" in reason
    assert combined_verdict(broken_oracle, main)[0] == "not shown"
    bad = judge(spec, results(BAD))
    assert combined_verdict(bad, judge(rspec, results(BAD, rspec.seeds)))[0] == "did not hold"
    assert combined_verdict(bad, None)[0] == "did not hold"


def test_replication_seeds_are_required_disjoint_and_checked(tmp_path):
    with pytest.raises(ClaimSpecError, match="replication"):
        load(tmp_path, replication=None)
    with pytest.raises(ClaimSpecError, match="overlap"):
        load(tmp_path, replication={"seeds": [2, 3, 4]})
    with pytest.raises(ClaimSpecError, match="at least 3 seeds"):
        load(tmp_path, replication={"seeds": [10]})
    assert load(tmp_path, quick=True, replication=None).replication_seeds == ()
    protocol_2 = {k: v for k, v in v3_spec().items() if k not in ("protocol", "replication")}
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(protocol_2))
    spec = load_claim_spec(tmp_path / "v2.yaml", subjects=SUBJECTS, metrics=METRICS)
    assert spec.protocol == 2
    with pytest.raises(ClaimSpecError, match="--replicate needs"):
        spec.for_replication()


# intervals: a metric the seed does not move


def test_identical_per_seed_scalars_get_no_interval_and_fail(tmp_path):
    spec = load(tmp_path, checks=[{"name": "low", "metric": "error", "goal": "lower",
                                   "threshold": 0.5}])  # fmt: skip
    flat = {s: {"error": [0.49, 0.49, 0.49]} for s in SUBJECTS}
    outcome = judge(spec, flat).outcomes["method"]["low"]
    assert outcome.advantage.method == NO_SEED_VARIATION
    assert not outcome.passed  # the review's 0.49 under a 0.5 bar passed with [0.01, 0.01]
    varying = {s: {"error": [0.40, 0.41, 0.42]} for s in SUBJECTS}
    assert judge(spec, varying).outcomes["method"]["low"].passed


# controls: kinds, pipelines, ceilings


@pytest.mark.parametrize(
    ("positive", "message"),
    [
        ({"name": "oracle", "pipeline": "model", "why": "w"}, "needs kind: oracle"),
        ({"name": "oracle", "kind": "ceiling", "pipeline": "model", "why": "w"}, "has kind"),
        ({"name": "oracle", "kind": "oracle", "why": "w"}, "needs pipeline"),
        ({"name": "oracle", "kind": "oracle", "pipeline": "model"}, "needs a `why`"),
        (
            {"name": "oracle", "kind": "oracle", "pipeline": "bypass", "why": "true params"},
            "bypasses the project's model code",
        ),
        ({"name": "oracle", "kind": "in_family", "pipeline": "sideways", "why": "w"}, "pipeline"),
    ],
)
def test_a_positive_control_must_be_an_oracle_or_in_family_through_the_model(
    tmp_path, positive, message
):
    controls = {**v3_spec()["controls"], "positive": [positive]}
    with pytest.raises(ClaimSpecError, match=message):
        load(tmp_path, controls=controls)


def test_a_bypassing_control_is_accepted_only_with_its_reason(tmp_path):
    positive = {
        "name": "oracle",
        "kind": "in_family",
        "pipeline": "bypass",
        "pipeline_why": "the same sampler and metrics, with the family member set by hand",
        "why": "the best member of the method's family, found on the test distribution",
    }
    spec = load(tmp_path, controls={**v3_spec()["controls"], "positive": [positive]})
    (control,) = [c for c in spec.controls if c.role == "positive"]
    assert (control.kind, control.pipeline) == ("in_family", "bypass")
    record = load_claim(write(tmp_path, spec, results(GOOD)))
    md = (tmp_path / "results" / "claim.md").read_text()
    assert "positive control, in-family" in md and "Bypasses the model code" in md
    assert record["controls"][1]["kind"] == "in_family"


def test_a_ceiling_is_reported_but_never_judged(tmp_path):
    spec = load(tmp_path)
    assert [c.name for c in spec.ceilings] == ["true_latent"]
    judgement = judge(spec, results(GOOD))  # the ceiling fails the check badly ...
    assert not judgement.outcomes["true_latent"]["beats_baseline"].passed
    assert judgement.verdict == "held"  # ... and the verdict does not care
    assert [c.name for c in judgement.controls] == ["broken", "oracle"]
    record = load_claim(write(tmp_path, spec, results(GOOD)))
    (ceiling,) = record["ceilings"]
    assert ceiling["name"] == "true_latent" and not ceiling["outcomes"]["beats_baseline"]["passed"]
    text = (tmp_path / "results" / "claim.md").read_text()
    assert "(ceiling; reported, never judged)" in text
    assert text.count("| true_latent | ceiling |") == 1  # one row in the outcome table


# provenance


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                   cwd=cwd, check=True, capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "claim.yaml").write_text(yaml.safe_dump(v3_spec()))
    (tmp_path / "core.py").write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "code")
    return tmp_path


def test_a_full_run_refuses_a_dirty_tree_unless_allowed_and_then_says_so(repo):
    (repo / "core.py").write_text("x = 2\n")
    path = repo / "configs" / "claim.yaml"
    with pytest.raises(ClaimSpecError, match="uncommitted changes"):
        load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    assert load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, quick=True).quick

    class Args:
        quick, seeds, allow_dirty = False, None, True

    spec = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS, args=Args())
    assert spec.allow_dirty
    record = load_claim(write(repo, spec, results(GOOD)))
    assert record["provenance"]["dirty"] and record["provenance"]["allow_dirty"]
    assert record["git_revision"].endswith("+dirty")
    assert (
        "uncommitted changes (allowed with --allow-dirty)"
        in (repo / "results" / "claim.md").read_text()
    )


def test_the_record_keeps_the_whole_command_line(tmp_path):
    script = (
        "import sys, json; sys.argv = ['reproduce', '--quick'];"
        "from papers_eval.claim_record import _command_line; print(_command_line())"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    command = out.stdout.strip()
    assert command.startswith("python") and "-c" in command and "_command_line" in command


# re-specification


def test_changing_the_spec_after_a_judged_run_keeps_the_earlier_record(repo):
    path = repo / "configs" / "claim.yaml"
    spec = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    first = load_claim(write(repo, spec, results(GOOD)))
    assert first["respecified_after"] is None
    again = load_claim(write(repo, spec, results(GOOD)))  # a rerun of the same spec
    assert again["respecified_after"] is None and not (repo / "results" / "history").exists()
    path.write_text(yaml.safe_dump(v3_spec(seeds=[0, 1, 2, 3])))
    git(repo, "commit", "-qam", "more seeds, after seeing the outcome")
    changed = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    rerun = load_claim(write(repo, changed, results(GOOD, seeds=(0, 1, 2, 3))))
    revision = first["git_revision"]
    assert rerun["respecified_after"] == revision
    kept = repo / "results" / "history" / revision[:12] / "claim.json"
    assert json.loads(kept.read_text())["seeds"] == [0, 1, 2]
    md = (repo / "results" / "claim.md").read_text()
    assert f"Re-specified after {revision}, outcome known" in md
    # rerunning the re-specified spec keeps the mark and does not archive again
    assert (
        load_claim(write(repo, changed, results(GOOD, seeds=(0, 1, 2, 3))))["respecified_after"]
        == revision
    )
    assert len(list((repo / "results" / "history").iterdir())) == 1


def test_a_figure_redrawn_by_the_respecified_run_stays_and_the_stale_one_moves(repo):
    """Projects draw figures before write_claim, under the names the earlier record used: the
    new drawing must not be archived as the earlier run's."""
    path = repo / "configs" / "claim.yaml"
    spec = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    out = repo / "results"
    out.mkdir(exist_ok=True)
    for name in ("redrawn.png", "dropped.png"):
        (out / name).write_text("earlier run")
    past = time.time() - 3600
    for name in ("redrawn.png", "dropped.png"):
        os.utime(out / name, (past, past))
    first = load_claim(
        write(repo, spec, results(GOOD), figures=["redrawn.png", "dropped.png"], wall_time_s=1.0)
    )
    path.write_text(yaml.safe_dump(v3_spec(seeds=[0, 1, 2, 3])))
    git(repo, "commit", "-qam", "re-specified")
    changed = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    (out / "redrawn.png").write_text("this run")  # drawn by the new run, before its record
    write(repo, changed, results(GOOD, seeds=(0, 1, 2, 3)), figures=["redrawn.png"],
          wall_time_s=60.0)  # fmt: skip
    history = out / "history" / first["git_revision"][:12]
    assert (out / "redrawn.png").read_text() == "this run"
    assert not (history / "redrawn.png").exists()
    assert (history / "dropped.png").read_text() == "earlier run"
    assert not (out / "dropped.png").exists()


def test_a_schema_2_record_is_compared_with_the_spec_committed_at_its_revision(repo):
    """A schema-2 record keeps no spec hash: the committed claim.yaml at its revision decides."""
    path = repo / "configs" / "claim.yaml"
    spec = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    record_path = write(repo, spec, results(GOOD))
    old = json.loads(record_path.read_text())
    old["schema_version"] = 2
    del old["spec_sha256"]
    record_path.write_text(json.dumps(old))
    assert load_claim(write(repo, spec, results(GOOD)))["respecified_after"] is None
    record_path.write_text(json.dumps(old))
    path.write_text(yaml.safe_dump(v3_spec(claim="Another claim.")))
    git(repo, "commit", "-qam", "re-specified")
    changed = load_claim_spec(path, subjects=SUBJECTS, metrics=METRICS)
    assert load_claim(write(repo, changed, results(GOOD)))["respecified_after"]


# diagnosis


def test_a_verdict_that_is_not_held_carries_a_diagnosis_citing_recorded_numbers(tmp_path):
    spec = load(tmp_path)
    record = load_claim(
        write(
            tmp_path,
            spec,
            results(BAD),
            evidence={"gradient_share": {"ewc": 0.02}},
            diagnosis=lambda rec: [
                finding(
                    "implementation",
                    "the paper's term barely acts",
                    ("evidence.gradient_share.ewc", "2% of the gradient"),
                    ("metrics.method.error.mean", "the method's error"),
                )
            ],
        )
    )
    (item,) = record["diagnosis"]
    assert item["cause"] == "implementation"
    assert item["evidence"][0]["value"] == 0.02
    assert item["evidence"][1]["value"] == pytest.approx(1.1, abs=0.05)
    md = (tmp_path / "results" / "claim.md").read_text()
    assert "## Diagnosis" in md and "**implementation**" in md
    assert "`evidence.gradient_share.ewc` = 0.02" in md


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (finding("bad luck", "s", ("wall_time_s", "x")), "unknown cause"),
        (finding("idea", "no numbers"), "cites no recorded number"),
        (finding("check", "s", ("metrics.nobody.error.mean", "x")), "is not in the record"),
        (finding("check", "s", ("claim", "x")), "not a number"),
    ],
)
def test_a_diagnosis_that_cites_nothing_recorded_is_refused_after_the_files_are_written(
    tmp_path, bad, message
):
    spec = load(tmp_path)
    with pytest.raises(DiagnosisError, match=message):
        write(tmp_path, spec, results(BAD), diagnosis=bad)
    record = load_claim(tmp_path / "results" / "claim.json")  # the run's numbers are kept
    assert record["verdict"] == "did not hold"
    assert "error" in record["diagnosis"]


def test_a_missing_diagnosis_and_budget_are_flagged_and_can_be_attached_later(tmp_path):
    spec = load(tmp_path)
    path = write(tmp_path, spec, results(BAD))
    md = (tmp_path / "results" / "claim.md").read_text()
    assert "Missing: protocol v3 requires a diagnosis" in md
    assert "Missing: rerun the method and its strongest rival" in md
    record = attach_diagnosis(
        path, finding("undetermined", "two causes fit", ("metrics.method.error.mean", "error"))
    )
    assert record["diagnosis"][0]["cause"] == "undetermined"
    assert "**undetermined**" in (tmp_path / "results" / "claim.md").read_text()


def test_rediagnose_applies_a_project_s_current_rules_to_a_written_record(tmp_path):
    spec = load(tmp_path)
    path = write(tmp_path, spec, results(BAD))
    seen = {}

    def diagnose(record, *, spec):
        seen["verdict"], seen["method"] = record["verdict"], spec.method
        return [finding("idea", "the rule read the record", ("metrics.method.error.mean", "x"))]

    record = rediagnose(path, tmp_path / "claim.yaml", diagnose, subjects=SUBJECTS,
                        metrics=METRICS)  # fmt: skip
    assert seen == {"verdict": "did not hold", "method": spec.method}
    assert record["diagnosis"][0]["cause"] == "idea"
    assert (
        record["diagnosis"][0]["evidence"][0]["value"]
        == record["metrics"]["method"]["error"]["mean"]
    )
    assert record["diagnosis_written"] == "after the run, from the recorded numbers"
    assert load_claim(path)["diagnosis"] == record["diagnosis"]


# schema 3 beside schema 2


def test_schema_2_records_still_load_marked_protocol_2_but_not_where_v3_is_needed(tmp_path):
    spec = load(tmp_path)
    path = write(tmp_path, spec, results(GOOD))
    record = json.loads(path.read_text())
    assert record["schema_version"] == 3 and record["protocol"] == 3
    v2 = {k: v for k, v in record.items() if k not in ("protocol", "judgements", "replication")}
    v2["schema_version"], v2["verdict"] = 2, "held"
    path.write_text(json.dumps(v2))
    assert load_claim(path)["protocol"] == 2
    with pytest.raises(
        RecordSchemaError, match=r"schema-2 record; .* replaced by schema 3 \(protocol v3"
    ):
        load_claim(path, require_v3=True)


def test_a_cited_path_may_cross_keys_that_hold_dots():
    """Metric and check names like ``sq_err_w0.25`` or ``beats_at_0.5y`` hold dots: a path
    matches them as whole keys (longest first) and still refuses what is not there."""
    from papers_eval.diagnosis import resolve

    record = {
        "metrics": {"m": {"sq_err_w0.25": {"mean": 0.5}, "sq_err_w0": {"mean": 9.0}}},
        "outcomes": {"m": {"beats_at_0.5y": {"advantage": {"ci": [-0.1, 0.2]}}}},
    }
    assert resolve(record, "metrics.m.sq_err_w0.25.mean") == 0.5
    assert resolve(record, "metrics.m.sq_err_w0.mean") == 9.0
    assert resolve(record, "outcomes.m.beats_at_0.5y.advantage.ci.0") == -0.1
    with pytest.raises(KeyError, match="'metrics.m.sq_err_w0.5' is not in the record"):
        resolve(record, "metrics.m.sq_err_w0.5.mean")
    with pytest.raises(KeyError, match="ci.2"):
        resolve(record, "outcomes.m.beats_at_0.5y.advantage.ci.2")


def test_the_reproducible_part_leaves_out_run_facts_and_budget_timings():
    """Two runs of one claim differ in their timings only: the comparable part drops the run's
    facts and every wall-time-derived budget field, and keeps the budget's metrics and gaps."""
    from papers_eval import reproducible_part
    from papers_eval.mechanism import budget_evidence

    def run(subject, multiplier, seed):
        return {"metric": {"m": 1.0, "r": 2.0}[subject] * multiplier, "wall_time_s": seed + 1.0}

    budget = budget_evidence(run, method="m", rival="r", goal="lower", seed=0)
    facts = {"wall_time_s": 3.0, "created": "now", "jobs": {}, "hardware": {}, "provenance": {}}
    record = {"verdict": "did not hold", "command": "reproduce", "budget": budget, **facts}
    part = reproducible_part(record)
    assert set(part) == {"verdict", "budget"}
    assert part["budget"]["points"] == {
        "m": {"1": {"metric": 1.0}, "2": {"metric": 2.0}},
        "r": {"1": {"metric": 2.0}, "2": {"metric": 4.0}},
    }
    assert part["budget"]["gap"] == budget["gap"] and part["budget"]["gap_closes"] is True
    assert "method_to_rival_time_ratio" not in part["budget"]
    assert "equal_wall_time_gap" not in part["budget"]
    assert record["budget"]["points"]["m"]["1"]["wall_time_s"] == 1.0  # the record is untouched
    assert reproducible_part({"verdict": "held", "budget": None}) == {
        "verdict": "held",
        "budget": None,
    }


def test_control_findings_name_each_misbehaving_control_on_both_seed_sets():
    from papers_eval.diagnosis import control_findings

    def outcome(passed, estimate):
        return {"passed": passed, "advantage": {"estimate": estimate}}

    record = {
        "controls": [
            {"name": "shuffled", "role": "negative", "behaved": False},
            {"name": "oracle", "role": "positive", "behaved": True},
        ],
        "outcomes": {
            "shuffled": {"a": outcome(True, 0.1), "b": outcome(False, -0.2)},
            "oracle": {"a": outcome(True, 0.3), "b": outcome(True, 0.4)},
        },
        "replication": {
            "controls": [{"name": "oracle", "role": "positive", "behaved": False}],
            "outcomes": {"oracle": {"a": outcome(True, 0.2), "b": outcome(False, -0.1)}},
        },
    }
    judged_on = {"shuffled": ["a", "b"], "oracle": ["a", "b"]}
    first, second = control_findings(record, judged_on)
    assert first.cause == second.cause == "check"
    assert first.summary == (
        "the negative control shuffled passed a: the miniature cannot decide those checks"
    )
    assert [c.path for c in first.evidence] == ["outcomes.shuffled.a.advantage.estimate"]
    assert first.evidence[0].says == "shuffled on a: pass"
    assert second.summary == (
        "the positive control oracle failed b on the replication seeds: "
        "the miniature cannot decide those checks"
    )
    assert [c.path for c in second.evidence] == ["replication.outcomes.oracle.b.advantage.estimate"]
    # a control left out of judged_on is skipped (its project writes its own finding)
    (only,) = control_findings(record, {"shuffled": ["a", "b"]})
    assert only.summary.startswith("the negative control shuffled passed a")
    del record["replication"]
    assert len(control_findings(record, judged_on)) == 1
