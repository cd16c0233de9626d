"""Exploratory, not judged (issue 60): the value restricted to the answer-bearing positions
(``--model.value_positions results``: the value and the designer's regularisers count only
the stream's stated-result digits) against the registered value over all positions, for the
method on AdamW (equal wall time: 183 updates) and on SGD (183 updates), beside plain at the
same updates, on seeds 20-22 (outside the registered 0-2, the replication 10-12 and the pilot
7). Learning rates: the ones the registered record tuned (argv).

    cd projects/v-pretraining
    uv run python results/pilots/answer_positions.py ADAMW_LR SGD_LR PLAIN_SGD_LR PLAIN_LR BASE
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from vpretrain.claim import CLAIM_FILE, Runner, _key

SEEDS = (20, 21, 22)


def main() -> None:
    adamw_lr, sgd_lr, plain_sgd_lr, plain_lr = (float(x) for x in sys.argv[1:5])
    settings = yaml.safe_load(CLAIM_FILE.read_text())["settings"]
    runner = Runner(settings, {"workers": 2, "fresh": False, "scheduler": None})
    runner.bases["base"] = sys.argv[5]
    runner.cache[_key(("base",))] = {"score": {}}
    start = time.perf_counter()
    n = settings["steps"]["vpretrain"]
    arms = {
        "vpretrain all": ("vpretrain", {"lr": adamw_lr}),
        "vpretrain results": ("vpretrain", {"lr": adamw_lr, "value_positions": "results"}),
        "plain (equal updates)": ("plain_equal_updates", {"lr": plain_lr}),
        "vpretrain_sgd all": ("vpretrain_sgd", {"lr": sgd_lr}),
        "vpretrain_sgd results": ("vpretrain_sgd", {"lr": sgd_lr, "value_positions": "results"}),
        "plain_sgd": ("plain_sgd", {"lr": plain_sgd_lr}),
    }
    jobs = {
        (name, seed): ("language", subject, params, seed, n)
        for name, (subject, params) in arms.items()
        for seed in SEEDS
    }
    runner.prefetch(list(jobs.values()))
    out = {"seeds": list(SEEDS), "steps": n, "base": sys.argv[5], "arms": {}}
    for name, (subject, params) in arms.items():
        runs = [runner(*jobs[name, seed]) for seed in SEEDS]
        out["arms"][name] = {
            "subject": subject,
            "params": params,
            "test_answer_nll": [float(np.mean(r["test_answer_nll"])) for r in runs],
            "test_prose_nll": [float(np.mean(r["test_prose_nll"])) for r in runs],
            "mixing_end": [r.get("mixing_end") for r in runs],
            "mass_moved_corrupted": [r.get("mass_moved_corrupted") for r in runs],
            "mass_moved_other": [r.get("mass_moved_other") for r in runs],
            "mass_auroc": [r.get("mass_auroc") for r in runs],
        }
        print(name, out["arms"][name], flush=True)
    out["wall_s"] = time.perf_counter() - start
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
