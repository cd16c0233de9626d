"""Pilot for issue 60 on seed 7 (outside the registered seeds 0-2 and the replication seeds
10-12), run BEFORE the registered record: the SGD learning-rate range at equal updates, and
whether the in-family control moves the answer NLL. Writes pilot_issue60.json beside it.

    cd projects/v-pretraining && uv run python results/pilots/pilot_issue60.py [BASE_DIGEST]

BASE_DIGEST: a base already stored under runs/v-pretraining/inputs (else it is trained).
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from vpretrain.claim import CLAIM_FILE, Runner, _key

SEED = 7


def main() -> None:
    settings = yaml.safe_load(CLAIM_FILE.read_text())["settings"]
    runner = Runner(settings, {"workers": 2, "fresh": False, "scheduler": None})
    start = time.perf_counter()
    if len(sys.argv) > 1:
        runner.bases["base"] = sys.argv[1]
        runner.cache[_key(("base",))] = {"score": {}}
    else:
        runner("base")
    steps = settings["steps"]
    sgd = steps["vpretrain_sgd"]
    jobs = [("language", "plain_sgd", {"lr": lr}, SEED, sgd) for lr in (0.1, 0.3, 1.0)]
    jobs += [
        ("language", "in_family_sgd", {"lr": 0.3}, SEED, sgd),
        ("language", "vpretrain_sgd", {"lr": 0.3}, SEED, sgd),
        ("language", "in_family", {"lr": 0.001}, SEED, steps["in_family"]),
        ("language", "fixed_soft", {"lr": 0.001}, SEED, steps["fixed_soft"]),
        ("language", "plain", {"lr": 0.001}, SEED, steps["plain"]),
    ]
    runner.prefetch(jobs)
    rows = []
    for job in jobs:
        r = runner(*job)
        rows.append(
            {
                "subject": job[1],
                "params": job[2],
                "steps": job[4],
                "val_answer_nll": r["val_answer_nll"],
                "test_answer_nll": float(np.mean(r["test_answer_nll"])),
                "test_prose_nll": float(np.mean(r["test_prose_nll"])),
                "mixing_end": r.get("mixing_end"),
                "wall_s": r["wall_s"],
            }
        )
        print(rows[-1], flush=True)
    out = {"seed": SEED, "base": runner.bases["base"], "rows": rows,
           "wall_s": time.perf_counter() - start}  # fmt: skip
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
