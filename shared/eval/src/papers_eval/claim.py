"""The claim protocol: pre-registered checks, controls, seeds and a computed verdict.

A project pre-registers its claim in ``configs/claim.yaml``::

    claim: The trained model beats the mean predictor on held-out MSE.
    method: mlp                      # the paper's method
    baselines: [mean_predictor]      # real baselines, reported beside it
    controls:
      negative:                      # mechanism-free variants: must FAIL the checks
        - {name: untrained, why: the same network before training}
      positive:                      # oracles / known-good variants: must PASS the checks
        - {name: true_weights, why: the generating weights}
    seeds: [0, 1, 2]
    checks:
      - name: beats_the_mean
        metric: test_mse             # a metric the project computes
        goal: lower                  # lower is better
        against: mean_predictor      # relative check (or `threshold: 0.5` for an absolute one)
        ratio: 0.5                   # subject < 0.5 x reference (default 1)
        margin: 0.0                  # ... by at least this much (absolute, default 0)
        where: test split, 64 items per seed
    precondition:                    # optional: what must be true for the checks to mean
      - name: signal_exists          #   anything, judged first on a named subject
        subject: mean_predictor
        metric: test_mse
        goal: higher
        threshold: 0.1               # the mean predictor is not already good
        rule: interval               # or `estimate` (preconditions only), `every_seed`: below
    tuning: {split: val, metric: val_mse, goal: lower, grid: {lr: [0.003, 0.01, 0.03]}}
    settings: {max_epochs: 20}       # budgets: recorded with the run
    quick: {seeds: [0], settings: {max_epochs: 2}}   # overrides for --quick

Protocol v3 (``protocol: 3`` at the top of the file) adds, and then requires:

    replication: {seeds: [10, 11, 12]}   # disjoint from `seeds`; `reproduce --replicate`
    controls:
      negative: [{name: untrained, why: ...}]
      positive:                          # kind: oracle or in_family; pipeline: model or bypass
        - {name: true_weights_fit, kind: oracle, pipeline: model, why: ...}
      ceiling: [{name: true_latent, why: ...}]   # reported beside the method, never judged

An ``oracle`` has privileged information but the SAME estimator, training and evaluation code as
the method (the fit on the true event times, not the true parameters); an ``in_family`` control
is the best member of the method's own hypothesis family, found with information the method
lacks. ``pipeline: bypass`` (it skips the project's model code) is refused unless
``pipeline_why`` says how it still exercises the pipeline the method runs through. A file without
``protocol: 3`` is a protocol-2 spec: it still loads (kinds and replication optional) and its
record is marked "protocol v2".

A check passes for a subject (the method or a control) when its whole confidence interval lies
on the good side: for ``goal: higher`` the advantage ``subject - ratio * reference - margin``
(or ``subject - threshold - margin``) must have a lower bound above 0; ``goal: lower`` flips the
sign. A precondition pre-registered as a point rule ("the oracle's mean error below 0.3") says
``rule: estimate``: it passes when the advantage's estimate is above 0, its interval is still
reported. A bound that must hold on each seed ("every seed's largest slope below 0.05") says
``rule: every_seed`` (checks and preconditions): it passes when each seed's advantage (the
seed's mean over its items, against each reference) is above 0, its interval is still
reported; with three seeds this is a per-seed bound, not an interval over seed means, whose
width a 3-seed t quantile (4.3) sets. Checks otherwise use the interval. The verdict
(``judge``) is

- ``not shown`` when a pre-registered precondition fails (the miniature does not pose the
  problem the claim is about), or a negative control passes every check it is judged on, or a
  positive control fails one: the miniature cannot tell a working mechanism from a broken one;
- otherwise ``held`` when the method passes every check, ``did not hold`` when it does not.

With a replication (``combined_verdict``): both judgements alike give that verdict, ``held`` on
the registered seeds and ``did not hold`` on the replication seeds (or the reverse) give
``mixed``, a ``not shown`` on either gives ``not shown``. A ``held`` whose replication was not
run is recorded as ``held, not replicated``.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from papers_eval.record import git_revision
from papers_eval.stats import (
    Interval,
    PerSeed,
    contrast_interval,
    per_seed_arrays,
    per_seed_means,
)
from papers_eval.tuning import tuning_grids

VERDICTS = ("held", "held, not replicated", "did not hold", "mixed", "not shown")
SEED_SET_VERDICTS = ("held", "did not hold", "not shown")  # one judgement on one seed set
MIN_SEEDS = 3
PROTOCOL = 3  # the claim protocol this papers_eval implements (specs may still say 2)
CONTROL_KINDS = {
    "negative": ("negative",),
    "positive": ("oracle", "in_family"),
    "ceiling": ("ceiling",),
}
PIPELINES = ("model", "bypass")

# metric -> per-seed values, for one subject; subject -> that, for a whole run
SubjectResults = Mapping[str, PerSeed]
Results = Mapping[str, SubjectResults]


class ClaimSpecError(ValueError):
    """``configs/claim.yaml`` (or the results given for it) cannot be judged; the message says
    what to fix. Raised before any training where possible."""

    user_facing = True


@dataclass(frozen=True)
class Check:
    """One pre-registered comparison, applied identically to the method and every control."""

    name: str
    metric: str
    goal: Literal["higher", "lower"]
    threshold: float | None = None
    against: tuple[str, ...] = ()
    ratio: float = 1.0
    margin: float = 0.0
    paired: bool = True
    where: str = ""
    subject: str | None = None  # preconditions only: the one subject they are judged on
    rule: Literal["interval", "estimate", "every_seed"] = "interval"  # estimate: preconditions

    def describe(self) -> str:
        """The check in words, e.g. ``test_mse lower than 0.5 x mean_predictor``."""
        side = "above" if self.goal == "higher" else "below"
        if self.threshold is not None:
            bar = f"{self.threshold:g}"
        else:
            scale = "" if self.ratio == 1 else f"{self.ratio:g} x "
            bar = " and ".join(f"{scale}{name}" for name in self.against)
        margin = f" by more than {self.margin:g}" if self.margin else ""
        where = f" ({self.where})" if self.where else ""
        subject = f"{self.subject}'s " if self.subject else ""
        mean = {"estimate": "mean ", "every_seed": "every seed's "}.get(self.rule, "")
        return f"{subject}{mean}{self.metric} {side} {bar}{margin}{where}"


@dataclass(frozen=True)
class Control:
    """A negative control must fail, a positive control must pass, the checks it is judged on
    (all of them unless ``checks`` names a subset); a ceiling is reported and never judged.

    ``kind``: ``negative``, ``oracle`` or ``in_family`` (positive), ``ceiling``; empty in a
    protocol-2 spec. ``pipeline``: ``model`` when the control runs through the project's model,
    training and evaluation code like the method, ``bypass`` when it does not (then
    ``pipeline_why`` says how it still exercises the method's pipeline).
    """

    name: str
    role: Literal["negative", "positive", "ceiling"]
    why: str
    checks: tuple[str, ...]
    kind: str = ""
    pipeline: str = ""
    pipeline_why: str = ""

    @property
    def judged(self) -> bool:
        return self.role != "ceiling"


@dataclass(frozen=True)
class ClaimSpec:
    """``configs/claim.yaml``, validated against the subjects and metrics the project has."""

    claim: str
    method: str
    baselines: tuple[str, ...]
    controls: tuple[Control, ...]
    checks: tuple[Check, ...]
    seeds: tuple[int, ...]
    quick: bool = False
    confidence: float = 0.95
    tuning: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    preconditions: tuple[Check, ...] = ()
    started_at_revision: str = ""  # the code's git revision when the run read its spec
    protocol: int = 2  # 3 when the file says ``protocol: 3``
    replication_seeds: tuple[int, ...] = ()
    replicating: bool = False  # this spec judges the replication seeds (``for_replication``)
    allow_dirty: bool = False  # the run was allowed to start from uncommitted changes
    spec_sha256: str = ""  # of the file's text: a changed spec is a re-specification

    def for_replication(self) -> ClaimSpec:
        """The same checks, controls, tuning rule and budgets on the replication seeds."""
        if not self.replication_seeds:
            raise ClaimSpecError(
                f"{self.source}: --replicate needs `replication: {{seeds: [...]}}` (seeds "
                "disjoint from `seeds`)"
            )
        return replace(self, seeds=self.replication_seeds, replicating=True)

    @property
    def judged_controls(self) -> tuple[Control, ...]:
        return tuple(c for c in self.controls if c.judged)

    @property
    def ceilings(self) -> tuple[Control, ...]:
        return tuple(c for c in self.controls if not c.judged)

    @property
    def subjects(self) -> tuple[str, ...]:
        """Everything a run must measure: method, baselines, controls and what the
        preconditions are judged on (each once, in order)."""
        names = (self.method, *self.baselines, *(c.name for c in self.controls))
        for check in self.preconditions:
            names += (check.subject, *check.against)
        return tuple(dict.fromkeys(names))

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.metric for c in (*self.checks, *self.preconditions)))

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "method": self.method,
            "baselines": list(self.baselines),
            "controls": [asdict(c) for c in self.controls],
            "checks": [asdict(c) | {"text": c.describe()} for c in self.checks],
            "preconditions": [asdict(c) | {"text": c.describe()} for c in self.preconditions],
            "seeds": list(self.seeds),
            "replication_seeds": list(self.replication_seeds),
            "protocol": self.protocol,
            "quick": self.quick,
            "confidence": self.confidence,
            "tuning": dict(self.tuning),
            "settings": dict(self.settings),
            "source": self.source,
        }


def load_claim_spec(
    path: str | Path,
    *,
    subjects: Iterable[str],
    metrics: Iterable[str],
    quick: bool = False,
    seeds: Sequence[int] | None = None,
    allow_dirty: bool = False,
    args: Any = None,
) -> ClaimSpec:
    """Read and validate ``configs/claim.yaml`` before anything trains.

    ``subjects``: every name the project can run (method, baselines, controls); ``metrics``: every
    metric it computes. ``quick`` applies the file's ``quick:`` overrides; ``seeds`` (from
    ``--seeds``) replaces the file's. ``args``: the parsed ``reproduce`` flags (papers_cli's
    ``reproduce_parser``), read for ``quick``, ``seeds`` and ``allow_dirty`` in place of the
    keywords. Raises ``ClaimSpecError`` naming the problem: an unknown method or metric, a
    missing negative or positive control, fewer than 3 seeds outside ``--quick``, a malformed
    check, a protocol-3 rule broken, or (outside ``--quick``, without ``allow_dirty``) a
    repository with uncommitted changes: a record must name the code that produced it.
    """
    if args is not None:
        quick = bool(getattr(args, "quick", quick))
        seeds = getattr(args, "seeds", seeds)
        allow_dirty = bool(getattr(args, "allow_dirty", allow_dirty))
    path = Path(path)
    if not path.is_file():
        raise ClaimSpecError(
            f"{path} is missing: every reproduce pre-registers its checks and controls there."
        )
    text = path.read_text()
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ClaimSpecError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ClaimSpecError(f"{path} must hold a mapping of keys (claim, method, checks, ...)")
    overrides = raw.pop("quick", None) or {}
    if quick:
        raw = _deep_merge(raw, overrides)
    if seeds is not None:
        raw["seeds"] = list(seeds)
    spec = _parse_spec(raw, str(path), set(subjects), set(metrics), quick)
    # The code a run measures is the code it started with: record that revision now, not when
    # the record is written (a commit made during a long run would otherwise label it).
    revision = code_revision(path)
    if revision.endswith("+dirty") and not quick and not allow_dirty:
        raise ClaimSpecError(
            f"the repository holding {path} has uncommitted changes ({revision}): a claim record "
            "must name the code that produced it. Commit first, or pass --allow-dirty (the "
            "record and the papers table then say so)."
        )
    return replace(
        spec,
        started_at_revision=revision,
        allow_dirty=allow_dirty and revision.endswith("+dirty"),
        spec_sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


def code_revision(spec_path: str | Path) -> str:
    """The revision of the repository holding ``configs/claim.yaml``, the project's ``results/``
    left out of the dirty check (a rerun rewriting it is not a code change)."""
    configs = Path(spec_path).resolve().parent
    return git_revision(configs, ignore=configs.parent / "results")


def _parse_spec(
    raw: dict, source: str, known_subjects: set[str], known_metrics: set[str], quick: bool
) -> ClaimSpec:
    def fail(message: str) -> ClaimSpecError:
        return ClaimSpecError(f"{source}: {message}")

    unknown_keys = set(raw) - {
        "claim",
        "method",
        "baselines",
        "controls",
        "checks",
        "seeds",
        "confidence",
        "tuning",
        "settings",
        "precondition",
        "protocol",
        "replication",
    }
    if unknown_keys:
        raise fail(f"unknown keys {sorted(unknown_keys)}")
    for key in ("claim", "method", "checks", "controls", "seeds"):
        if not raw.get(key):
            raise fail(f"'{key}' is missing or empty")
    protocol = raw.get("protocol", 2)
    if protocol not in (2, PROTOCOL):
        raise fail(f"protocol must be 2 or {PROTOCOL}, got {protocol!r}")
    v3 = protocol == PROTOCOL

    def known(name: Any, what: str) -> str:
        if name not in known_subjects:
            raise fail(
                f"{what} '{name}' is not something this project runs; known: "
                f"{sorted(known_subjects)}"
            )
        return name

    method = known(raw["method"], "method")
    baselines = tuple(known(b, "baseline") for b in raw.get("baselines") or ())

    def parse_check(item: Any, precondition: bool = False) -> Check:
        what = "precondition" if precondition else "check"
        if not isinstance(item, dict) or not item.get("name") or not item.get("metric"):
            raise fail(f"each {what} needs a name and a metric, got {item!r}")
        name = item["name"]
        only_preconditions = {"subject"}
        allowed = set(Check.__dataclass_fields__) - (set() if precondition else only_preconditions)
        extra = set(item) - allowed
        if extra:
            raise fail(f"{what} '{name}' has unknown keys {sorted(extra)}")
        if item["metric"] not in known_metrics:
            raise fail(
                f"{what} '{name}' names the metric '{item['metric']}', which this project "
                f"does not compute; known: {sorted(known_metrics)}"
            )
        if item.get("goal") not in ("higher", "lower"):
            raise fail(f"{what} '{name}' needs goal: higher or goal: lower")
        against = item.get("against") or ()
        against = (against,) if isinstance(against, str) else tuple(against)
        if (item.get("threshold") is None) == (not against):
            raise fail(f"{what} '{name}' needs exactly one of 'threshold' or 'against'")
        for reference in against:
            known(reference, f"{what} '{name}': reference")
        if precondition and not item.get("subject"):
            raise fail(f"precondition '{name}' needs the subject it is judged on")
        rule = item.get("rule", "interval")
        rules = (
            ("interval", "estimate", "every_seed") if precondition else ("interval", "every_seed")
        )
        if rule not in rules:
            raise fail(
                f"{what} '{name}' needs rule: {' or rule: '.join(rules)}"
                + ("" if precondition else " (rule: estimate is for preconditions only)")
            )
        return Check(
            name=name,
            metric=item["metric"],
            goal=item["goal"],
            threshold=None if item.get("threshold") is None else float(item["threshold"]),
            against=against,
            ratio=float(item.get("ratio", 1.0)),
            margin=float(item.get("margin", 0.0)),
            paired=bool(item.get("paired", True)),
            where=str(item.get("where", "")),
            subject=known(item["subject"], f"precondition '{name}': subject")
            if precondition
            else None,
            rule=rule,
        )

    checks = [parse_check(item) for item in raw["checks"]]
    preconditions = [parse_check(item, True) for item in raw.get("precondition") or ()]
    if len({c.name for c in preconditions}) != len(preconditions):
        raise fail(f"precondition names repeat: {[c.name for c in preconditions]}")
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        raise fail(f"check names repeat: {names}")

    controls = []
    declared = raw["controls"]
    if not isinstance(declared, dict) or set(declared) - set(CONTROL_KINDS):
        raise fail("'controls' must map 'negative', 'positive' (and 'ceiling') to lists")
    for role in CONTROL_KINDS:
        entries = declared.get(role) or []
        if not entries and role != "ceiling":
            kind = (
                "a mechanism-free variant that must fail"
                if role == "negative"
                else ("an oracle or in-family variant that must pass")
            )
            raise fail(f"no {role} control: add {kind} the checks")
        for entry in entries:
            entry = {"name": entry} if isinstance(entry, str) else dict(entry)
            controls.append(_parse_control(entry, role, names, v3, known, fail))
    if method in {c.name for c in controls}:
        raise fail(f"the method '{method}' cannot also be a control")
    if len({c.name for c in controls}) != len(controls):
        raise fail(f"a control is declared twice: {[c.name for c in controls]}")

    seeds = _seed_list(raw["seeds"], "seeds", fail)
    if not quick and len(seeds) < MIN_SEEDS:
        raise fail(
            f"a claim run needs at least {MIN_SEEDS} seeds, got {seeds} (only --quick "
            "may use fewer)"
        )
    replication = raw.get("replication") or {}
    if not isinstance(replication, dict) or set(replication) - {"seeds"}:
        raise fail("'replication' must be a mapping with one key, seeds: [...]")
    replication_seeds = _seed_list(replication.get("seeds") or [], "replication seeds", fail)
    if v3 and not quick and len(replication_seeds) < MIN_SEEDS:
        raise fail(
            f"protocol 3 needs `replication: {{seeds: [...]}}` with at least {MIN_SEEDS} seeds "
            f"disjoint from `seeds`, got {replication_seeds}"
        )
    if set(replication_seeds) & set(seeds):
        raise fail(
            f"replication seeds {replication_seeds} overlap the seeds {seeds}: a replication "
            "judges seeds the registered run did not see"
        )
    try:
        tuning_grids(raw.get("tuning") or {}, {method, *baselines, *(c.name for c in controls)})
    except ValueError as error:
        raise fail(str(error)) from None
    confidence = float(raw.get("confidence", 0.95))
    if not 0 < confidence < 1:
        raise fail(f"confidence must lie in (0, 1), got {confidence}")
    return ClaimSpec(
        claim=str(raw["claim"]).strip(),
        method=method,
        baselines=baselines,
        controls=tuple(controls),
        checks=tuple(checks),
        seeds=tuple(seeds),
        quick=quick,
        confidence=confidence,
        tuning=raw.get("tuning") or {},
        settings=raw.get("settings") or {},
        source=source,
        preconditions=tuple(preconditions),
        protocol=protocol,
        replication_seeds=tuple(replication_seeds),
    )


def _seed_list(seeds: Any, what: str, fail: Callable[[str], ClaimSpecError]) -> list[int]:
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in seeds
    ):
        raise fail(f"'{what}' must be a list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise fail(f"{what} repeat: {seeds}")
    return seeds


def _parse_control(
    entry: dict,
    role: str,
    check_names: list[str],
    v3: bool,
    known: Callable[[Any, str], str],
    fail: Callable[[str], ClaimSpecError],
) -> Control:
    """One entry of ``controls.<role>``; protocol 3 requires a kind, a reason, and for a positive
    control the pipeline it runs through."""
    name = entry.get("name")
    extra = set(entry) - {"name", "why", "checks", "kind", "pipeline", "pipeline_why"}
    if extra:
        raise fail(f"control '{name}' has unknown keys {sorted(extra)}")
    control_checks = tuple(entry.get("checks") or check_names)
    missing = set(control_checks) - set(check_names)
    if missing:
        raise fail(f"control '{name}' names unknown checks {sorted(missing)}")
    kinds = CONTROL_KINDS[role]
    kind = entry.get("kind") or (kinds[0] if len(kinds) == 1 else "")
    if kind and kind not in kinds:
        raise fail(f"{role} control '{name}' has kind '{kind}'; a {role} control is one of {kinds}")
    why = str(entry.get("why", "")).strip()
    pipeline = entry.get("pipeline") or ""
    pipeline_why = str(entry.get("pipeline_why", "")).strip()
    if pipeline and pipeline not in PIPELINES:
        raise fail(f"control '{name}': pipeline must be one of {PIPELINES}, got {pipeline!r}")
    if v3 and role == "positive":
        if not kind:
            raise fail(
                f"positive control '{name}' needs kind: oracle (privileged information, the "
                "method's own estimator, training and evaluation code) or in_family (the best "
                "member of the method's own family, found with information the method lacks)"
            )
        if not why:
            raise fail(f"positive control '{name}' needs a `why`: what makes it a {kind}")
        if not pipeline:
            raise fail(
                f"positive control '{name}' needs pipeline: model (it runs through the "
                "project's model, training and evaluation code like the method) or bypass"
            )
        if pipeline == "bypass" and not pipeline_why:
            raise fail(
                f"positive control '{name}' bypasses the project's model code: a control that "
                "passes by construction proves nothing about the miniature. Route it through "
                "the model, or say in `pipeline_why` how it exercises the method's pipeline"
            )
    return Control(
        name=known(name, f"{role} control"),
        role=role,
        why=why,
        checks=control_checks,
        kind=kind,
        pipeline=pipeline,
        pipeline_why=pipeline_why,
    )


def _deep_merge(base: dict, override: Mapping) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass(frozen=True)
class CheckOutcome:
    """One subject on one check: the advantage over the bar with its interval, and the call."""

    subject: str
    check: str
    advantage: Interval  # > 0 is on the good side of the bar
    passed: bool

    def as_dict(self) -> dict:
        return {"passed": self.passed, "advantage": self.advantage.as_dict()}


@dataclass(frozen=True)
class ControlOutcome:
    name: str
    role: str
    passed_its_checks: bool
    behaved: bool  # a negative control failed, a positive control passed
    kind: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Judgement:
    verdict: str
    reason: str
    method_passed: bool
    outcomes: Mapping[str, Mapping[str, CheckOutcome]]  # subject -> check -> outcome
    controls: tuple[ControlOutcome, ...]
    preconditions: Mapping[str, CheckOutcome] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()

    @property
    def precondition_met(self) -> bool:
        return all(o.passed for o in self.preconditions.values())

    @property
    def controls_behaved(self) -> bool:
        return all(c.behaved for c in self.controls)


def judge(spec: ClaimSpec, results: Results, *, n_resamples: int = 2000) -> Judgement:
    """Judge the preconditions, then apply every check to the method and to every control;
    return the verdict and why."""
    validate_results(spec, results)
    preconditions = {
        check.name: check_outcome(spec, check, check.subject, results, n_resamples=n_resamples)
        for check in spec.preconditions
    }
    # Ceilings get outcomes too (reported beside the method), but never enter the verdict.
    judged = [spec.method, *(c.name for c in spec.controls)]
    outcomes = {
        subject: {
            check.name: check_outcome(spec, check, subject, results, n_resamples=n_resamples)
            for check in spec.checks
        }
        for subject in judged
    }
    method_passed = all(o.passed for o in outcomes[spec.method].values())
    controls = []
    for control in spec.judged_controls:
        passed = all(outcomes[control.name][name].passed for name in control.checks)
        behaved = passed if control.role == "positive" else not passed
        controls.append(ControlOutcome(control.name, control.role, passed, behaved, control.kind))
    misbehaved = [c for c in controls if not c.behaved]
    unmet = [c for c in spec.preconditions if not preconditions[c.name].passed]
    if unmet:
        verdict = "not shown"
        reason = (
            "the precondition "
            + "; ".join(f"'{c.name}' ({c.describe()}) failed" for c in unmet)
            + ": the miniature does not pose the problem the claim is about"
        )
    elif misbehaved:
        verdict = "not shown"
        reason = (
            "; ".join(
                f"the {c.role} control '{c.name}' "
                + ("passed its checks" if c.role == "negative" else "failed a check")
                for c in misbehaved
            )
            + ": the miniature cannot tell a working mechanism from a broken one"
        )
    elif method_passed:
        verdict, reason = "held", "the method passed every check; the controls behaved"
    else:
        failed = [n for n, o in outcomes[spec.method].items() if not o.passed]
        verdict = "did not hold"
        reason = f"the method failed {', '.join(failed)}; the controls behaved"
    return Judgement(
        verdict, reason, method_passed, outcomes, tuple(controls), preconditions, spec.seeds
    )


def combined_verdict(main: Judgement, replication: Judgement | None) -> tuple[str, str]:
    """The record's verdict from the registered seeds' judgement and the replication's.

    ``not shown`` on either seed set wins (the miniature could not decide there); two alike give
    that verdict; ``held`` against ``did not hold`` is ``mixed``: a verdict that flips with the
    seed set is not a finding. Without a replication, ``held`` reads ``held, not replicated``.
    """
    if replication is None:
        if main.verdict == "held":
            return "held, not replicated", main.reason + " (replication not run)"
        return main.verdict, main.reason + " (replication not run)"
    seeds = f"replication seeds {list(replication.seeds)}"
    if main.verdict == replication.verdict:
        return main.verdict, f"{main.reason}; the same on the {seeds}"
    if "not shown" in (main.verdict, replication.verdict):
        where = "registered seeds" if main.verdict == "not shown" else seeds
        reason = main.reason if main.verdict == "not shown" else replication.reason
        return "not shown", f"not shown on the {where}: {reason}"
    return "mixed", (
        f"{main.verdict} on the registered seeds {list(main.seeds)} ({main.reason}) but "
        f"{replication.verdict} on the {seeds} ({replication.reason})"
    )


def check_outcome(
    spec: ClaimSpec, check: Check, subject: str, results: Results, *, n_resamples: int = 2000
) -> CheckOutcome:
    """The subject's advantage over the check's bar, with its interval (see the module doc).

    Against several references the subject must clear each; the outcome reports the reference
    it clears by the least (the lowest interval bound).
    """
    sign = 1.0 if check.goal == "higher" else -1.0
    values = results[subject][check.metric]
    if check.threshold is not None:
        shifted = [sign * (a - check.threshold) - check.margin for a in per_seed_arrays(values)]
        advantage = contrast_interval(
            [(1.0, shifted)], confidence=spec.confidence, n_resamples=n_resamples
        )
    else:
        candidates = []
        for reference in check.against:
            interval = contrast_interval(
                [(sign, values), (-sign * check.ratio, results[reference][check.metric])],
                paired=check.paired,
                confidence=spec.confidence,
                n_resamples=n_resamples,
            )
            candidates.append(_shift(interval, -check.margin))
        advantage = min(candidates, key=lambda i: (_nan_low(i.low), i.estimate))
    if check.rule == "every_seed":
        decisive = min(_per_seed_advantages(check, sign, values, results))
    elif check.rule == "estimate":
        decisive = advantage.estimate
    else:
        decisive = advantage.low
    passed = bool(math.isfinite(decisive) and decisive > 0)
    return CheckOutcome(subject, check.name, advantage, passed)


def _per_seed_advantages(
    check: Check, sign: float, values: PerSeed, results: Results
) -> list[float]:
    """``rule: every_seed``: each seed's advantage over the bar (seed means over items), the
    smallest over the references."""
    subject = np.asarray(per_seed_means(values))
    if check.threshold is not None:
        return list(sign * (subject - check.threshold) - check.margin)
    per_reference = [
        sign * (subject - check.ratio * np.asarray(per_seed_means(results[ref][check.metric])))
        - check.margin
        for ref in check.against
    ]
    return list(np.min(per_reference, axis=0))


def _shift(interval: Interval, by: float) -> Interval:
    return Interval(
        interval.estimate + by,
        interval.low + by,
        interval.high + by,
        interval.method,
        interval.paired,
        interval.n_seeds,
        interval.n_items,
    )


def _nan_low(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


def validate_results(spec: ClaimSpec, results: Results) -> None:
    """Every subject of the spec has every checked metric on every seed."""
    for subject in spec.subjects:
        if subject not in results:
            raise ClaimSpecError(f"no results for '{subject}' (declared in {spec.source})")
        for metric in spec.metrics:
            values = results[subject].get(metric)
            if values is None:
                raise ClaimSpecError(f"'{subject}' has no values of the metric '{metric}'")
            if len(values) != len(spec.seeds):
                raise ClaimSpecError(
                    f"'{subject}' has {len(values)} values of '{metric}' for "
                    f"{len(spec.seeds)} seeds {list(spec.seeds)}"
                )


def summarise(
    spec: ClaimSpec, results: Results, *, n_resamples: int = 2000
) -> dict[str, dict[str, dict[str, Any]]]:
    """subject -> metric -> ``{"mean", "ci", "per_seed", "interval"}`` for every metric the
    run reported (not only the checked ones)."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for subject, metrics in results.items():
        table[subject] = {}
        for metric, values in metrics.items():
            interval = contrast_interval(
                [(1.0, values)], confidence=spec.confidence, n_resamples=n_resamples
            )
            table[subject][metric] = {
                "mean": interval.estimate,
                "ci": [interval.low, interval.high],
                "per_seed": per_seed_means(values),
                "interval": interval.method,
            }
    return table


def run_seeds(
    spec: ClaimSpec, run_one: Callable[[str, int], Mapping[str, Any]]
) -> dict[str, dict[str, list]]:
    """Call ``run_one(subject, seed)`` for every subject and seed; collect its metrics.

    ``run_one`` returns metric -> value (or per-item values) for that subject and seed.
    """
    results: dict[str, dict[str, list]] = {s: {} for s in spec.subjects}
    for seed in spec.seeds:
        for subject in spec.subjects:
            for metric, value in run_one(subject, seed).items():
                results[subject].setdefault(metric, []).append(value)
    return results
