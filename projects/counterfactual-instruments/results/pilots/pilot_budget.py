"""Pilot (seeds outside the registered and replication sets): every subject at the registered
budget and at 2x on seed 30, lr 0.003, to see that the mechanism acts and training converged
before the claim is judged. Writes results/pilots/pilot_budget.json.

    uv run python results/pilots/pilot_budget.py [--jobs 2]
"""

from __future__ import annotations

import sys
from pathlib import Path

from common import run_pilot

from counterfactual_instruments.claim import SUBJECTS
from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    settings = {"max_epochs": 25}  # the registered budget when this pilot ran
    seed = 30
    jobs = [Job(s, seed, {"lr": 0.003}, stage="pilot") for s in SUBJECTS]
    jobs += [
        Job(s, seed, {"lr": 0.003, "budget": 2.0}, stage="pilot")
        for s in ("dual_counterfactual", "translation", "oracle", "autoencoder")
    ]
    workers = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
    run_pilot(
        jobs,
        settings,
        "pilot",
        HERE / "pilot_budget.json",
        key=lambda r: f"{r.job.subject} x{r.job.params.get('budget', 1.0)}",
        workers=workers,
    )
