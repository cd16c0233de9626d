"""Pilot for issue 18 (not a protocol run): does a hand-set lag beat synchronous on the
validation digits when the main stage is longer? Seeds 10-12 (never the claim seeds)."""

import json
import sys
import time

import torch

from async_schedule.claim import Runner, schedule_flags

torch.set_num_threads(1)
steps = int(sys.argv[1])
seeds = [int(s) for s in sys.argv[2].split(",")]
extra = sys.argv[3:]  # extra flags for every run
settings = {
    "main_steps": steps,
    "probe_steps": 100,
    "num_samples": 1000,
    "sample_steps": 16,
    "hand_lag_sfd_delta": 0.7,
}
t0 = time.time()
runner = Runner(settings, quick=False)
print("setup", round(time.time() - t0), flush=True)
subjects = [
    ("synchronous", {}),
    ("sfd", {"sfd_delta": 0.7}),
    ("power", {"power_exponent": 2.0}),
    ("sfd", {"sfd_delta": 0.3}),
]
for seed in seeds:
    for name, params in subjects:
        t = time.time()
        r = runner.run(schedule_flags(name, params, settings) + extra, seed)
        row = {
            "seed": seed,
            "steps": steps,
            "subject": name,
            **params,
            "val_fd": round(r["val_fd_digit"], 2),
            "test_fd": round(r["fd_digit"], 2),
            "recall": round(r["recall"], 3),
            "prec": round(r["precision"], 3),
            "class_tv": round(r["class_tv"], 3),
            "s": round(time.time() - t),
            "extra": extra,
        }
        print(json.dumps(row), flush=True)
