"""Sixth pilot (seed 35, outside the registered and replication sets), after the registered run
of 833362c: its budget evidence showed the test metrics worse at 2x the epochs for both the
method and translation (counterfactual chi2 3.20 -> 3.85 and 5.26 -> 6.81, cross-instrument
probe R^2 0.42 -> 0.27). Does a shorter budget do as well or better? The method, translation and
the autoencoder at their registered learning rates, at a quarter, half and the whole of 60
epochs. Writes results/pilots/pilot_budget6.json.

    uv run python results/pilots/pilot_budget6.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 35
    rates = {"dual_counterfactual": 0.01, "translation": 0.003, "autoencoder": 0.01}
    jobs = [
        Job(subject, seed, {"lr": lr, "budget": budget}, stage="pilot")
        for subject, lr in rates.items()
        for budget in (0.25, 0.5, 1.0)
    ]
    run_pilot(jobs, {"max_epochs": 60}, "pilot6", HERE / "pilot_budget6.json")
