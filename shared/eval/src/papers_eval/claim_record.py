"""Schema 2 of ``claim.json`` / ``claim.md``: a claim judged under the protocol.

``write_claim`` takes the validated spec, the per-seed results and the judgement (nothing typed
by hand), adds the run's provenance (git revision, hardware, command, wall time) and writes both
files. ``load_claim`` reads a record back and refuses older schemas with a message that names
the change. ``CLAIM_FIELDS`` lists every top-level field.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from papers_eval.claim import VERDICTS, ClaimSpec, Judgement, Results, code_revision, summarise
from papers_eval.record import _jsonable, git_revision, hardware_info
from papers_eval.table import format_value, markdown_table
from papers_eval.tuning import TuningResult

SCHEMA_VERSION = 2

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

SCHEMA_CHANGES = {
    1: "schema 1 (a 'criterion' in words and a 'holds' flag set by the project's own code) was "
    "replaced by schema 2 (checks pre-registered in configs/claim.yaml, negative and positive "
    "controls judged by the same checks, at least 3 seeds with intervals, and a verdict computed "
    "by papers_eval: held / did not hold / not shown)",
}


class RecordSchemaError(ValueError):
    """A ``claim.json`` of another schema; the message names the change and the fix."""

    user_facing = True


def _revision(spec: ClaimSpec, out: Path) -> str:
    """The revision the run started from; says so when HEAD moved before the record was written.
    Read in the spec's repository (``--out`` may lie outside it); a spec built in code has none."""
    now = code_revision(spec.source) if spec.source else git_revision(out, ignore=out)
    started = spec.started_at_revision or now
    return started if started == now else f"{started} (HEAD at write: {now})"


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
) -> Path:
    """Write ``claim.json`` and ``claim.md`` for a judged claim; returns the json path.

    ``results``: subject -> metric -> per-seed values (every metric the run measured; the table
    shows them all). ``evidence``: what the learned parts did (how far a learned component
    moved, how much it changes its input). ``headline``: one line for the root table (default:
    the method's checked metrics against their bars). ``notes``: a paragraph, or a list of
    notes written as one bullet each. ``figures``: file names beside the record.
    """
    if not isinstance(notes, str):
        notes = "\n".join(f"- {note}" for note in notes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = summarise(spec, results, n_resamples=n_resamples)
    record = {
        "schema_version": SCHEMA_VERSION,
        "project": project,
        "claim": spec.claim,
        "verdict": judgement.verdict,
        "verdict_reason": judgement.reason,
        "method": spec.method,
        "baselines": list(spec.baselines),
        "checks": spec.as_dict()["checks"],
        "controls": [
            {**_control_declared(spec, c.name), **c.as_dict()} for c in judgement.controls
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
        "quick": spec.quick,
        "confidence": spec.confidence,
        "tuning": tuning.as_dict() if tuning else {"declared": dict(spec.tuning)},
        "settings": dict(spec.settings),
        "config": config,
        "evidence": dict(evidence or {}),
        "headline": headline or default_headline(spec, metrics),
        "notes": notes,
        "figures": list(figures),
        "spec_source": spec.source,
        "git_revision": _revision(spec, out),
        "hardware": hardware_info(),
        "wall_time_s": round(float(wall_time_s), 1),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    record = _jsonable(record)
    path = out / "claim.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    (out / "claim.md").write_text(render_markdown(record))
    return path


def _control_declared(spec: ClaimSpec, name: str) -> dict[str, Any]:
    control = next(c for c in spec.controls if c.name == name)
    return {"why": control.why, "checks": list(control.checks)}


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
    """``claim.md``: the verdict and why, the pre-registered checks, every subject's outcome
    on every check, the controls, the metric table, tuning, evidence and provenance."""
    hw = record["hardware"]
    device = ", ".join(hw["cuda_devices"]) or f"CPU ({hw['cpu_count']} cores)"
    percent = f"{100 * record.get('confidence', 0.95):g}%"
    quick = " (a --quick run: a pipeline check, not evidence)" if record["quick"] else ""
    lines = [
        f"# {record['project']}: the claim under the protocol{quick}",
        "",
        f"**Claim.** {record['claim']}",
        "",
        f"**Verdict: {record['verdict']}.** {record['verdict_reason']}.",
        "",
        *_precondition_lines(record.get("preconditions") or []),
        "## Pre-registered checks",
        "",
        "| check | passes when |",
        "|---|---|",
        *(f"| {c['name']} | {c['text']} |" for c in record["checks"]),
        "",
        f"A check passes when the whole {percent} interval of the advantage over its bar lies "
        "above 0.",
        "",
        "## Outcomes (advantage over the bar, with its interval)",
        "",
    ]
    roles = {record["method"]: "method"} | {
        c["name"]: f"{c['role']} control" for c in record["controls"]
    }
    names = [c["name"] for c in record["checks"]]
    lines += [
        "| subject | role | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for subject, outcomes in record["outcomes"].items():
        cells = [_outcome_cell(outcomes[n]) for n in names]
        lines.append(f"| {subject} | {roles.get(subject, '')} | " + " | ".join(cells) + " |")
    lines += ["", "## Controls", ""]
    for control in record["controls"]:
        expected = "fail" if control["role"] == "negative" else "pass"
        got = "passed" if control["passed_its_checks"] else "failed"
        behaved = "as required" if control["behaved"] else "NOT as required"
        lines.append(
            f"- `{control['name']}` ({control['role']}; must {expected}): {got} its checks, "
            f"{behaved}. {control['why']}".rstrip()
        )
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
            lines.append(f"- `{subject}`: {len(trials)} configurations; chose {chosen}")
    if record["evidence"]:
        lines += ["", "## Evidence that the learned parts act", ""]
        lines += [f"- {key}: {format_value(value)}" for key, value in record["evidence"].items()]
    if record["notes"]:
        lines += ["", "## Notes", "", record["notes"]]
    lines += [
        "",
        f"Command: `{record['command']}`; seeds {record['seeds']}; {device}; torch {hw['torch']}; "
        f"wall time {record['wall_time_s']} s; git {record['git_revision']}; "
        f"{record['created']}.",
    ]
    return "\n".join(lines) + "\n"


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


def load_claim(path: str | os.PathLike) -> dict[str, Any]:
    """Read a schema-2 ``claim.json``; older schemas raise ``RecordSchemaError`` naming the
    change, and a record missing fields raises ``ValueError``."""
    record = json.loads(Path(path).read_text())
    version = record.get("schema_version", 1)
    if version != SCHEMA_VERSION:
        change = SCHEMA_CHANGES.get(version, f"schema {version} is unknown to this papers_eval")
        raise RecordSchemaError(
            f"{path} is a schema-{version} record; {change}. Rerun `uv run reproduce` in the "
            "project to write a schema-2 record."
        )
    missing = [f for f in CLAIM_FIELDS if f not in record]
    if missing:
        raise ValueError(f"{path} is not a complete claim record; missing fields: {missing}")
    if record["verdict"] not in VERDICTS:
        raise ValueError(f"{path}: unknown verdict {record['verdict']!r}")
    return record
