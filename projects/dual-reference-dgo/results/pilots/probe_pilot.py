"""Pilot for the difficulty-probe precondition, on non-claim seeds (10-12), after the record at
b60061b failed it on one seed. `python results/pilots/probe_pilot.py 10 11 12` trains each seed's
warm start with configs/claim.yaml's settings and prints the ridge probe's validation R^2 on
three feature sets of the warm start's last layer: the state at the prompt's last token (the
registered probe of b60061b), the mean state over the image tokens, and both concatenated.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from dual_dgo.claim import Runner, prompt_features
from dual_dgo.data import DualDgoDataModule
from dual_dgo.evaluation import ridge_probe_r2
from dual_dgo.model import DualDgoModule

settings = yaml.safe_load((Path(__file__).parents[2] / "configs" / "claim.yaml").read_text())[
    "settings"
]


def features(model, items):
    """The claim's two probe feature sets (model.prompt_end; the pilot ran an inline copy of
    the same computation before it moved there) and their concatenation."""
    found = prompt_features(model, items)
    return {**found, "both": torch.cat([found["last_token"], found["image_mean"]], 1)}


if __name__ == "__main__":
    seeds = [int(s) for s in sys.argv[1:]]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        runner = Runner(settings, Path(workdir))
        runner.prefetch([("warm", seed) for seed in seeds])
        for seed in seeds:
            model = DualDgoModule.load_from_checkpoint(
                Path(workdir) / f"warm_seed{seed}.ckpt"
            ).eval()
            data = DualDgoDataModule(
                **{k.removeprefix("data."): v for k, v in settings["data"].items()}, seed=seed
            )
            data.setup()
            train = data.splits["train"][: settings["probe_train_prompts"]]
            val = data.splits["val"]
            ftr, fva = features(model, train), features(model, val)
            ytr = np.array([i.difficulty for i in train], float)
            yva = np.array([i.difficulty for i in val], float)
            r2 = {name: ridge_probe_r2(ftr[name], ytr, fva[name], yva) for name in ftr}
            print(
                json.dumps(
                    {"seed": seed, "registered_r2": runner.warm_start(seed)["probe_r2"], **r2}
                ),
                flush=True,
            )
    print(f"wall {time.perf_counter() - start:.0f} s")
