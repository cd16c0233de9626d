"""Sigma-edge pilot for issue 50 (not a record): the registered run at 94253a9 tuned PermFlow's
base scale to sigma_scale 0.5, the lower edge of its grid {0.5, 1, 2} (validation scores 0.726 /
0.704 / 0.711). This scores the next values down, 0.25 and 0.125, the same way: seed 0, both
tasks, the registered budget, val_score on the validation split (the 0.5 / 1 / 2 runs are read
from the registered run's job cache when it is present), and the test metrics of each, so the
edge's cost can be read. Outcome known: it judges nothing and changes no registration.

    cd projects/permflow && uv run python results/pilots/sigma_edge.py

writes results/pilots/sigma_edge.json (the job runner's progress goes to stdout).
"""

import json
import sys
from pathlib import Path

import torch

from papers_eval import load_claim_spec
from permflow.claim import CLAIM_FILE, METRICS, SUBJECTS, TASKS, Runner, mean_of, val_score

SEED, SCALES = 0, (0.125, 0.25, 0.5, 1.0, 2.0)


def main() -> None:
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS)
    runner = Runner(dict(spec.settings), {"workers": 2, "fresh": False, "scheduler": None})
    # stage "tune": a job's stage is part of its cache key, and the registered run's seed-0
    # trainings at 0.5 / 1 / 2 are tuning jobs
    runner.prefit(
        [("permflow", task, {"sigma_scale": s}, SEED) for s in SCALES for task in TASKS],
        stage="tune",
    )
    torch.set_num_threads(1)
    rows = []
    for scale in SCALES:
        params = {"sigma_scale": scale}
        val = {task: runner.scores("permflow", task, params, SEED, "val") for task in TASKS}
        row = {"sigma_scale": scale, "val_score": val_score(val)}
        for task in TASKS:
            test = runner.scores("permflow", task, params, SEED, "test")
            for key in ("both_modes", "valid_rate", "accuracy"):
                if key in test:
                    row[f"test_{task}_{key}"] = mean_of(test, key)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    (Path(__file__).parent / "sigma_edge.json").write_text(
        json.dumps({"seed": SEED, "rows": rows}, indent=1) + "\n"
    )


if __name__ == "__main__":  # the job runner's spawned workers import this file
    main()
