"""What every pilot does after its job list: run the jobs through the claim's own run_job
(worker processes of the shared runner, no cache), keep each fit's metric means, timing and
mechanism evidence, print one line per fit and write the JSON beside the script."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from counterfactual_instruments.claim import METRICS, run_job
from papers_eval.jobs import run_jobs


def run_pilot(jobs, settings: dict, label: str, out: Path, key=None, workers: int = 2) -> dict:
    """``key(result)`` names a fit in the JSON (default: subject, lr and budget)."""
    done = run_jobs(run_job, jobs, settings=settings, workers=workers, label=label)
    summary = {}
    for r in done:
        if key is None:
            name = f"{r.job.subject} lr={r.job.params['lr']} x{r.job.params.get('budget', 1.0)}"
        else:
            name = key(r)
        v = r.value
        summary[name] = {
            m: float(np.nanmean(v[m])) if np.isfinite(v[m]).any() else None
            for m in METRICS
            if m in v
        }
        summary[name].update(
            fit_s=v["fit_s"],
            swap=v.get("swap"),
            gradient_share=v.get("gradient_share"),
            moved=v.get("moved"),
        )
        rounded = {k: round(x, 4) if isinstance(x, float) else x for k, x in summary[name].items()}
        print(name, json.dumps(rounded))
    out.write_text(json.dumps(summary, indent=1))
    return summary
