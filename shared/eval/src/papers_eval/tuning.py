"""Equal tuning on the validation split for every method, baseline and control.

``configs/claim.yaml`` declares the grid once::

    tuning:
      split: val                       # never the test split
      metric: val_mse
      goal: lower
      grid: {lr: [0.003, 0.01, 0.03]}  # every subject gets these values
      per_subject:                     # knobs only some subjects have
        sinkhorn: {tau: [0.1, 0.3, 1.0]}

``tune`` scores every configuration of every subject with the project's function and keeps the
best; the trials go into the record. Subjects that have knobs all get the same number of
configurations (equal budget); a subject with no knob at all is recorded as untuned.
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
    return grids


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
    best: Mapping[str, dict[str, Any]]  # subject -> params

    def as_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "metric": self.metric,
            "goal": self.goal,
            "seed": self.seed,
            "trials": {s: list(t) for s, t in self.trials.items()},
            "best": dict(self.best),
        }


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
    trials, best = {}, {}
    for subject, grid in grids.items():
        if grid == [{}]:
            trials[subject], best[subject] = [], {}
            continue
        trials[subject] = [{"params": p, "score": float(score(subject, p, seed))} for p in grid]
        best[subject] = better(trials[subject], key=lambda t: _comparable(t["score"], better))[
            "params"
        ]
    return TuningResult(
        split=str(spec.tuning.get("split", "")),
        metric=str(spec.tuning.get("metric", "")),
        goal=str(spec.tuning.get("goal", "")),
        seed=seed,
        trials=trials,
        best=best,
    )
