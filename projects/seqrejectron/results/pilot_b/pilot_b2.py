import json, sys, time
import numpy as np
from seqrejectron import pointmaze as pm
# (the pilot set pm.FEATURE_KIND from $FK, a switch since removed: the committed features are its "xy")
from seqrejectron.experiment import fit, episode_metrics
sizes = dict(pm.SIZES_B)
if len(sys.argv) > 2: sizes = {k: int(sys.argv[2]) for k in sizes}
for seed in [int(x) for x in sys.argv[1].split(",")]:
    t = time.time()
    w = pm.build_pointmaze_world(seed, tuple(sizes.items()))
    row = {"seed": seed, **{k: round(v, 3) for k, v in pm.pointmaze_summary(w).items()}}
    # route of BC test failures
    row["bc_test_cost_top"] = round(float(np.mean([t.cost for t in w.eval_q if t.feats[0][1] > 0])), 3)
    row["bc_test_cost_bot"] = round(float(np.mean([t.cost for t in w.eval_q if t.feats[0][1] < 0])), 3)
    row["build_s"] = round(time.time() - t, 1)
    m = {"lam": 100.0}
    for name, params in [("oracle_stop", {}), ("seqrejectron", m), ("random_validators", {}), ("novelty", {"k": 1}), ("ensemble", {"members": 3}), ("random_time", {}), ("domain_classifier", {"hidden": 16})]:
        try:
            f = fit(w, name, 0.05, params, m)
            o = episode_metrics(f.rule, w.eval_p, w.eval_q)
            row[name] = {k: round(float(v.mean()), 3) for k, v in o.items()}
        except Exception as e:
            row[name] = repr(e)[:200]
    row["time_s"] = round(time.time() - t, 1)
    print(json.dumps(row), flush=True)
