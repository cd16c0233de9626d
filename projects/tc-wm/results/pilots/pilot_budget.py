"""Pilot before the registered run (seed 20, outside the registered and replication seeds):
does training converge (a budget curve over epochs), does the oracle reach goals at the planning
budget, do TC-WM's loss terms all act (each term's share of the gradient on the projection W)?

Run: `uv run python results/pilots/pilot_budget.py` (writes pilot_budget.json beside it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from papers_eval.jobs import Job
from tcwm.claim import fit, run_job

SEED = 20
SETTINGS = {"max_epochs": 10, "n_episodes": 400, "episode_length": 40, "plan_pairs": 20}
OUT = Path(__file__).with_suffix(".json")


def gradient_shares(seed: int) -> dict[str, float]:
    """Norm of each term's gradient on W at the end of training, as a share of their sum."""
    cli = fit(seed, SETTINGS, {"lr": 0.001}, 1.0)
    module, data = cli.model, cli.datamodule
    batch = next(iter(data.train_dataloader()))
    terms = module.losses(batch)
    norms = {}
    for name, value in terms.items():
        grad = torch.autograd.grad(value, module.projection.weight, retain_graph=True)[0]
        norms[name] = float(grad.norm())
    total = sum(norms.values())
    return {name: value / total for name, value in norms.items()}


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for subject, epochs, kappa in [
        ("tcwm", 5, 1.0),
        ("tcwm", 10, 1.0),
        ("tcwm", 20, 1.0),
        ("dino_wm", 10, 1.0),
        ("dino_wm", 20, 1.0),
        ("state_oracle", 10, 1.0),
    ]:
        start = time.perf_counter()
        settings = {**SETTINGS, "max_epochs": epochs}
        value = run_job(Job(subject, SEED, {"lr": 0.001, "kappa": kappa}), settings)
        row = {
            "subject": subject,
            "epochs": epochs,
            "kappa": kappa,
            "success": float(value["success"].mean()),
            "final_distance": float(value["final_distance"].mean()),
            "probe_r2": value["probe_r2"],
            "aligned_r2": value["aligned_r2"],
            "canonical_correlation": value["canonical_correlation"],
            "nuisance_r2": value["nuisance_r2"],
            "distance_share": value["distance_share"],
            "train_loss": value["train_loss"],
            "val_loss": value["val_loss"],
            "wall_s": time.perf_counter() - start,
        }
        if subject == "tcwm":
            row["persistence_success"] = float(value["persistence"]["success"].mean())
        rows.append(row)
        print(json.dumps(row), flush=True)
    shares = gradient_shares(SEED)
    print(json.dumps({"gradient_share_on_W": shares}), flush=True)
    OUT.write_text(
        json.dumps(
            {"seed": SEED, "settings": SETTINGS, "rows": rows, "gradient_share_on_W": shares},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
