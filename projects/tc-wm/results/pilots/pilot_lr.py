"""Unregistered check after the registered run (seeds 0-2, kappa 1, the claim's settings): TC-WM
at the learning rates beside its tuned 0.003, one below (0.001) and one beyond the grid's top
(0.01). Run from the project folder: `uv run python results/pilots/pilot_lr.py LR SEED`; the
numbers of 2026-12-07 are in pilot_lr.jsonl."""

import json
import sys
from pathlib import Path

import torch
import yaml

from papers_eval.jobs import Job
from tcwm.claim import run_job


def main() -> None:
    torch.set_num_threads(1)
    settings = yaml.safe_load(Path("configs/claim.yaml").read_text())["settings"]
    lr, seed = float(sys.argv[1]), int(sys.argv[2])
    v = run_job(Job("tcwm", seed, {"lr": lr, "kappa": 1.0}), settings)
    print(
        json.dumps(
            {
                "lr": lr,
                "seed": seed,
                "success": float(v["success"].mean()),
                "aligned_r2": v["aligned_r2"],
                "probe_r2": v["probe_r2"],
                "val_loss": v["val_loss"],
                "persistence_success": float(v["persistence"]["success"].mean()),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
