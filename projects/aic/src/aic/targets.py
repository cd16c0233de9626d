"""The halting-target ablation (issue 16): AIC trained on the claim's pair, budget and seeds with
three value-of-computation targets, each evaluated on the claim's test episodes:

- ``one_step``: the per-step gain of the critic's values (the abstract's target, the claim's);
- ``cumulative``: the gain of every remaining step (``voc_horizon: cumulative``);
- ``exact_value``: the per-step gain under the exact Q* instead of the critic
  (``voc_source: oracle``; available on grids only).

For each price: episode return, steps per decision, FLOPs per decision and the return over random
halting at the same measured mean steps (the claim's ``return_over_random``), with two-stage
bootstrap intervals (seeds, then episodes), and each target's return minus the one-step
target's, paired over the same episodes. Reported, not judged.

    uv run python -m aic.targets            # 3 seeds x 3 targets, about 5 min on one core
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import yaml

from aic.claim import CLAIM_FILE, Pair
from aic.tasks import get_task
from papers_cli import project_dir_of
from papers_eval.record import provenance
from papers_eval.stats import contrast_interval

TARGETS = {
    "one_step": {"model.voc_horizon": "one_step", "model.voc_source": "critic"},
    "cumulative": {"model.voc_horizon": "cumulative", "model.voc_source": "critic"},
    "exact_value": {"model.voc_horizon": "one_step", "model.voc_source": "oracle"},
}
METRICS = ("episode_return", "return_over_random", "mean_steps", "flops_per_decision")


def measure(pair: Pair, price: float) -> dict:
    row = pair.run("test", "aic", price)
    return {
        "episode_return": row["episode_return"],
        "return_over_random": pair.return_over_random(row),
        "mean_steps": row["mean_steps"],
        "flops_per_decision": row["flops_per_decision"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prices", type=float, nargs="+", default=[0.001, 0.003, 0.01])
    parser.add_argument("--quick", action="store_true", help="the claim's quick settings")
    parser.add_argument("--out", type=Path, default=project_dir_of(__file__) / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    spec = yaml.safe_load(CLAIM_FILE.read_text())
    settings = copy.deepcopy(spec["settings"])
    if args.quick:
        settings["budget"].update(spec["quick"]["settings"]["budget"])
        settings["episodes"] = spec["quick"]["settings"]["episodes"]
        settings["n_fit_states"] = spec["quick"]["settings"]["n_fit_states"]
    task = get_task(settings["task"], settings.get("env_id"))
    measured: dict[str, dict[float, list[dict]]] = {
        t: {p: [] for p in args.prices} for t in TARGETS
    }
    for target, overrides in TARGETS.items():
        for seed in args.seeds:
            variant = copy.deepcopy(settings)
            variant["budget"].update(overrides)
            pair = Pair.train(task, seed, variant, with_fixed=False)
            for price in args.prices:
                measured[target][price].append(measure(pair, price))
            print(f"[targets] {target} seed {seed}: trained in {pair.train_s:.0f} s", flush=True)
    rows = {}
    for target in TARGETS:
        for price in args.prices:
            runs = measured[target][price]
            entry = {m: contrast_interval([(1.0, [r[m] for r in runs])]).as_dict() for m in METRICS}
            if target != "one_step":
                base = [r["episode_return"] for r in measured["one_step"][price]]
                entry["return_minus_one_step"] = contrast_interval(
                    [(1.0, [r["episode_return"] for r in runs]), (-1.0, base)]
                ).as_dict()
            rows[f"{target}@{price}"] = entry
    record = {
        "experiment": "halting-target ablation (one-step vs cumulative vs exact-value VoC)",
        "targets": TARGETS,
        "seeds": args.seeds,
        "prices": args.prices,
        "quick": args.quick,
        "settings": settings,
        "results": rows,
        **provenance(args.out, "python -m aic.targets", start, argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "target_ablation.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
