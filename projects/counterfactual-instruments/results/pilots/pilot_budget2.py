"""Second pilot (seed 31, outside the registered and replication sets), after the first showed
the method still improving at 2x the 25-epoch budget: the method at 40 epochs with two
learning rates and at 80, the baselines and the wide instrument latent at 40. Writes
results/pilots/pilot_budget2.json.

    uv run python results/pilots/pilot_budget2.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 31
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.003}, stage="pilot"),
        Job("dual_counterfactual", seed, {"lr": 0.01}, stage="pilot"),
        Job("dual_counterfactual", seed, {"lr": 0.003, "budget": 2.0}, stage="pilot"),
        Job("autoencoder", seed, {"lr": 0.003}, stage="pilot"),
        Job("contrastive", seed, {"lr": 0.003}, stage="pilot"),
        Job("translation", seed, {"lr": 0.003}, stage="pilot"),
        Job("wide_instrument_latent", seed, {"lr": 0.003}, stage="pilot"),
    ]
    run_pilot(jobs, {"max_epochs": 40}, "pilot2", HERE / "pilot_budget2.json")
