"""Fifth pilot (seed 34, outside the registered and replication sets), after the fourth: with
star neighbours the counterfactual views and the z_s probes must read the star beside the
partner, as the method was trained, not the partner galaxy. The method and translation at the
registered 60 epochs. Writes results/pilots/pilot_budget5.json.

    uv run python results/pilots/pilot_budget5.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 34
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.003}, stage="pilot"),
        Job("translation", seed, {"lr": 0.003}, stage="pilot"),
    ]
    run_pilot(jobs, {"max_epochs": 60}, "pilot5", HERE / "pilot_budget5.json")
