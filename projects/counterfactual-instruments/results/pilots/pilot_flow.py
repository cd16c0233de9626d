"""The decoder ablation (seed 36, outside the registered and replication sets; not registered:
one seed, a shorter budget): the method with the deterministic FiLM decoder against the same
method with the flow-matching decoder (configs/flow.yaml's sizes), both 10 epochs, the
deterministic one also at the claim's 30. The flow decoder costs about 20x per step on one CPU
core, which is why the registered claim leaves it out; its views are the mean of 4 Euler draws
of 16 steps. 200 test galaxies (the flow's sampling dominates evaluation). Writes
results/pilots/pilot_flow.json.

    uv run python results/pilots/pilot_flow.py
"""

from __future__ import annotations

from pathlib import Path

from common import run_pilot

from papers_eval.jobs import Job

HERE = Path(__file__).resolve().parent
FLOW = {"decoder": "flow", "flow_channels": [16, 32], "flow_steps": 16, "flow_samples": 4}


def name(result) -> str:
    params = result.job.params
    epochs = round(10 * params.get("budget", 1.0))
    return f"{params.get('decoder', 'deterministic')} lr={params['lr']} epochs={epochs}"


if __name__ == "__main__":
    seed = 36
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.001, **FLOW}, stage="pilot"),
        Job("dual_counterfactual", seed, {"lr": 0.01}, stage="pilot"),
        Job("dual_counterfactual", seed, {"lr": 0.01, "budget": 3.0}, stage="pilot"),
    ]
    settings = {"max_epochs": 10, "data": {"n_test": 200}}
    run_pilot(jobs, settings, "pilot-flow", HERE / "pilot_flow.json", key=name)
