"""Why a verdict is not ``held``: a diagnosis that cites the record's own numbers.

Claim protocol v3: a record whose verdict is not ``held`` carries a diagnosis, written by the
project from measured evidence (never typed as a verdict). Each finding names a cause

- ``idea``: the mechanism was given a fair chance (its loss terms act, training converged, the
  grids do not stop at their edge) and still lost: evidence against the paper's idea here;
- ``implementation``: our implementation falls short of the paper (a loss term carries 2% of the
  gradient, training stopped at half the budget, the value signal models the wrong optimiser);
- ``check``: the check, not the method, decides (the bar sits inside the noise, the metric does not
  measure the claim);
- ``undetermined``: the evidence does not separate the causes,

and cites at least one number recorded in ``claim.json`` by its path, e.g.
``evidence.gradient_share.ewc.share`` or ``metrics.lrrf.aa.mean`` or ``budget.gap.2``. papers_eval
resolves every cite when the record is written (``validate``) and refuses a finding without one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CAUSES = ("idea", "implementation", "check", "undetermined")


class DiagnosisError(ValueError):
    """A diagnosis that names no known cause or cites no number the record holds."""

    user_facing = True


@dataclass(frozen=True)
class Cite:
    """One recorded number: ``path`` into ``claim.json`` (dot-separated keys, list indices as
    integers) and what it shows."""

    path: str
    says: str


@dataclass(frozen=True)
class Finding:
    cause: str
    summary: str
    evidence: tuple[Cite, ...]


def finding(cause: str, summary: str, *cites: tuple[str, str] | Cite) -> Finding:
    """``finding("implementation", "the EWC term barely acts", ("evidence.share.ewc", "2%"))``."""
    return Finding(cause, summary, tuple(c if isinstance(c, Cite) else Cite(*c) for c in cites))


def resolve(record: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` in the record; ``KeyError`` naming the first missing part.

    Parts are separated by dots; a key that itself holds dots (a metric ``sq_err_w0.25``, a
    check ``beats_at_0.5y``) is matched as a whole, the longest matching key first.
    """
    node: Any = record
    parts = path.split(".")
    walked: list[str] = []
    i = 0
    while i < len(parts):
        if isinstance(node, Mapping):
            for j in range(len(parts), i, -1):
                key = ".".join(parts[i:j])
                if key in node:
                    node, i = node[key], j
                    walked.append(key)
                    break
            else:
                raise KeyError(f"'{'.'.join([*walked, parts[i]])}' is not in the record")
            continue
        part = parts[i]
        if (
            isinstance(node, list)
            and part.lstrip("-").isdigit()
            and -len(node) <= int(part) < len(node)
        ):
            node, i = node[int(part)], i + 1
            walked.append(part)
        else:
            raise KeyError(f"'{'.'.join([*walked, part])}' is not in the record")
    return node


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate(findings: Sequence[Finding], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The findings as JSON, each cite with the number it resolves to. Raises
    ``DiagnosisError`` for an unknown cause, a finding with no cite, or a cite that does not
    resolve to a finite number in the record."""
    if not findings:
        raise DiagnosisError("a diagnosis needs at least one finding")
    out = []
    for item in findings:
        if item.cause not in CAUSES:
            raise DiagnosisError(f"unknown cause '{item.cause}'; one of {CAUSES}")
        if not item.evidence:
            raise DiagnosisError(
                f"the '{item.cause}' finding ('{item.summary}') cites no recorded number"
            )
        cites = []
        for cite in item.evidence:
            try:
                value = resolve(record, cite.path)
            except KeyError as error:
                raise DiagnosisError(
                    f"the '{item.cause}' finding cites {cite.path}: {error.args[0]}"
                ) from None
            if not _is_number(value):
                raise DiagnosisError(
                    f"the '{item.cause}' finding cites {cite.path}, which holds {value!r}, "
                    "not a number"
                )
            cites.append({"path": cite.path, "value": value, "says": cite.says})
        out.append({"cause": item.cause, "summary": item.summary, "evidence": cites})
    return out


def control_findings(record: Mapping[str, Any], judged_on: Mapping[str, Sequence[str]]) -> list:
    """A ``check`` finding for each control that misbehaved (a negative control that passed a
    check it is judged on, a positive one that failed one), on the registered seeds and, when
    the record holds a replication with controls, on the replication seeds too; each cites the
    control's advantage on those checks. ``judged_on``: control name -> the checks it is judged
    on (``{c.name: c.checks for c in spec.controls}``); a control left out of it is skipped
    (a project that explains that control's misbehaviour in a finding of its own)."""
    replication = record.get("replication") or {}
    seed_sets = [("", record, "")]
    if replication.get("controls"):
        seed_sets.append(("replication.", replication, " on the replication seeds"))
    findings = []
    for where, judged, seeds_text in seed_sets:
        for control in judged["controls"]:
            name, negative = control["name"], control["role"] == "negative"
            if control["behaved"] or name not in judged_on:
                continue
            bad = [c for c in judged_on[name] if judged["outcomes"][name][c]["passed"] == negative]
            cites = [
                (
                    f"{where}outcomes.{name}.{c}.advantage.estimate",
                    f"{name} on {c}: {'pass' if judged['outcomes'][name][c]['passed'] else 'fail'}",
                )
                for c in bad
            ]
            findings.append(
                finding(
                    "check",
                    f"the {control['role']} control {name} "
                    + ("passed" if negative else "failed")
                    + f" {', '.join(bad)}{seeds_text}: the miniature cannot decide those checks",
                    *cites,
                )
            )
    return findings


def from_mapping(raw: Any) -> list[Finding]:
    """Findings from YAML/JSON: a list of ``{cause, summary, evidence: [{path, says}]}``."""
    items = raw if isinstance(raw, list) else [raw]
    findings = []
    for item in items:
        if not isinstance(item, Mapping) or "cause" not in item:
            raise DiagnosisError(f"each finding needs a cause, got {item!r}")
        cites = tuple(
            Cite(str(c["path"]), str(c.get("says", ""))) for c in item.get("evidence") or ()
        )
        findings.append(Finding(str(item["cause"]), str(item.get("summary", "")), cites))
    return findings


def render(diagnosis: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines for claim.md."""
    lines = []
    for item in diagnosis:
        lines.append(f"- **{item['cause']}**: {item['summary']}")
        for cite in item["evidence"]:
            lines.append(f"  - `{cite['path']}` = {cite['value']:.4g}: {cite['says']}")
    return lines
