"""Pilot for issue 57's second round (seeds 100-104, disjoint from the registered and the
replication seeds): candidate positive controls and EWC's stability. Output: oracle.jsonl.

    cd projects/lrrf && [CLIP=5] python results/pilots/oracle_pilot.py SEED RUN [RUN ...]

One line per run: AA, forgetting, clean accuracy, validation AA, ``diag`` (the mean of R's
diagonal: AA of the network that answers each attack with its snapshot after that attack's task,
the task oracle) and ``colmax`` (the best entry of each attack's column). ``CLIP`` adds
``--trainer.gradient_clip_val`` to every fit (the record's "clip": null = none). Written before
default.yaml clipped every fit at 5; with that default, unset CLIP no longer means unclipped.
"""

import json
import os
import sys
import time

import numpy as np
import torch

from lrrf import claim

CLIP = os.environ.get("CLIP")
SETTINGS = {"epochs_per_task": 3, "compute_factor": 2, "grad_share_every": 0}
RUNS = {  # name: (subject, params, settings overrides); params as the earlier record chose
    "seq_at": ("seq_at", {"lr": 0.025, "weight_decay": 5e-4}, {}),
    "joint1": ("joint_at", {"lr": 0.025, "weight_decay": 5e-3}, {}),
    "joint4": ("joint_at", {"lr": 0.025, "weight_decay": 5e-3}, {"epochs_per_task": 12}),
    "ewc100_05": ("ewc", {"reg_weight": 100.0, "lr": 0.05}, {}),
    "ewc300_05": ("ewc", {"reg_weight": 300.0, "lr": 0.05}, {}),
    "ewc300_10": ("ewc", {"reg_weight": 300.0, "lr": 0.1}, {}),
    "lrrf": ("lrrf", {"lam_drm": 0.1, "lam_ctir": 10.0}, {}),
    "er": ("er", {"lr": 0.025, "weight_decay": 5e-5}, {}),
}


def summary(measured: dict) -> dict:
    r = measured["_r"]
    t = r.shape[0]
    return {
        "aa": float(measured["aa"].mean()),
        "forg": float(measured["forgetting"].mean()),
        "clean": float(measured["clean_acc"].mean()),
        "val_aa": measured["val_aa"],
        "diag": float(np.mean([r[i, 1 + i] for i in range(t)])),
        "colmax": float(np.mean(r[:, 1:].max(0))),
    }


def main() -> None:
    torch.set_num_threads(1)
    seed, names = int(sys.argv[1]), sys.argv[2:]
    if CLIP:
        unclipped = claim.quiet_fit

        def clipped(*args, overrides=(), **kwargs):
            extra = [f"--trainer.gradient_clip_val={CLIP}"]
            return unclipped(*args, overrides=[*overrides, *extra], **kwargs)

        claim.quiet_fit = clipped
    for name in names:
        subject, params, extra = RUNS[name]
        start = time.time()
        measured = claim.measure(claim.fit(subject, seed, {**SETTINGS, **extra}, params))
        line = {"seed": seed, "run": name, "clip": CLIP, **summary(measured)}
        print(json.dumps({**line, "s": round(time.time() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
