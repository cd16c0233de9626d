"""Pilot of (B)'s third design (results/pilot_b/redesign_seeds20_25.log): per seed, the world at
the claim's sizes, pointmaze_summary, BC's test cost by start route, and a few subjects at eps
0.05. Usage: python pilot_b2.py SEEDS [EPISODES_PER_SPLIT]. (The run that wrote the log also set
a feature switch, since removed; the committed features are the variant it ran.)"""

import json
import sys
import time

import numpy as np

from seqrejectron import pointmaze as pm
from seqrejectron.experiment import episode_metrics, fit

SUBJECTS = [
    ("oracle_stop", {}),
    ("seqrejectron", {"lam": 100.0}),
    ("random_validators", {}),
    ("novelty", {"k": 1}),
    ("ensemble", {"members": 3}),
    ("random_time", {}),
    ("domain_classifier", {"hidden": 16}),
]


def route_cost(trajs, top: bool) -> float:
    return round(float(np.mean([t.cost for t in trajs if (t.feats[0][1] > 0) == top])), 3)


sizes = dict(pm.SIZES_B)
if len(sys.argv) > 2:
    sizes = {k: int(sys.argv[2]) for k in sizes}
for seed in [int(x) for x in sys.argv[1].split(",")]:
    start = time.time()
    w = pm.build_pointmaze_world(seed, tuple(sizes.items()))
    row = {"seed": seed, **{k: round(v, 3) for k, v in pm.pointmaze_summary(w).items()}}
    row["bc_test_cost_top"] = route_cost(w.eval_q, True)
    row["bc_test_cost_bot"] = route_cost(w.eval_q, False)
    row["build_s"] = round(time.time() - start, 1)
    method = {"lam": 100.0}
    for name, params in SUBJECTS:
        fitted = fit(w, name, 0.05, params, method)
        outcome = episode_metrics(fitted.rule, w.eval_p, w.eval_q)
        row[name] = {k: round(float(v.mean()), 3) for k, v in outcome.items()}
    row["time_s"] = round(time.time() - start, 1)
    print(json.dumps(row), flush=True)
