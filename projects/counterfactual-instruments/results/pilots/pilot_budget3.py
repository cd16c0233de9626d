"""Third pilot (seed 32, outside the registered and replication sets), after the second showed
the method still improving from 40 to 80 epochs: wider seeing ranges (realistic for DECam and
HSC), a cosine learning-rate decay, 60 epochs and 2x. Writes results/pilots/pilot_budget3.json.

    uv run python results/pilots/pilot_budget3.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from counterfactual_instruments.claim import METRICS, run_job
from papers_eval.jobs import Job, run_jobs

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
    done = run_jobs(run_job, jobs, settings={"max_epochs": 60}, workers=2, label="pilot3")
    out = {}
    for r in done:
        key = f"{r.job.subject} lr={r.job.params['lr']} x{r.job.params.get('budget', 1.0)}"
        v = r.value
        out[key] = {
            m: float(np.nanmean(v[m])) if np.isfinite(v[m]).any() else None for m in METRICS
        }
        out[key].update(
            fit_s=v["fit_s"],
            swap=v.get("swap"),
            gradient_share=v.get("gradient_share"),
            moved=v.get("moved"),
        )
        print(
            key,
            json.dumps(
                {k: round(x, 4) if isinstance(x, float) else x for k, x in out[key].items()}
            ),
        )
    (HERE / "pilot_budget3.json").write_text(json.dumps(out, indent=1))
