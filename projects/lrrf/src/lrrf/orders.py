"""A second attack order (forgetting depends on the order), outside the pre-registered claim:
LRRF, ER and sequential AT on the sequence of configs/order_l1_first.yaml (sparse L1 first,
PGD-Linf last), each at the setting the claim's tuning chose (read from results/claim.json), on
the claim's seeds, through the same ``claim.run_all`` as ``reproduce`` (the shared job runner:
``--jobs`` worker processes, its cache under runs/lrrf/jobs, ``--fresh``). Writes
``second_order.json`` (R matrices, AA / forgetting / BWT / clean accuracy per seed, paired
intervals of LRRF minus each other subject) to ``--out``.

    uv run python -m lrrf.orders            # 9 runs, about 6 min on one core
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

from lrrf.claim import CLAIM_FILE, PROJECT, run_all
from papers_eval import contrast_interval
from papers_eval.jobs import runner_options
from papers_eval.record import provenance

ORDER_FILE = PROJECT / "configs" / "order_l1_first.yaml"
SUBJECTS = ("lrrf", "er", "seq_at")
METRICS = ("aa", "forgetting", "bwt", "clean_acc")


def from_lam_scale(params: dict) -> dict:
    """A record of the specification before issue 57 tuned LRRF's three weights together
    (``lam_scale`` x 1.0 each); the same weights, spelled as the model's parameters."""
    if "lam_scale" not in params:
        return params
    scale = params["lam_scale"]
    rest = {k: v for k, v in params.items() if k != "lam_scale"}
    return {**rest, "lam_drm": scale, "lam_ctir": scale, "lam_kco": scale}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROJECT / "results")
    parser.add_argument("--quick", action="store_true", help="claim.yaml's quick settings")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--fresh", action="store_true", help="ignore the cache of finished runs")
    args = parser.parse_args(argv)
    claim = yaml.safe_load(CLAIM_FILE.read_text())
    settings = dict(claim["settings"])
    seeds = claim["seeds"]
    if args.quick:
        settings.update(claim["quick"]["settings"])
        seeds = claim["quick"]["seeds"]
    tuned = json.loads((PROJECT / "results" / "claim.json").read_text())["tuning"]["best"]
    tuned = {s: from_lam_scale(p) for s, p in tuned.items()}
    tasks = yaml.safe_load(ORDER_FILE.read_text())["model"]["tasks"]
    order = f"[{','.join(tasks)}]"
    jobs = [
        (s, tuple(sorted({**tuned[s], "tasks": order}.items())), seed)
        for s in SUBJECTS
        for seed in seeds
    ]
    start = time.perf_counter()
    done = run_all(jobs, settings, runner_options(args, default_workers=1), stage="order")
    runs = {job: result.value for job, result in zip(jobs, done, strict=True)}
    measured = {
        s: [runs[(s, params, seed)] for s_, params, seed in jobs if s_ == s] for s in SUBJECTS
    }
    record = {
        "experiment": "second attack order (not pre-registered)",
        "tasks": tasks,
        "tasks_trained": {s: [r["_tasks"] for r in measured[s]] for s in SUBJECTS},
        "seeds": seeds,
        "settings": settings,
        "tuned_params": {s: tuned[s] for s in SUBJECTS},
        "metrics": {
            s: {
                m: {
                    "mean": float(np.mean([r[m].mean() for r in measured[s]])),
                    "per_seed": [float(r[m].mean()) for r in measured[s]],
                }
                for m in METRICS
            }
            for s in SUBJECTS
        },
        "lrrf_minus": {
            other: {
                m: contrast_interval(
                    [
                        (1.0, [r[m] for r in measured["lrrf"]]),
                        (-1.0, [r[m] for r in measured[other]]),
                    ]
                ).as_dict()
                for m in ("aa", "forgetting")
            }
            for other in SUBJECTS[1:]
        },
        "r_matrices_mean_over_seeds": {
            s: np.round(np.mean([r["_r"] for r in measured[s]], axis=0), 4).tolist()
            for s in SUBJECTS
        },
        "r_layout": "rows: after task i; columns: clean, then the attacks in the order above",
        "square_black_box_vs_pgd_linf": {
            s: {
                k: float(np.mean([r["_square"][k] for r in measured[s]]))
                for k in ("square", "pgd_linf")
            }
            for s in ("lrrf", "seq_at")
        },
        **provenance(args.out, "python -m lrrf.orders", start, argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "second_order.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
