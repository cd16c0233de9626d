"""Fourth pilot (seed 33, outside the registered and replication sets), after the third showed
the instrument latent reading little of the PSF from a neighbouring galaxy (R^2 of the condition
0.29): the neighbour is now a star in the same exposure. The method and the autoencoder at the
registered 60 epochs. Writes results/pilots/pilot_budget4.json.

    uv run python results/pilots/pilot_budget4.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 33
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.003}, stage="pilot"),
        Job("autoencoder", seed, {"lr": 0.003}, stage="pilot"),
    ]
    run_pilot(jobs, {"max_epochs": 60}, "pilot4", HERE / "pilot_budget4.json")
