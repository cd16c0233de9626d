"""Third pilot (seed 32, outside the registered and replication sets), after the second showed
the method still improving from 40 to 80 epochs: wider seeing ranges (realistic for DECam and
HSC), a cosine learning-rate decay, 60 epochs and 2x. Writes results/pilots/pilot_budget3.json.

    uv run python results/pilots/pilot_budget3.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 32
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.003, "budget": 2.0}, stage="pilot"),
        Job("dual_counterfactual", seed, {"lr": 0.003}, stage="pilot"),
        Job("self_reconstruction", seed, {"lr": 0.003}, stage="pilot"),
        Job("autoencoder", seed, {"lr": 0.003}, stage="pilot"),
        Job("translation", seed, {"lr": 0.003}, stage="pilot"),
        Job("oracle", seed, {"lr": 0.003}, stage="pilot"),
        Job("contrastive", seed, {"lr": 0.003}, stage="pilot"),
    ]
    run_pilot(jobs, {"max_epochs": 60}, "pilot3", HERE / "pilot_budget3.json")
