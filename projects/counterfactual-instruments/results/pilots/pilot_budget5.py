"""Fifth pilot (seed 34, outside the registered and replication sets), after the fourth: with
star neighbours the counterfactual views and the z_s probes must read the star beside the
partner, as the method was trained, not the partner galaxy. The method and translation at the
registered 60 epochs. Writes results/pilots/pilot_budget5.json.

    uv run python results/pilots/pilot_budget5.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from counterfactual_instruments.claim import METRICS, run_job
from papers_eval.jobs import Job, run_jobs

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    seed = 34
    jobs = [
        Job("dual_counterfactual", seed, {"lr": 0.003}, stage="pilot"),
        Job("translation", seed, {"lr": 0.003}, stage="pilot"),
    ]
    done = run_jobs(run_job, jobs, settings={"max_epochs": 60}, workers=2, label="pilot5")
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
    (HERE / "pilot_budget5.json").write_text(json.dumps(out, indent=1))
