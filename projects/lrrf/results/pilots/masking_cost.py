"""Pilot 2 (issue 57): cost and values of the claim's masking check and AutoAttack on one final
model (LRRF at lam_drm = lam_ctir = 1, seed 100, outside the registered and replication sets),
with the settings of configs/claim.yaml. Appends one JSON line to results/pilots/masking.jsonl.

    OMP_NUM_THREADS=1 uv run python results/pilots/masking_cost.py [SUBJECT] [SEED]
"""

import json
import sys
import time

import torch
import yaml

from lrrf.claim import CLAIM_FILE, autoattack_check, fit, masking_check

subject = sys.argv[1] if len(sys.argv) > 1 else "lrrf"
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 100
settings = dict(yaml.safe_load(CLAIM_FILE.read_text())["settings"])
torch.set_num_threads(1)
params = {"lam_drm": 1.0, "lam_ctir": 1.0} if subject == "lrrf" else {}
model = fit(subject, seed, settings, params)
start = time.perf_counter()
masking = masking_check(model, settings, seed)
masking_s = time.perf_counter() - start
auto = autoattack_check(model, settings, seed)
row = {"subject": subject, "seed": seed, "masking": masking, "masking_seconds": round(masking_s, 1),
       "autoattack": auto}  # fmt: skip
with open("results/pilots/masking.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
print(json.dumps(row))
