"""Budget-curve pilot for issue 50 (not a record): PermFlow and the Sinkhorn network on task A
(sorting) at 800 / 1,600 / 3,200 steps (1x / 2x / 4x the steps registered when it ran; equal for
both; the multiplier is taken against whatever claim.yaml registers now), on seed 10 (outside the
registered seeds 0-2 and the replication seeds 3-5), at the registered defaults (sigma scale 1,
tau 1). Test metrics, and PermFlow's fit at t < 0.05 on the training and test splits.

    cd projects/permflow && uv run python results/pilots/budget_curve.py

writes results/pilots/budget_curve.json (the job runner's progress goes to stdout, one row per
run to stderr).
"""

import json
import sys
from pathlib import Path

import torch

from papers_eval import load_claim_spec
from permflow.claim import CLAIM_FILE, METRICS, SUBJECTS, Runner, mean_of
from permflow.evaluate import early_fit

SEED, STEPS = 10, (800, 1600, 3200)
SUBJECT_PARAMS = {"permflow": {"sigma_scale": 1.0}, "sinkhorn": {"sinkhorn_tau": 1.0}}


def main() -> None:
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS)
    settings = dict(spec.settings)
    runner = Runner(settings, {"workers": 2, "fresh": False, "scheduler": None})
    registered = settings["sorting"]["max_steps"]
    runs = [
        (subject, "sorting", {**params, "multiplier": steps / registered}, SEED)
        for steps in STEPS
        for subject, params in SUBJECT_PARAMS.items()
    ]
    runner.prefit(runs, stage="pilot")
    torch.set_num_threads(1)
    out = []
    for subject, task, params, seed in runs:
        result = runner.scores(subject, task, params, seed, "test")
        row = {
            "subject": subject,
            "steps": round(settings[task]["max_steps"] * params["multiplier"]),
            "train_s": result["train_s"],
            **{k: mean_of(result, k) for k in ("both_modes", "valid_rate", "accuracy")},
        }
        if subject == "permflow":
            model, data, _ = runner.fit(subject, task, params, seed)
            row["coupling_valid"] = mean_of(result, "coupling_valid")
            torch.manual_seed(seed)
            row["early_fit_train"] = early_fit(model, data.train_dataloader(), seed=seed)
            row["early_fit_test"] = early_fit(model, data.test_dataloader(), seed=seed)
        out.append(row)
        print(json.dumps(row), file=sys.stderr)
    (Path(__file__).parent / "budget_curve.json").write_text(
        json.dumps({"seed": SEED, "task": "sorting", "rows": out}, indent=1) + "\n"
    )


if __name__ == "__main__":  # the job runner's spawned workers import this file
    main()
