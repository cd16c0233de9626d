"""Pilot fits for issue 57 (seeds outside the registered {0, 1, 2} and replication {10, 11, 12}
sets): one subject, one seed, the claim's full budget (configs/claim.yaml settings), through
claim.fit; appends one JSON line (val AA, test AA / forgetting / clean accuracy, per-task
diagnostics with the gradient shares, wall time) to the given file.

    OMP_NUM_THREADS=1 uv run python results/pilots/pilot.py OUT.jsonl TAG SUBJECT SEED k=v ...
"""

import json
import sys
import time

import numpy as np
import torch
import yaml

from lrrf.claim import CLAIM_FILE, fit, measure

out, tag, subject, seed, *pairs = sys.argv[1:]
params = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in pairs)}
settings = dict(yaml.safe_load(CLAIM_FILE.read_text())["settings"])
settings["grad_share_every"] = 10
torch.set_num_threads(1)
start = time.perf_counter()
model = fit(subject, int(seed), settings, params)
m = measure(model)
row = {
    "tag": tag, "subject": subject, "seed": int(seed), "params": params,
    "val_aa": round(m["val_aa"], 4), "aa": round(float(np.mean(m["aa"])), 4),
    "forgetting": round(float(np.mean(m["forgetting"])), 4),
    "clean_acc": round(float(np.mean(m["clean_acc"])), 4),
    "diagnostics": [{k: round(v, 4) for k, v in d.items()} for d in m["_diagnostics"]],
    "wall_s": round(time.perf_counter() - start, 1),
}  # fmt: skip
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
print(json.dumps({k: v for k, v in row.items() if k != "diagnostics"}))
