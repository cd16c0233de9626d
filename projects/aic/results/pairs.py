"""More (task, architecture) pairs, reported beside the claim, not judged by it (issue 52): a
separate, smaller check than `uv run reproduce` (one seed, a reduced budget, 100 test episodes),
because the registered claim already takes most of the run-time budget on 2 cores.

Per pair: the claim's pre-registered precondition (the fixed network learns the task: validation
success >= 0.8; computation pays: the one-step network's validation return < 0.95 x the fixed
network's), then AIC (threshold tuned on validation episodes by the claim's score), the fixed
network, one step and random halting at AIC's mean steps on the test episodes: return, FLOPs per
decision, FLOPs saved against the fixed network, and AIC's return over random halting.

    cd projects/aic && uv run python results/pairs.py   # -> results/pairs.json
"""

import copy
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from aic.claim import Pair, check_precondition, subject_row
from aic.tasks import get_task

HERE = Path(__file__).resolve().parent
SEED = 0
PAIRS = [  # (task, architecture, dim) beside the claim's (lava-crossing, conv, 16)
    ("lava-crossing", "transformer", 16),
    ("simple-crossing-11", "conv", 16),
]
BUDGET = {"trainer.max_epochs": 6, "data.n_train": 6000, "data.n_val": 500}
THRESHOLDS = [0.3, 0.5, 0.7]
EPISODES = 100


def bootstrap(values: np.ndarray, n: int = 2000) -> list[float]:
    rng = np.random.default_rng(0)
    means = rng.choice(values, (n, len(values))).mean(1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def run_pair(task_name: str, architecture: str, dim: int, claim: dict) -> dict:
    settings = copy.deepcopy(claim["settings"])
    settings["budget"].update(BUDGET)
    settings["budget"].update({"model.architecture": architecture, "model.dim": dim})
    settings["episodes"] = EPISODES
    start = time.perf_counter()
    task = get_task(task_name)
    pair = Pair.train(task, SEED, settings)
    precondition = check_precondition({SEED: pair}, settings)
    scores = {t: pair.score(pair.run("val", "aic", t)) for t in THRESHOLDS}
    chosen = {"aic": max(scores, key=scores.get), "fixed_k": None, "one_step": None}
    rows = {
        s: subject_row(pair, s, chosen, {})
        for s in ("aic", "fixed_k", "one_step", "random_halting")
    }
    fixed_return = float(rows["fixed_k"]["episode_return"].mean())
    fixed_flops = float(rows["fixed_k"]["flops_per_decision"].mean())
    out = {
        "task": task.env_id,
        "architecture": architecture,
        "dim": dim,
        "precondition": precondition,
        "aic_threshold": chosen["aic"],
        "val_scores": scores,
        "halting_head": pair.head_quality(),
        "train_seconds": pair.train_seconds,
    }
    for s, row in rows.items():
        out[s] = {
            "episode_return": float(row["episode_return"].mean()),
            "return_ci": bootstrap(row["episode_return"]),
            "flops_per_decision": float(row["flops_per_decision"].mean()),
            "mean_steps": float(row["mean_steps"].mean()),
            "return_over_random": float(np.mean(row["return_over_random"])),
            "return_over_random_ci": bootstrap(np.asarray(row["return_over_random"])),
        }
    aic = out["aic"]
    out["aic_return_ratio"] = aic["episode_return"] / max(fixed_return, 1e-12)
    out["aic_flops_saved"] = 1 - aic["flops_per_decision"] / fixed_flops
    out["wall_s"] = round(time.perf_counter() - start, 1)
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    claim = yaml.safe_load((HERE.parent / "configs" / "claim.yaml").read_text())
    start = time.perf_counter()
    results = []
    for task_name, architecture, dim in PAIRS:
        results.append(run_pair(task_name, architecture, dim, claim))
        r = results[-1]
        print(
            f"{r['task']} {architecture}: precondition {r['precondition']['met']} "
            f"({r['precondition']['text']}); AIC {r['aic']['episode_return']:.3f} vs fixed "
            f"{r['fixed_k']['episode_return']:.3f}, FLOPs saved {r['aic_flops_saved']:.2f}, "
            f"over random {r['aic']['return_over_random']:+.3f}; {r['wall_s']} s",
            flush=True,
        )
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    record = {
        "command": "uv run python results/pairs.py",
        "git_revision": revision,
        "seed": SEED,
        "budget": BUDGET,
        "episodes": EPISODES,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "torch_threads": 1,
        "pairs": results,
    }
    (HERE / "pairs.json").write_text(json.dumps(record, indent=2) + "\n")
