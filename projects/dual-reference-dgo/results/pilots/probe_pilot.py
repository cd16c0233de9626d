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

from dual_dgo.claim import Runner
from dual_dgo.data import DualDgoDataModule
from dual_dgo.evaluation import ridge_probe_r2
from dual_dgo.model import DualDgoModule
from dual_dgo.vlm import _vision_batch

settings = yaml.safe_load((Path(__file__).parents[2] / "configs" / "claim.yaml").read_text())[
    "settings"
]


@torch.no_grad()
def features(model, items):
    last, image = [], []
    for s in range(0, len(items), 64):
        prompts = [i.prompt for i in items[s : s + 64]]
        width = max(len(p.input_ids) for p in prompts)
        ids = torch.full((len(prompts), width), model.encoder.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p.input_ids) :] = p.input_ids
            mask[row, width - len(p.input_ids) :] = 1
        batch = {
            "input_ids": ids,
            "attention_mask": mask,
            **_vision_batch(prompts, ids, model.image_token_id),
        }
        hidden = model.vlm(**batch, output_hidden_states=True).hidden_states[-1]
        is_image = (ids == model.image_token_id).unsqueeze(-1).float()
        last.append(hidden[:, -1])
        image.append((hidden * is_image).sum(1) / is_image.sum(1))
    last, image = torch.cat(last), torch.cat(image)
    return {"last_token": last, "image_mean": image, "both": torch.cat([last, image], 1)}


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
