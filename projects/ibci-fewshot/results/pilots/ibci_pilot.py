"""Pilot for issue 56 (seed 7, outside the registered 0-2 and replication 10-12 sets): one pooled
backbone fit through the real CLI with the given flags, its stage-2 trace every 25 steps, then
the validation and test WER of the unadapted start, meta adaptation at several step-size scales,
plain-gradient alignment and the many-sentence fine-tune at several learning rates (the pilots
in seed7.json; p1 ran a draft with fewer grid values, p6 the last version).

    python results/pilots/ibci_pilot.py SEED META_STEPS [CLI flags...]
"""

import json
import sys
import time

import torch
from lightning.pytorch.callbacks import Callback

from ibci_fewshot import claim
from ibci_fewshot.cli import IbciCLI
from ibci_fewshot.data import IbciDataModule
from ibci_fewshot.metrics import per_item_rates
from ibci_fewshot.model import IbciModule
from papers_cli import quiet_fit


class Trace(Callback):
    """The stage-2 logged values every 25 steps."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % 25 == 0 or step == trainer.max_steps:
            logged = trainer.callback_metrics.items()
            self.rows.append({"step": step} | {k: float(v) for k, v in logged if "train/" in k})
            print(json.dumps(self.rows[-1]), flush=True)


def main() -> None:
    torch.set_num_threads(1)
    seed, meta_steps, flags = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    settings = {"adapt_steps": 30, "many_steps": 30, "n_extra": 30, "calibration_sweep": [30]}
    began = time.time()
    cli = quiet_fit(
        IbciModule,
        IbciDataModule,
        project_file=claim.__file__,
        seed=seed,
        overrides=[
            "--model.backbone=pooled",
            "--model.stage1_steps=250",
            f"--trainer.max_steps={250 + meta_steps}",
            "--trainer.max_epochs=-1",
            *flags,
        ],
        cli_class=IbciCLI,
        callbacks=[Trace()],
    )
    print("fit_s", time.time() - began, flush=True)
    module, data = cli.model.eval(), cli.datamodule
    models = {"pooled": module, "pooled_meta": module, "session_layers": None}
    grids = (
        ("zero_shot", [{}]),
        ("meta_alignment", [{"lr_scale": s} for s in (0.3, 1, 3, 10)]),
        ("gradient_alignment", [{"lr": lr} for lr in (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)]),
        ("many_sentence_finetune", [{"lr": lr} for lr in (3e-5, 1e-4, 3e-4, 1e-3)]),
    )
    out = {}
    for split, sessions in (("val", data.val_sessions), ("test", data.test_sessions)):
        difference = claim.start_against_identity(module, sessions)
        out[f"{split}_start_minus_identity"] = float(difference.mean())
        for subject, grid in grids:
            for params in grid:
                scored = claim.score_sessions(subject, models, sessions, 3, params, settings)
                rates = per_item_rates([(g, r) for g, _, r, _, _ in scored])[1]
                out[f"{split} {subject} {params}"] = round(float(rates.mean()), 4)
                if subject == "meta_alignment" and params["lr_scale"] == 1:
                    out[f"{split} meta diag"] = claim._mean_dicts([d for *_, d, _ in scored])
    out["step_sizes"] = {
        k: [float(v.detach().exp().mean()), float(v.detach().exp().min()), float(v.exp().max())]
        for k, v in module.log_step.items()
    }
    print(json.dumps(out, indent=1), flush=True)


if __name__ == "__main__":
    main()
