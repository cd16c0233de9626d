"""Equal tuning on the validation split for every method, baseline and control.

``configs/claim.yaml`` declares the grid once::

    tuning:
      split: val                       # never the test split
      metric: val_mse
      goal: lower
      grid: {lr: [0.003, 0.01, 0.03]}  # every subject gets these values
      per_subject:                     # knobs only some subjects have
        sinkhorn: {tau: [0.1, 0.3, 1.0]}
      tie:                             # optional: near-ties go to the registered default
        tolerance: 0.01                #   scores within this of the best count as a tie
        prefer: {sinkhorn: {tau: 0.3}} #   a full configuration from the subject's grid

``tune`` scores every configuration of every subject with the project's function and keeps the
best; the trials go into the record. Subjects that have knobs all get the same number of
configurations (equal budget); a subject with no knob at all is recorded as untuned. With
``tie``, a subject whose preferred configuration scores within ``tolerance`` of its best keeps
the preferred one (validation noise should not move a subject off its registered default), and
the record says so under ``ties`` (best and preferred, with their scores, and the choice).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from papers_eval.claim import ClaimSpec


def tuning_grids(tuning: Mapping[str, Any], subjects: Iterable[str]) -> dict[str, list[dict]]:
    """subject -> the parameter dicts it is tried with. Raises ValueError for a grid on the test
    split, a ``per_subject`` entry for an unknown subject, or unequal budgets."""
    subjects = list(subjects)
    if not tuning:
        return {s: [{}] for s in subjects}
    if str(tuning.get("split", "")).lower().startswith("test"):
        raise ValueError("tuning must use a validation split, never the test split")
    for key in ("split", "metric", "goal"):
        if not tuning.get(key):
            raise ValueError(f"tuning needs '{key}'")
    if tuning["goal"] not in ("higher", "lower"):
        raise ValueError("tuning goal must be 'higher' or 'lower'")
    per_subject = tuning.get("per_subject") or {}
    unknown = set(per_subject) - set(subjects)
    if unknown:
        raise ValueError(f"tuning.per_subject names unknown subjects {sorted(unknown)}")
    grids = {
        s: _product({**(tuning.get("grid") or {}), **(per_subject.get(s) or {})}) for s in subjects
    }
    budgets = {s: len(g) for s, g in grids.items() if g != [{}]}
    if len(set(budgets.values())) > 1:
        raise ValueError(
            f"unequal tuning budgets {budgets}: give every tuned subject the same number of "
            "configurations"
        )
    _check_tie(tuning.get("tie"), grids)
    return grids


def _check_tie(tie: Any, grids: Mapping[str, list[dict]]) -> None:
    """``tuning.tie`` names a tolerance >= 0 and, per tuned subject, one configuration of its
    grid."""
    if tie is None:
        return
    if not isinstance(tie, Mapping) or set(tie) != {"tolerance", "prefer"}:
        raise ValueError("tuning.tie needs exactly 'tolerance' and 'prefer'")
    tolerance = tie["tolerance"]
    if not isinstance(tolerance, int | float) or not tolerance >= 0:
        raise ValueError(f"tuning.tie.tolerance must be a number >= 0, got {tolerance!r}")
    for subject, params in (tie["prefer"] or {}).items():
        if subject not in grids or grids[subject] == [{}]:
            raise ValueError(f"tuning.tie.prefer names '{subject}', which has no tuning grid")
        if dict(params) not in grids[subject]:
            raise ValueError(
                f"tuning.tie.prefer: {dict(params)} is not a configuration of '{subject}''s "
                f"grid {grids[subject]}"
            )


def _product(grid: Mapping[str, Iterable[Any]]) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


def _comparable(score: float, better: Callable) -> float:
    """A failed configuration (NaN score) ranks last whichever way is better."""
    if math.isfinite(score):
        return score
    return -math.inf if better is max else math.inf


@dataclass(frozen=True)
class TuningResult:
    """What every subject was tried with, the validation scores, and the choice."""

    split: str
    metric: str
    goal: str
    seed: int
    trials: Mapping[str, list[dict[str, Any]]]  # subject -> [{"params", "score"}]
    best: Mapping[str, dict[str, Any]]  # subject -> params (the choice, after any tie rule)
    ties: Mapping[str, dict[str, Any]] | None = None  # with ``tuning.tie``: subject -> decision

    def as_dict(self) -> dict[str, Any]:
        out = {
            "split": self.split,
            "metric": self.metric,
            "goal": self.goal,
            "seed": self.seed,
            "trials": {s: list(t) for s, t in self.trials.items()},
            "best": dict(self.best),
        }
        if self.ties is not None:
            out["ties"] = dict(self.ties)
        return out


def tune(
    spec: ClaimSpec,
    score: Callable[[str, dict[str, Any], int], float],
    *,
    seed: int | None = None,
) -> TuningResult:
    """Score every configuration of every subject on the validation split and keep the best.

    ``score(subject, params, seed)`` trains/evaluates one configuration and returns the
    validation metric. Runs on ``seed`` (default: the spec's first seed).
    """
    seed = spec.seeds[0] if seed is None else seed
    grids = tuning_grids(spec.tuning, spec.subjects)
    better = max if spec.tuning.get("goal", "lower") == "higher" else min
    tie = spec.tuning.get("tie")
    prefer = dict((tie or {}).get("prefer") or {})
    trials, best, ties = {}, {}, {}
    for subject, grid in grids.items():
        if grid == [{}]:
            trials[subject], best[subject] = [], {}
            continue
        trials[subject] = [{"params": p, "score": float(score(subject, p, seed))} for p in grid]
        top = better(trials[subject], key=lambda t: _comparable(t["score"], better))
        best[subject] = top["params"]
        if subject in prefer:
            preferred = next(t for t in trials[subject] if t["params"] == dict(prefer[subject]))
            gap = abs(top["score"] - preferred["score"])
            kept = math.isfinite(gap) and gap <= float(tie["tolerance"])
            if kept:
                best[subject] = preferred["params"]
            ties[subject] = {
                "best": top["params"],
                "best_score": top["score"],
                "preferred": preferred["params"],
                "preferred_score": preferred["score"],
                "chosen": "preferred" if kept else "best",
            }
    return TuningResult(
        split=str(spec.tuning.get("split", "")),
        metric=str(spec.tuning.get("metric", "")),
        goal=str(spec.tuning.get("goal", "")),
        seed=seed,
        trials=trials,
        best=best,
        ties=ties if tie is not None else None,
    )


def grid_edges(
    tuning: TuningResult, grids: Mapping[str, list[dict[str, Any]]], param: str
) -> dict[str, dict[str, Any]]:
    """Where each subject's tuned ``param`` sits in its grid: the chosen value, the grid's ends,
    its size and ``at_edge`` (None for a grid of fewer than 3 values, where an end says
    nothing). The protocol extends a grid whose best value sits on an end before it judges a
    comparison. Subjects without ``param`` in their choice are left out."""
    out = {}
    for subject, best in tuning.best.items():
        if param not in best:
            continue
        values = sorted({params[param] for params in grids[subject]})
        chosen = best[param]
        out[subject] = {
            "param": param,
            "chosen": chosen,
            "low": values[0],
            "high": values[-1],
            "values": len(values),
            "at_edge": None if len(values) < 3 else chosen in (values[0], values[-1]),
        }
    return out
