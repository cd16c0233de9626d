"""Pilot of issue 49's third round on seeds outside {0-2, 13-15}: the warm start's stopping
rule and fair routing oracles.

`uv run python results/pilots/oracle_pilot.py SEED...` runs through the claim's job runner
(`claim.Experiment`, claim.yaml's settings plus the rule under test, ``WARM_UNTIL``):

1. per seed, the warm start with the stopping rule (at least 60 epochs; then every 10, stop once
   validation forced-slow accuracy on 5-8 digits reaches 0.85; cap 150), its loss curve and the
   test preconditions;
2. from it SFT, RFT, single-reference DGO at betas 0.001 / 0.005 (the old grid's edge and
   below; the better on validation reward is "tuned"), Dual-Reference DGO at 0.1 and the
   exact-partition oracle at 0.05 (the betas the record at 611117b tuned);
3. the routing oracles at matched tokens (ranked rule), threshold t on the true digit count
   chosen on validation reward from 1-6:
   - ``sft_decodes``: the registered oracle router (t-routing of SFT's forced decodes);
   - ``own_decodes``: t-routing of EACH RIVAL's own forced decodes against that rival's own
     P(fast) ranking (same decodes: only the routing differs);
   - ``dual_decodes``: t-routing of the method's forced decodes (the best member of the
     method's family), against each rival.

Gate (stated before it ran): (a) every pilot seed's warm start stops before the cap with test
slow_advantage_on_hard > 0.3; (b) a fair oracle (own_decodes or dual_decodes) clears +0.02
over every rival (SFT, RFT, tuned single-reference DGO) on the mean over pilot seeds. If (b)
fails for both forms the miniature cannot test beats_single_reference_at_matched_tokens.
Output: stdout (committed as oracle_seeds*.txt) and per-prompt arrays (json.gz).
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from dual_dgo.baselines import oracle_route
from dual_dgo.claim import Experiment, fit_job, per_prompt_arrays, subject_metrics, val_reward
from dual_dgo.evaluation import fast_rate_by_difficulty, gain_at_matched_tokens
from papers_eval.jobs import Job
from papers_eval.record import code_revision

PROJECT = Path(__file__).resolve().parents[2]
SEEDS = [int(s) for s in sys.argv[1:]] or [20, 21, 22]
assert not set(SEEDS) & {0, 1, 2, 13, 14, 15}, "pilots never use the registered seeds"
WARM_UNTIL = {"min_epochs": 60, "every": 10, "max_epochs": 150, "slow_accuracy": 0.85,
              "digits_from": 5}  # fmt: skip
SINGLE_BETAS = (0.001, 0.005)
FITS = [("sft", {}), ("rft", {}), *(("single_reference", {"beta": b}) for b in SINGLE_BETAS),
        ("dual", {"beta": 0.1}), ("exact_partition", {"beta": 0.05})]  # fmt: skip
THRESHOLDS = range(1, 7)
OUT = PROJECT / "results" / "pilots" / f"oracle_seeds{'-'.join(map(str, SEEDS))}.json.gz"


def route(result: dict, split: str, t: int) -> np.ndarray:
    k = torch.from_numpy(result[split]["difficulty"])
    return oracle_route(k, t).numpy().astype(np.float64)


def best_threshold(result: dict) -> int:
    return max(THRESHOLDS, key=lambda t: val_reward(result, route(result, "val", t)))


def by_source(arrays: dict, key: str = "p_fast") -> list[list[float]]:
    k, src = arrays["difficulty"], arrays["source"]
    return [[round(float(arrays[key][(k == j) & (src == b)].mean()), 2) for j in range(1, 9)]
            for b in (0, 1)]  # fmt: skip


def main() -> None:
    start = time.perf_counter()
    spec = yaml.safe_load((PROJECT / "configs" / "claim.yaml").read_text())
    settings = {**spec["settings"], "warm_start_until": WARM_UNTIL}
    print("warm rule:", json.dumps(WARM_UNTIL), "fits:", json.dumps(FITS))
    experiment = Experiment(settings, {"workers": 2}, code_revision(PROJECT))
    warm = experiment.warm_starts(SEEDS, "pilot")
    jobs = [fit_job(s, seed, "pilot", warm[seed], model=p) for seed in SEEDS for s, p in FITS]
    experiment.run(jobs)
    summary: dict = {"warm_until": WARM_UNTIL, "seeds": {}}
    arrays_out: dict = {}
    for seed in SEEDS:
        print(f"\n=== seed {seed} ===")
        w = experiment.value(Job("warm_start", seed, {}, stage="pilot"))
        runs = {"warm_start": w}
        for s, p in FITS:
            name = s + ("" if not p else f"@{p['beta']:g}")
            runs[name] = experiment.value(fit_job(s, seed, "pilot", warm[seed], model=p))
        singles = [f"single_reference@{b:g}" for b in SINGLE_BETAS]
        tuned = max(singles, key=lambda n: val_reward(runs[n]))
        rivals = {"single_reference": runs[tuned], "sft": runs["sft"], "rft": runs["rft"]}
        tests = {a: r["test"] for a, r in rivals.items()}
        wm = subject_metrics(w, tests)
        entry = summary["seeds"][str(seed)] = {
            "warm_epochs": w["epochs"] + 1,
            "warm_checks": w["convergence_checks"],
            "warm_loss_every_5": [round(x, 4) for x in w["loss_by_epoch"][4::5]],
            "slow_advantage_on_hard": float(wm["slow_advantage_on_hard"]),
            "fast_accuracy_drop": float(wm["fast_accuracy_drop"]),
            "single_reference_tuned": tuned,
            "val_reward": {n: val_reward(r) for n, r in runs.items()},
        }
        print(f"warm start: epochs {entry['warm_epochs']} checks {w['convergence_checks']}")
        print(f"warm loss every 5 epochs {entry['warm_loss_every_5']}")
        k = w["test"]["difficulty"]
        print("warm forced-slow acc by k",
              [round(float(w["test"]["slow_correct"][k == j].mean()), 2) for j in range(1, 9)],
              f"slow_advantage_on_hard {entry['slow_advantage_on_hard']:.3f} "
              f"fast_accuracy_drop {entry['fast_accuracy_drop']:.3f}")  # fmt: skip
        print("val rewards", {n: round(v, 4) for n, v in entry["val_reward"].items()},
              "tuned single-ref:", tuned)  # fmt: skip
        gains: dict = {}
        for name, r in runs.items():
            m = subject_metrics(r, tests)
            gains[name] = {a: float(m[f"gain_vs_{a}"].mean()) for a in tests}
            print(f"{name:24s} P(fast) a {by_source(r['test'])[0]} b {by_source(r['test'])[1]} "
                  f"acc {m['accuracy'].mean():.3f} tok {m['tokens'].mean():.2f} gains "
                  + " ".join(f"{a} {v:+.3f}" for a, v in gains[name].items()))  # fmt: skip
        forms: dict = {"sft_decodes": {}, "own_decodes": {}, "dual_decodes": {}}
        for form, decodes in (("sft_decodes", "sft"), ("dual_decodes", "dual@0.1")):
            t = best_threshold(runs[decodes])
            for a, base in tests.items():
                g = gain_at_matched_tokens(
                    runs[decodes]["test"], base, route(runs[decodes], "test", t)
                )
                forms[form][a] = {"threshold": t, "gain": float(g.mean())}
        for a, r in rivals.items():
            t = best_threshold(r)
            g = gain_at_matched_tokens(r["test"], r["test"], route(r, "test", t))
            forms["own_decodes"][a] = {"threshold": t, "gain": float(g.mean())}
        for form, per in forms.items():
            print(f"oracle {form:13s} " + " ".join(
                f"{a} t={v['threshold']} {v['gain']:+.3f}" for a, v in per.items()))  # fmt: skip
        for name in (tuned, "dual@0.1", "exact_partition@0.05"):
            print(
                f"P(fast) by k {name:22s}",
                np.round(fast_rate_by_difficulty(runs[name]["test"], 8), 3).tolist(),
            )
            print(f"fast acc by (src,k) {name:16s}", by_source(runs[name]["test"], "fast_correct"))
        entry["gains"], entry["oracles"] = gains, forms
        arrays_out[str(seed)] = {n: per_prompt_arrays(r) for n, r in runs.items()}
    seeds = summary["seeds"].values()
    warm_ok = all(v["warm_epochs"] < WARM_UNTIL["max_epochs"] and v["slow_advantage_on_hard"] > 0.3
                  for v in seeds)  # fmt: skip
    means = {form: {a: float(np.mean([v["oracles"][form][a]["gain"] for v in seeds]))
                    for a in ("single_reference", "sft", "rft")}
             for form in ("sft_decodes", "own_decodes", "dual_decodes")}  # fmt: skip
    fair = {f: all(g > 0.02 for g in means[f].values()) for f in ("own_decodes", "dual_decodes")}
    go = warm_ok and any(fair.values())
    summary["gate"] = {"warm_start_learns_slow": warm_ok, "oracle_means": means,
                       "fair_oracle_clears": fair, "go": go}  # fmt: skip
    print("\nmean oracle gains over pilot seeds:", json.dumps(means))
    print("gate (stated before the pilot ran):", json.dumps(summary["gate"]))
    with gzip.open(OUT, "wt") as f:
        json.dump({"summary": summary, "arrays": arrays_out}, f)
    print(f"wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
