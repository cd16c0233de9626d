"""Pilot for the PLDM-style baseline before it joins the registered claim (seed 20, outside the
registered and replication seeds): does it converge (10 vs 20 epochs), does it plan, does it
keep a spread latent (no collapse), and does each of its loss terms act (the term's share of the
gradient on the encoder's first layer)?

Run: `uv run python results/pilots/pilot_pldm.py KAPPA` (appends rows to pilot_pldm.jsonl);
`... KAPPA COV` runs the 20-epoch row only, with VICReg's covariance weight COV (0.04 is VICReg's
1/25 ratio to its invariance term; the default 1.0 made the covariance term the largest gradient).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from papers_eval.jobs import Job
from tcwm.claim import fit, run_job
from tcwm.evaluate import latent_spread

SEED = 20
SETTINGS = {"max_epochs": 20, "n_episodes": 400, "episode_length": 40, "plan_pairs": 20}
OUT = Path(__file__).with_suffix(".jsonl")


def gradient_shares(kappa: float, lr: float) -> dict[str, float]:
    """Norm of each term's gradient on the encoder's first layer after training, as a share."""
    cli = fit(SEED, SETTINGS, {"representation": "pldm", "lr": lr}, kappa)
    module, data = cli.model, cli.datamodule
    batch = next(iter(data.train_dataloader()))
    weight = module.observation_encoder.net[0].weight
    norms = {
        name: float(torch.autograd.grad(value, weight, retain_graph=True)[0].norm())
        for name, value in module.losses(batch).items()
    }
    total = sum(norms.values())
    spread = latent_spread(module, data.arrays, data.episodes["test"])
    return {"shares": {k: v / total for k, v in norms.items()}, "latent_spread": spread}


def main() -> None:
    torch.set_num_threads(1)
    kappa = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    covariance = {"covariance_weight": float(sys.argv[2])} if len(sys.argv) > 2 else {}
    for epochs in (20,) if covariance else (10, 20):
        start = time.perf_counter()
        settings = {**SETTINGS, "max_epochs": epochs}
        value = run_job(Job("pldm", SEED, {"lr": 0.001, "kappa": kappa, **covariance}), settings)
        row = {
            "subject": "pldm",
            "epochs": epochs,
            "kappa": kappa,
            **covariance,
            "success": float(value["success"].mean()),
            "final_distance": float(value["final_distance"].mean()),
            "probe_r2": value["probe_r2"],
            "aligned_r2": value["aligned_r2"],
            "nuisance_r2": value["nuisance_r2"],
            "train_loss": value["train_loss"],
            "val_loss": value["val_loss"],
            "wall_s": time.perf_counter() - start,
        }
        print(json.dumps(row), flush=True)
        with OUT.open("a") as f:
            f.write(json.dumps(row) + "\n")
    if covariance:
        return
    row = {"subject": "pldm", "kappa": kappa, "epochs": 20, **gradient_shares(kappa, 0.001)}
    print(json.dumps(row), flush=True)
    with OUT.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
