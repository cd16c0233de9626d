"""SLAP budget pilot for issue 50 (not a record): the registered run at 94253a9 failed SLAP
validity clearly (PermFlow 0.636, the Sinkhorn network 0.972) while its budget evidence was
registered for the first failed check, a sorting one. This is the same evidence for SLAP:
PermFlow (the tuned sigma scale 0.5) and the Sinkhorn network (tau 1) at 1x / 2x / 4x the
registered SLAP steps (1,200 / 2,400 / 4,800; equal for both), seed 0 like the registered budget
evidence (its 1x runs are read from the registered run's job cache when present); test valid
rate and both-modes recovery, and PermFlow's fit at t < 0.05 on train and test. Outcome known:
it judges nothing and changes no registration.

    cd projects/permflow && uv run python results/pilots/slap_budget.py

writes results/pilots/slap_budget.json (the job runner's progress goes to stdout).
"""

import json
import sys
from pathlib import Path

import torch

from papers_eval import load_claim_spec
from permflow.claim import CLAIM_FILE, METRICS, SUBJECTS, Runner, mean_of
from permflow.evaluate import early_fit

SEED, MULTIPLIERS = 0, (1.0, 2.0, 4.0)
SUBJECT_PARAMS = {"permflow": {"sigma_scale": 0.5}, "sinkhorn": {"sinkhorn_tau": 1.0}}


def params_at(params: dict, multiplier: float) -> dict:
    """The registered run's cache keys carry no multiplier at 1x."""
    return params if multiplier == 1.0 else {**params, "multiplier": multiplier}


def main() -> None:
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS)
    settings = dict(spec.settings)
    runner = Runner(settings, {"workers": 2, "fresh": False, "scheduler": None})
    runs = [
        (subject, "slap", params_at(params, m), SEED)
        for m in MULTIPLIERS
        for subject, params in SUBJECT_PARAMS.items()
    ]
    # a job's stage is part of its cache key: the 1x runs are the registered run's tuning jobs
    runner.prefit([r for r in runs if "multiplier" not in r[2]], stage="tune")
    runner.prefit([r for r in runs if "multiplier" in r[2]], stage="pilot")
    torch.set_num_threads(1)
    out = []
    for (subject, task, params, seed), m in zip(
        runs, [m for m in MULTIPLIERS for _ in SUBJECT_PARAMS], strict=True
    ):
        result = runner.scores(subject, task, params, seed, "test")
        row = {
            "subject": subject,
            "steps": round(settings[task]["max_steps"] * m),
            "train_s": result["train_s"],
            **{k: mean_of(result, k) for k in ("both_modes", "valid_rate")},
        }
        if subject == "permflow":
            model, data, _ = runner.fit(subject, task, params, seed)
            row["coupling_valid"] = mean_of(result, "coupling_valid")
            torch.manual_seed(seed)
            row["early_fit_train"] = early_fit(model, data.train_dataloader(), seed=seed)
            row["early_fit_test"] = early_fit(model, data.test_dataloader(), seed=seed)
        out.append(row)
        print(json.dumps(row), file=sys.stderr)
    (Path(__file__).parent / "slap_budget.json").write_text(
        json.dumps({"seed": SEED, "task": "slap", "rows": out}, indent=1) + "\n"
    )


if __name__ == "__main__":  # the job runner's spawned workers import this file
    main()
