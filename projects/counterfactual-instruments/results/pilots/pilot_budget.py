"""Pilot (seeds outside the registered and replication sets): every subject at the registered
budget and at 2x on seed 30, lr 0.003, to see that the mechanism acts and training converged
before the claim is judged. Writes results/pilots/pilot_budget.json.

    uv run python results/pilots/pilot_budget.py [--jobs 2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from counterfactual_instruments.claim import METRICS, SUBJECTS, run_job
from papers_eval.jobs import Job, run_jobs

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    spec = yaml.safe_load((HERE.parents[1] / "configs" / "claim.yaml").read_text())
    settings = dict(spec["settings"])
    seed = 30
    jobs = [Job(s, seed, {"lr": 0.003}, stage="pilot") for s in SUBJECTS]
    jobs += [
        Job(s, seed, {"lr": 0.003, "budget": 2.0}, stage="pilot")
        for s in ("dual_counterfactual", "translation", "oracle", "autoencoder")
    ]
    workers = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
    done = run_jobs(run_job, jobs, settings=settings, workers=workers, label="pilot")
    out = {}
    for r in done:
        key = f"{r.job.subject} x{r.job.params.get('budget', 1.0)}"
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
    (HERE / "pilot_budget.json").write_text(json.dumps(out, indent=1))
