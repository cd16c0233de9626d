"""Pilot (not the claim): does a 4x wider, 2x deeper model change ATWU against uniform weights
and the span oracle? One non-claim seed, the claim's data, budgets and learning-rate grid;
pretraining, fine-tuning and unlearning exactly as in `reproduce`, only the base model's size
differs. Run from projects/atwu:

    OMP_NUM_THREADS=1 uv run python results/pilots/model_size.py --seed 10 --hidden 256 --layers 4

Writes results/pilots/model_size_<params>.json (every metric of every run, the git revision,
hardware and wall time).
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from atwu.claim import BASE_SEED, BATCH, CLAIM_FILE, World, _quiet, quiet_trainer
from atwu.data import UnlearningDataModule
from atwu.model import UnlearningModule
from papers_eval import load_claim_spec, provenance
from papers_gpu import seed_everything

SUBJECTS = ("atwu_uniform", "annotator_oracle", "atwu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4])
    args = parser.parse_args()
    start = time.perf_counter()
    torch.set_num_threads(1)
    _quiet()
    settings = dict(load_claim_spec(CLAIM_FILE).settings)
    work = Path(tempfile.mkdtemp(prefix="atwu-pilot-"))
    try:
        base_data = UnlearningDataModule(seed=BASE_SEED, finetune_on="generic", batch_size=BATCH)
        base_data.setup()
        seed_everything(BASE_SEED)
        base = UnlearningModule(
            method="ga",
            finetune_steps=settings["pretrain_steps"],
            hidden_size=args.hidden,
            num_layers=args.layers,
            intermediate_size=2 * args.hidden,
        )
        quiet_trainer(settings["pretrain_steps"]).fit(base, base_data)
        params = sum(p.numel() for p in base.model.parameters())
        base.model.save_pretrained(work / "base")
        base_data.tokenizer.save_pretrained(work / "base")
        print(f"base: {params / 1e6:.2f} M parameters, {time.perf_counter() - start:.0f} s")
        world = World(args.seed, work / "base", work, settings, {})
        runs = {"full_model": summary(world.reference["full_model"])}
        print("full model", runs["full_model"], flush=True)
        for subject in SUBJECTS:
            for lr in args.lrs:
                seed_everything(args.seed)
                module = UnlearningModule(
                    method=subject,
                    pretrained=str(world.full_dir),
                    finetune_steps=0,
                    burnin_steps=settings["burnin_steps"],
                    lr=lr,
                )
                quiet_trainer(settings["unlearn_steps"]).fit(module, world.data)
                runs[f"{subject} lr {lr}"] = summary(world.evaluate(module.model))
                print(subject, lr, runs[f"{subject} lr {lr}"], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(__file__).with_name(f"model_size_{params / 1e6:.1f}M.json")
    record = {
        "parameters": params,
        "hidden_size": args.hidden,
        "num_layers": args.layers,
        "seed": args.seed,
        "settings": settings,
        "runs": runs,
        **provenance(out.parent, "uv run python results/pilots/model_size.py", start),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


def summary(metrics: dict) -> dict[str, float]:
    """Item means of the metrics that the claim checks or reports."""
    keys = ("forget_gap", "val_forget_gap", "utility", "value_gap", "template_gap", "forget_rouge")
    return {k: float(np.mean(metrics[k])) for k in keys}


if __name__ == "__main__":
    main()
