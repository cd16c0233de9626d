"""Pilot on a non-claim seed (validation only), before the claim's settings were registered.

`python results/pilots/pilot.py SEED BETA` trains the warm start and every objective from it
with configs/claim.yaml's budgets and prints validation summaries and the oracle router's.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from dual_dgo.baselines import oracle_route
from dual_dgo.claim import TRAINED, Runner
from dual_dgo.evaluation import fast_rate_by_difficulty, gain_at_matched_tokens
from dual_dgo.model import summary_metrics

seed, beta = int(sys.argv[1]), float(sys.argv[2])
settings = yaml.safe_load((Path(__file__).parents[2] / "configs" / "claim.yaml").read_text())[
    "settings"
]
start = time.perf_counter()
with tempfile.TemporaryDirectory() as workdir:
    runner = Runner(settings, Path(workdir))
    betas = (
        "dual",
        "single_reference",
        "fixed_prior",
        "exact_partition",
        "always_fast",
        "always_slow",
    )
    jobs = [("train", s, {"beta": beta} if s in betas else {}, seed, {}) for s in TRAINED]
    jobs += [
        ("train", s, {"beta": beta}, seed, settings["swapped_counts"])
        for s in ("dual", "single_reference")
    ]
    runner.prefetch(jobs)
    warm = runner.warm_start(seed)
    out = {"seed": seed, "beta": beta, "split": "val"}
    out["warm_start"] = summary_metrics(warm["val"], warm["length_cost"], warm["max_length"])
    out["warm_start"]["probe_r2"] = warm["probe_r2"]
    out["warm_start"]["fast_acc_by_k"] = [
        float(warm["val"]["fast_correct"][warm["val"]["difficulty"] == k].mean())
        for k in range(1, 9)
    ]
    out["warm_start"]["slow_acc_by_k"] = [
        float(warm["val"]["slow_correct"][warm["val"]["difficulty"] == k].mean())
        for k in range(1, 9)
    ]
    vals = {}
    for subject in TRAINED:
        params = (
            {"beta": beta}
            if subject
            in (
                "dual",
                "single_reference",
                "fixed_prior",
                "exact_partition",
                "always_fast",
                "always_slow",
            )
            else {}
        )
        result = runner.trained(subject, params, seed)
        vals[subject] = result["val"]
        out[subject] = summary_metrics(result["val"], result["length_cost"], result["max_length"])
        out[subject]["fast_rate_by_k"] = fast_rate_by_difficulty(result["val"], 8)
        print(
            subject,
            json.dumps(out[subject], default=float),
            f"{time.perf_counter() - start:.0f}s",
            flush=True,
        )
    for threshold in (2, 3, 4):
        route = (
            oracle_route(torch.from_numpy(vals["sft"]["difficulty"]), threshold)
            .numpy()
            .astype(float)
        )
        out[f"oracle_{threshold}"] = {
            name: float(gain_at_matched_tokens(vals["sft"], vals[name], route).mean())
            for name in ("single_reference", "sft", "rft")
        }
    for subject in TRAINED:
        out[subject]["gains"] = {
            name: float(gain_at_matched_tokens(vals[subject], vals[name]).mean())
            for name in ("single_reference", "sft", "rft")
        }
    swapped = runner.trained("dual", {"beta": beta}, seed, settings["swapped_counts"])
    out["dual_swapped_fast_rate"] = float(swapped["val"]["p_fast"].mean())
    swapped = runner.trained("single_reference", {"beta": beta}, seed, settings["swapped_counts"])
    out["single_swapped_fast_rate"] = float(swapped["val"]["p_fast"].mean())
    out["wall_s"] = time.perf_counter() - start
print(json.dumps(out, indent=1, default=float))
