"""Schema 3 of ``claim.json`` / ``claim.md``: a claim judged under the protocol (v3).

``write_claim`` takes the validated spec, the per-seed results and the judgement (nothing typed
by hand), the replication's judgement when one was run, the evidence, the budget curve and the
diagnosis, adds the run's provenance (git revision, dirty tree allowed or not, hardware, the full
command line, wall time, the job runner's per-job times) and writes both files. Writing a full
record over one whose ``configs/claim.yaml`` differed keeps the earlier record under
``history/<revision>/`` and marks the new one "re-specified after <revision>, outcome known".

``load_claim`` reads schema 3, and schema 2 marked ``protocol: 2`` (rendered, never upgraded);
``load_claim(..., require_v3=True)`` refuses schema 2 naming the change. ``CLAIM_FIELDS`` lists
every top-level field a record of either schema has.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from papers_eval import diagnosis as diagnosis_rules
from papers_eval.claim import (
    VERDICTS,
    ClaimSpec,
    Judgement,
    Results,
    code_revision,
    combined_verdict,
    load_claim_spec,
    summarise,
)
from papers_eval.record import _jsonable, git_revision, hardware_info
from papers_eval.table import format_value, markdown_table
from papers_eval.tuning import TuningResult

SCHEMA_VERSION = 3

CLAIM_FIELDS = (
    "schema_version",
    "project",
    "claim",
    "verdict",
    "verdict_reason",
    "method",
    "baselines",
    "checks",
    "controls",
    "outcomes",
    "metrics",
    "seeds",
    "quick",
    "tuning",
    "settings",
    "config",
    "evidence",
    "headline",
    "notes",
    "git_revision",
    "hardware",
    "wall_time_s",
    "command",
    "created",
)

# Fields a schema-3 record adds to CLAIM_FIELDS.
V3_FIELDS = (
    "protocol",
    "judgements",
    "replication",
    "ceilings",
    "diagnosis",
    "budget",
    "jobs",
    "provenance",
    "respecified_after",
    "spec_sha256",
)

SCHEMA_CHANGES = {
    2: "schema 2 (protocol v2: one seed set, positive controls without a kind, no diagnosis) was "
    "replaced by schema 3 (protocol v3: replication seeds judged by the same checks, oracle / "
    "in-family / ceiling controls, intervals that fail zero-variance scalars, a diagnosis for "
    "every verdict that is not held, budget evidence, refusal of a dirty tree)",
    1: "schema 1 (a 'criterion' in words and a 'holds' flag set by the project's own code) was "
    "replaced by schema 2 (checks pre-registered in configs/claim.yaml, negative and positive "
    "controls judged by the same checks, at least 3 seeds with intervals, and a verdict computed "
    "by papers_eval: held / did not hold / not shown)",
}


class RecordSchemaError(ValueError):
    """A ``claim.json`` of another schema; the message names the change and the fix."""

    user_facing = True


@dataclass(frozen=True)
class Replication:
    """The same checks judged on the replication seeds (``spec.for_replication()``)."""

    spec: ClaimSpec
    results: Results
    judgement: Judgement
    tuning: TuningResult | None = None


Diagnose = Callable[
    [Mapping[str, Any]], "diagnosis_rules.Finding | Sequence[diagnosis_rules.Finding]"
]


def _revision(spec: ClaimSpec, out: Path) -> str:
    """The revision the run started from; says so when HEAD moved before the record was written.
    Read in the spec's repository (``--out`` may lie outside it); a spec built in code has none."""
    now = code_revision(spec.source) if spec.source else git_revision(out, ignore=out)
    started = spec.started_at_revision or now
    return started if started == now else f"{started} (HEAD at write: {now})"


def _command_line() -> str:
    """The whole command that started this process (``sys.orig_argv``: interpreter flags, ``-c``
    code, the script and every argument), with the interpreter and script paths shortened."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv:
        argv[0] = Path(argv[0]).name
    if len(argv) > 1 and Path(argv[1]).is_absolute() and Path(argv[1]).is_file():
        argv[1] = Path(argv[1]).name  # .../.venv/bin/reproduce -> reproduce
    return shlex.join(argv)


def write_claim(
    out_dir: str | os.PathLike,
    *,
    project: str,
    spec: ClaimSpec,
    results: Results,
    judgement: Judgement,
    config: Mapping[str, Any],
    wall_time_s: float,
    tuning: TuningResult | None = None,
    evidence: Mapping[str, Any] | None = None,
    headline: str = "",
    notes: str | Sequence[str] = "",
    figures: Sequence[str] = (),
    n_resamples: int = 2000,
    replication: Replication | None = None,
    diagnosis: Diagnose | diagnosis_rules.Finding | Sequence[diagnosis_rules.Finding] | None = None,
    budget: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``claim.json`` and ``claim.md`` for a judged claim; returns the json path.

    ``results``: subject -> metric -> per-seed values (every metric the run measured; the table
    shows them all). ``evidence``: what the learned parts did (gradient shares of the loss terms,
    how far a learned component moved, how much it changes its input). ``headline``: one line for
    the root table (default: the method's checked metrics against their bars). ``notes``: a
    paragraph, or a list of notes written as one bullet each. ``figures``: file names beside the
    record. ``replication``: the judgement on the replication seeds (``reproduce --replicate``).
    ``diagnosis``: findings, or a function of the record returning them (or nothing, e.g. when
    ``record["verdict"]`` is held), required (protocol 3) when the verdict is not ``held``: each
    cites numbers of the record, checked here.
    ``budget``: ``mechanism.budget_evidence`` (required for a ``did not hold``).
    ``jobs``: the job runner's summary (per-job wall time and memory).

    A diagnosis that does not validate is recorded as such and raises ``DiagnosisError`` after
    the files are written, so a long run's numbers are never lost to a bad citation.
    """
    if not isinstance(notes, str):
        notes = "\n".join(f"- {note}" for note in notes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = summarise(spec, results, n_resamples=n_resamples)
    verdict, reason = combined_verdict(judgement, replication.judgement if replication else None)
    revision = _revision(spec, out)
    record = {
        "schema_version": SCHEMA_VERSION,
        "protocol": spec.protocol,
        "project": project,
        "claim": spec.claim,
        "verdict": verdict,
        "verdict_reason": reason,
        "judgements": {
            "registered": _judgement_summary(judgement),
            "replication": _judgement_summary(replication.judgement) if replication else None,
        },
        "method": spec.method,
        "baselines": list(spec.baselines),
        "checks": spec.as_dict()["checks"],
        "controls": [
            {**_control_declared(spec, c.name), **c.as_dict()} for c in judgement.controls
        ],
        "ceilings": [
            {**_control_declared(spec, c.name), "outcomes": _outcomes(judgement, c.name)}
            for c in spec.ceilings
        ],
        "outcomes": {
            subject: {name: o.as_dict() for name, o in checks.items()}
            for subject, checks in judgement.outcomes.items()
        },
        "preconditions": [
            {**declared, **judgement.preconditions[declared["name"]].as_dict()}
            for declared in spec.as_dict()["preconditions"]
        ],
        "metrics": metrics,
        "seeds": list(spec.seeds),
        "replication": _replication_record(replication, n_resamples),
        "quick": spec.quick,
        "confidence": spec.confidence,
        "tuning": tuning.as_dict() if tuning else {"declared": dict(spec.tuning)},
        "settings": dict(spec.settings),
        "config": config,
        "evidence": dict(evidence or {}),
        "budget": dict(budget) if budget else None,
        "jobs": dict(jobs) if jobs else None,
        "diagnosis": None,
        "headline": headline or default_headline(spec, metrics),
        "notes": notes,
        "figures": list(figures),
        "spec_source": spec.source,
        "spec_sha256": spec.spec_sha256,
        "respecified_after": None,
        "git_revision": revision,
        "provenance": {
            "dirty": "+dirty" in revision.split(" ")[0],
            "allow_dirty": spec.allow_dirty,
            "cwd": os.getcwd(),
        },
        "hardware": hardware_info(),
        "wall_time_s": round(float(wall_time_s), 1),
        "command": _command_line(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    record = _jsonable(record)
    diagnosis_error = None
    if diagnosis is not None:
        try:
            findings = diagnosis(record) if callable(diagnosis) else diagnosis
            if isinstance(findings, diagnosis_rules.Finding):
                findings = [findings]
            if findings:  # a function may find nothing to say (e.g. the verdict held)
                record["diagnosis"] = _jsonable(diagnosis_rules.validate(list(findings), record))
        except diagnosis_rules.DiagnosisError as error:
            diagnosis_error = error
            record["diagnosis"] = {"error": str(error)}
    if not spec.quick:
        record["respecified_after"] = _keep_history(out, spec, time.time() - wall_time_s)
    path = out / "claim.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    (out / "claim.md").write_text(render_markdown(record))
    if diagnosis_error is not None:
        raise diagnosis_error
    return path


def attach_diagnosis(
    path: str | os.PathLike,
    findings: diagnosis_rules.Finding | Sequence[diagnosis_rules.Finding],
) -> dict[str, Any]:
    """Add (or replace) the diagnosis of a written record, e.g. from ``results/diagnosis.yaml``
    after reading the run: the findings are validated against the record's numbers, and claim.md
    is rendered again. The record says the diagnosis was written after the run."""
    path = Path(path)
    record = load_claim(path, require_v3=True)
    if isinstance(findings, diagnosis_rules.Finding):
        findings = [findings]
    record["diagnosis"] = _jsonable(diagnosis_rules.validate(list(findings), record))
    record["diagnosis_written"] = "after the run, from the recorded numbers"
    path.write_text(json.dumps(record, indent=2) + "\n")
    (path.parent / "claim.md").write_text(render_markdown(record))
    return record


def rediagnose(
    path: str | os.PathLike,
    claim_file: str | os.PathLike,
    diagnose: Callable[..., Sequence[diagnosis_rules.Finding]],
    *,
    subjects: Sequence[str],
    metrics: Sequence[str],
) -> dict[str, Any]:
    """Rewrite a written record's diagnosis with a project's current rules: ``diagnose(record,
    spec=spec)`` on the record at ``path`` and the spec of ``claim_file`` (loaded whatever the
    tree's state: nothing here runs an experiment), then ``attach_diagnosis``. For rules
    extended after a long run, applied to its recorded numbers instead of running it again."""
    record = load_claim(path, require_v3=True)
    spec = load_claim_spec(claim_file, subjects=subjects, metrics=metrics, allow_dirty=True)
    return attach_diagnosis(path, diagnose(record, spec=spec))


def _judgement_summary(judgement: Judgement) -> dict[str, Any]:
    return {
        "verdict": judgement.verdict,
        "reason": judgement.reason,
        "seeds": list(judgement.seeds),
        "method_passed": judgement.method_passed,
    }


def _outcomes(judgement: Judgement, subject: str) -> dict[str, Any]:
    return {name: o.as_dict() for name, o in judgement.outcomes.get(subject, {}).items()}


def _replication_record(replication: Replication | None, n_resamples: int) -> dict[str, Any]:
    if replication is None:
        return {"run": False}
    spec, judgement = replication.spec, replication.judgement
    return {
        "run": True,
        "seeds": list(spec.seeds),
        "verdict": judgement.verdict,
        "reason": judgement.reason,
        "controls": [c.as_dict() for c in judgement.controls],
        "outcomes": {
            subject: {name: o.as_dict() for name, o in checks.items()}
            for subject, checks in judgement.outcomes.items()
        },
        "preconditions": {name: o.as_dict() for name, o in judgement.preconditions.items()},
        "metrics": summarise(spec, replication.results, n_resamples=n_resamples),
        "tuning": replication.tuning.as_dict() if replication.tuning else None,
    }


def _spec_text_at(spec_source: str, revision: str) -> str | None:
    """``configs/claim.yaml`` as committed at ``revision`` (None when git cannot tell)."""
    folder = Path(spec_source).resolve().parent
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        relative = Path(spec_source).resolve().relative_to(Path(top).resolve())
        return subprocess.run(
            ["git", "show", f"{revision}:{relative.as_posix()}"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None


def _keep_history(out: Path, spec: ClaimSpec, run_started: float) -> str | None:
    """Before a full record replaces ``out/claim.json``: when the earlier record was judged under
    another ``configs/claim.yaml``, move it (json, md, figures) to ``out/history/<revision>/``.
    A figure file written since ``run_started`` is this run's (projects draw their figures
    before the record is written, under the same names): it stays where it is, since the earlier
    figure of that name is already gone. Returns the revision the new record is re-specified
    after (carried over from the earlier record when the spec did not change again), or None."""
    previous_path = out / "claim.json"
    if not previous_path.is_file() or not spec.spec_sha256:
        return None
    try:
        previous = json.loads(previous_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if previous.get("quick"):
        return None
    revision = str(previous.get("git_revision", "unknown")).split(" ")[0].removesuffix("+dirty")
    earlier_sha = previous.get("spec_sha256")
    if earlier_sha is None and spec.source:  # schema 2 kept no hash: read the committed spec
        text = _spec_text_at(spec.source, revision)
        if text is not None:
            earlier_sha = hashlib.sha256(text.encode()).hexdigest()
    if earlier_sha == spec.spec_sha256:
        return previous.get("respecified_after")
    history = out / "history" / revision[:12]
    history.mkdir(parents=True, exist_ok=True)
    for name in ("claim.json", "claim.md", *previous.get("figures", [])):
        path = out / name
        if not path.is_file():
            continue
        if name not in ("claim.json", "claim.md") and path.stat().st_mtime >= run_started:
            continue  # this run's figure (written before the record): not the earlier one
        shutil.move(str(path), history / name)
    return revision


def _control_declared(spec: ClaimSpec, name: str) -> dict[str, Any]:
    control = next(c for c in spec.controls if c.name == name)
    return {
        "name": control.name,
        "role": control.role,
        "kind": control.kind,
        "pipeline": control.pipeline,
        "pipeline_why": control.pipeline_why,
        "why": control.why,
        "checks": list(control.checks),
    }


def default_headline(spec: ClaimSpec, metrics: Mapping[str, Mapping[str, Any]]) -> str:
    """The method's checked metrics beside their bars, e.g. ``test_mse: mlp 0.11 vs mean 1.02``."""
    parts = []
    for check in spec.checks:
        value = format_value(metrics[spec.method][check.metric]["mean"])
        if check.threshold is not None:
            bar = f"threshold {format_value(check.threshold)}"
        else:
            bar = ", ".join(
                f"{ref} {format_value(metrics[ref][check.metric]['mean'])}" for ref in check.against
            )
        parts.append(f"{check.metric}: {spec.method} {value} vs {bar}")
    return "; ".join(dict.fromkeys(parts))


def render_markdown(record: Mapping[str, Any]) -> str:
    """``claim.md``: the verdict and why (with the replication), the diagnosis, the
    pre-registered checks, every subject's outcome on every check, the controls and their kinds,
    the ceilings, the metric table, tuning, evidence, budget, jobs and provenance."""
    hw = record["hardware"]
    device = ", ".join(hw["cuda_devices"]) or f"CPU ({hw['cpu_count']} cores)"
    percent = f"{100 * record.get('confidence', 0.95):g}%"
    quick = " (a --quick run: a pipeline check, not evidence)" if record["quick"] else ""
    protocol = record.get("protocol", 2)
    lines = [
        f"# {record['project']}: the claim under the protocol (v{protocol}){quick}",
        "",
        f"**Claim.** {record['claim']}",
        "",
        f"**Verdict: {record['verdict']}.** {record['verdict_reason']}.",
        "",
    ]
    if protocol < 3:
        lines += [
            "This record was judged under protocol v2 (one seed set, controls without a kind, "
            "no diagnosis); its project's fix-up reruns it under v3.",
            "",
        ]
    if record.get("respecified_after"):
        lines += [
            f"**Re-specified after {record['respecified_after']}, outcome known**: "
            "configs/claim.yaml changed after a judged run; the earlier record is kept under "
            f"history/{record['respecified_after'][:12]}/.",
            "",
        ]
    provenance = record.get("provenance") or {}
    if provenance.get("dirty"):
        allowed = " (allowed with --allow-dirty)" if provenance.get("allow_dirty") else ""
        lines += [
            f"**Written from a tree with uncommitted changes{allowed}**: the revision below does "
            "not name all of the code that ran.",
            "",
        ]
    lines += _diagnosis_lines(record)
    lines += _precondition_lines(record.get("preconditions") or [])
    lines += [
        "## Pre-registered checks",
        "",
        "| check | passes when |",
        "|---|---|",
        *(f"| {c['name']} | {c['text']} |" for c in record["checks"]),
        "",
        f"A check passes when the whole {percent} interval of the advantage over its bar lies "
        "above 0.",
        "",
        f"## Outcomes on seeds {record['seeds']} (advantage over the bar, with its interval)",
        "",
    ]
    roles = {record["method"]: "method"} | {
        c["name"]: _role_text(c) for c in [*record["controls"], *record.get("ceilings", [])]
    }
    names = [c["name"] for c in record["checks"]]
    # The judgement's outcomes hold every subject, ceilings included: one row each, ceilings
    # last (a record written before ceilings joined the outcomes lists them only under
    # `ceilings`).
    ceilings = {c["name"]: c["outcomes"] for c in record.get("ceilings", [])}
    rows = {s: o for s, o in record["outcomes"].items() if s not in ceilings} | ceilings
    lines += _outcome_table(rows, names, roles)
    replication = record.get("replication") or {}
    if replication.get("run"):
        lines += [
            "",
            f"## Replication on seeds {replication['seeds']}: {replication['verdict']}",
            "",
            f"{replication['reason']}.",
            "",
        ]
        lines += _outcome_table(replication["outcomes"], names, roles)
    elif protocol >= 3 and not record["quick"]:
        lines += ["", "Replication not run (`uv run reproduce --replicate` runs it)."]
    lines += ["", "## Controls", ""]
    for control in record["controls"]:
        expected = "fail" if control["role"] == "negative" else "pass"
        got = "passed" if control["passed_its_checks"] else "failed"
        behaved = "as required" if control["behaved"] else "NOT as required"
        lines.append(
            f"- `{control['name']}` ({_role_text(control)}; must {expected}): {got} its checks, "
            f"{behaved}. {control['why']}".rstrip()
            + _pipeline_text(control)
        )
    for ceiling in record.get("ceilings", []):
        lines.append(f"- `{ceiling['name']}` (ceiling; reported, never judged). {ceiling['why']}")
    lines += [
        "",
        f"## Metrics (mean and {percent} interval over seeds {record['seeds']})",
        "",
        markdown_table(
            {
                subject: {m: {"mean": v["mean"], "ci": v["ci"]} for m, v in metrics.items()}
                for subject, metrics in record["metrics"].items()
            }
        ),
    ]
    tuning = record["tuning"]
    if tuning.get("best"):
        lines += [
            "",
            f"## Tuning ({tuning['split']} split, {tuning['metric']}, {tuning['goal']})",
            "",
        ]
        for subject, trials in tuning["trials"].items():
            chosen = tuning["best"][subject] or "untuned (no knob)"
            count = f"{len(trials)} configuration" + ("" if len(trials) == 1 else "s")
            lines.append(f"- `{subject}`: {count}; chose {chosen}")
        for subject, tie in (tuning.get("ties") or {}).items():
            kept = "kept the preferred" if tie["chosen"] == "preferred" else "chose the best"
            best, preferred = (
                "failed" if v is None or not math.isfinite(v) else f"{v:.4g}"
                for v in (tie["best_score"], tie["preferred_score"])
            )  # a failed configuration's NaN is stored as null
            lines.append(
                f"- tie rule, `{subject}`: best {tie['best']} ({best}), "
                f"preferred {tie['preferred']} ({preferred}): {kept}"
            )
    if record["evidence"]:
        lines += ["", "## Evidence that the learned parts act", ""]
        lines += [f"- {key}: {format_value(value)}" for key, value in record["evidence"].items()]
    lines += _budget_lines(record.get("budget"), record["verdict"], protocol, record["quick"])
    jobs = record.get("jobs")
    if jobs:
        lines += ["", "## Jobs", ""]
        lines += [f"- {key}: {format_value(value)}" for key, value in jobs.items()]
    if record["notes"]:
        lines += ["", "## Notes", "", record["notes"]]
    lines += [
        "",
        f"Command: `{record['command']}`; seeds {record['seeds']}; {device}; torch {hw['torch']}; "
        f"wall time {record['wall_time_s']} s; git {record['git_revision']}; "
        f"{record['created']}.",
    ]
    return "\n".join(lines) + "\n"


def _role_text(control: Mapping[str, Any]) -> str:
    kind = control.get("kind") or ""
    role = control["role"]
    if role == "ceiling":
        return "ceiling"
    if role == "positive" and kind:
        return f"positive control, {kind.replace('_', '-')}"
    return f"{role} control"


def _pipeline_text(control: Mapping[str, Any]) -> str:
    if control.get("pipeline") == "bypass":
        return f" Bypasses the model code: {control.get('pipeline_why', '')}"
    if control.get("pipeline") == "model":
        return " Runs through the project's model, training and evaluation code."
    return ""


def _outcome_table(
    outcomes: Mapping[str, Mapping[str, Any]], names: Sequence[str], roles: Mapping[str, str]
) -> list[str]:
    lines = ["| subject | role | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for subject, checks in outcomes.items():
        cells = [_outcome_cell(checks[n]) if n in checks else "-" for n in names]
        lines.append(f"| {subject} | {roles.get(subject, '')} | " + " | ".join(cells) + " |")
    return lines


def _diagnosis_lines(record: Mapping[str, Any]) -> list[str]:
    diagnosis = record.get("diagnosis")
    if record["verdict"] == "held" and not diagnosis:
        return []
    if isinstance(diagnosis, list):
        return ["## Diagnosis", "", *diagnosis_rules.render(diagnosis), ""]
    if isinstance(diagnosis, Mapping) and "error" in diagnosis:
        return ["## Diagnosis", "", f"The diagnosis did not validate: {diagnosis['error']}", ""]
    if record.get("protocol", 2) >= 3 and not record["quick"]:
        return [
            "## Diagnosis",
            "",
            "Missing: protocol v3 requires a diagnosis (idea / implementation / check / "
            "undetermined, citing recorded numbers) for every verdict that is not held.",
            "",
        ]
    return []


def _budget_lines(
    budget: Mapping[str, Any] | None, verdict: str, protocol: int, quick: bool
) -> list[str]:
    if not budget:
        if protocol >= 3 and not quick and verdict in ("did not hold", "mixed"):
            return ["", "## Budget", "", "Missing: rerun the method and its strongest rival at "
                    "1x and 2x the budget (`papers_eval.mechanism.budget_evidence`)."]  # fmt: skip
        return []
    lines = [
        "",
        f"## Budget: {budget['method']} against {budget['rival']} (seed {budget['seed']})",
        "",
        "| budget | " + " | ".join(f"{m:g}x" for m in budget["multipliers"]) + " |",
        "|---|" + "---|" * len(budget["multipliers"]),
    ]
    keys = list(budget["gap"])
    for subject in (budget["method"], budget["rival"]):
        cells = [format_value(budget["points"][subject][k]["metric"]) for k in keys]
        lines.append(f"| {subject} | " + " | ".join(cells) + " |")
    lines.append(
        "| method's advantage | " + " | ".join(format_value(budget["gap"][k]) for k in keys) + " |"
    )
    closes = "grows" if budget["gap_closes"] else "does not grow"
    lines += ["", f"With more budget the method's advantage {closes} "
              f"({format_value(budget['gap_change'])})."]  # fmt: skip
    return lines


def _precondition_lines(preconditions: Sequence[Mapping[str, Any]]) -> list[str]:
    """The preconditions first: whether the miniature poses the problem at all."""
    if not preconditions:
        return []
    lines = ["## Precondition (judged first)", "", "| precondition | met when | outcome |"]
    lines.append("|---|---|---|")
    lines += [f"| {p['name']} | {p['text']} | {_outcome_cell(p)} |" for p in preconditions]
    return [*lines, ""]


def _outcome_cell(outcome: Mapping[str, Any]) -> str:
    advantage = outcome["advantage"]
    low, high = advantage["ci"]
    interval = (
        "no interval"
        if low is None or high is None
        else (f"[{format_value(low)}, {format_value(high)}]")
    )
    mark = "pass" if outcome["passed"] else "fail"
    return f"{mark}: {format_value(advantage['estimate'])} {interval}"


RUN_FACTS = ("wall_time_s", "created", "command", "hardware", "provenance", "jobs")


def reproducible_part(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a rerun of the same claim at the same code must write again, number for number: the
    record without the facts of the run (``RUN_FACTS``: its time, date, command, machine and job
    summary) and without the budget evidence's timings (``wall_time_s`` of each point and what
    is computed from them, ``method_to_rival_time_ratio`` and ``equal_wall_time_gap``), which
    vary from one run to the next. For tests that compare two runs (worker counts, the cache)."""

    def untimed(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {
                k: untimed(v)
                for k, v in node.items()
                if "wall_time" not in k and k != "method_to_rival_time_ratio"
            }
        return node

    out = {k: v for k, v in record.items() if k not in RUN_FACTS}
    if out.get("budget"):
        out["budget"] = untimed(out["budget"])
    return out


def load_claim(path: str | os.PathLike, *, require_v3: bool = False) -> dict[str, Any]:
    """Read a ``claim.json``: schema 3, or schema 2 (kept and rendered, marked ``protocol: 2``
    until its project reruns under v3). ``require_v3`` refuses schema 2 naming the change;
    older schemas always raise ``RecordSchemaError``; a record missing fields raises
    ``ValueError``."""
    record = json.loads(Path(path).read_text())
    version = record.get("schema_version", 1)
    if version not in (2, SCHEMA_VERSION) or (require_v3 and version != SCHEMA_VERSION):
        change = SCHEMA_CHANGES.get(version, f"schema {version} is unknown to this papers_eval")
        raise RecordSchemaError(
            f"{path} is a schema-{version} record; {change}. Rerun `uv run reproduce` in the "
            f"project to write a schema-{SCHEMA_VERSION} record."
        )
    required = CLAIM_FIELDS + (V3_FIELDS if version == SCHEMA_VERSION else ())
    missing = [f for f in required if f not in record]
    if missing:
        raise ValueError(f"{path} is not a complete claim record; missing fields: {missing}")
    if version == 2:
        record.setdefault("protocol", 2)
    if record["verdict"] not in VERDICTS:
        raise ValueError(f"{path}: unknown verdict {record['verdict']!r}")
    return record
