"""Probe-only diagnostic (not a protocol run): does f move in a longer probe, and which way do
the lead / lag parts of its gradient point? Seed 10, validation only."""

import json
import sys
import time

import torch

import async_schedule.claim as claim
from async_schedule.data import MultiRepDataModule
from async_schedule.model import AsyncDiffusionModule
from papers_cli import quiet_fit

torch.set_num_threads(1)
probe = int(sys.argv[1])
flags = sys.argv[2:]
t = time.time()
cli = quiet_fit(
    AsyncDiffusionModule,
    MultiRepDataModule,
    project_file=claim.__file__,
    seed=10,
    overrides=[
        "--trainer.accelerator=cpu",
        f"--trainer.max_steps={probe + 1}",
        "--model.schedule=learned",
        f"--model.probe_steps={probe}",
        "--model.probe_diagnostics=true",
        *flags,
    ],
)
r = dict(cli.model.probe_report)
g = r.pop("gradients")
print(
    json.dumps(
        {
            "flags": flags,
            "probe": probe,
            "s": round(time.time() - t),
            **r,
            **{
                k: (round(v["more_lag_derivative_mean"], 5), round(v["more_lag_derivative_std"], 5))
                for k, v in g.items()
            },
        }
    ),
    flush=True,
)
c = torch.stack(cli.model.probe_curves)
print("f(0.5) every 25 steps:", [round(float(x), 4) for x in c[::25, 50]])
