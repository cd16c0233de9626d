"""A2C with AIC halting through the CLI, as registered (configs/rl_minigrid.yaml), per epoch:
the greedy AIC policy's return, the uniform random policy's on the same episode seeds, the
returns of the training episodes and AIC's refinement steps per decision.

    cd projects/aic && uv run python results/rl_minigrid.py   # -> results/rl_minigrid.json
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

from aic.cli import AicCLI
from aic.data import AicDataModule
from aic.model import AicModule
from papers_cli import cli_main

HERE = Path(__file__).resolve().parent
KEYS = (
    "val/episode_return",
    "val/random_policy_return",
    "val/episode_mean_steps",
    "train/episode_return",
)


class PerEpoch(Callback):
    def __init__(self):
        self.rows = []

    def on_train_epoch_end(self, trainer, pl_module):  # after the epoch's validation
        metrics = trainer.callback_metrics
        row = {"epoch": trainer.current_epoch, "updates": trainer.global_step}
        row.update({k: float(metrics[k]) for k in KEYS if k in metrics})
        self.rows.append(row)


def git_revision() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()


if __name__ == "__main__":
    torch.set_num_threads(1)  # as `uv run train` (aic.cli.main)
    start = time.perf_counter()
    log = PerEpoch()
    args = [
        "--config",
        str(HERE.parent / "configs" / "rl_minigrid.yaml"),
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        *sys.argv[1:],
    ]
    cli = cli_main(
        AicModule,
        AicDataModule,
        project_file=HERE.parent / "src" / "aic" / "cli.py",
        args=args,
        cli_class=AicCLI,
        trainer_defaults_override={"callbacks": [log]},
    )
    record = {
        "command": "uv run python results/rl_minigrid.py " + " ".join(sys.argv[1:]),
        "config": "configs/rl_minigrid.yaml",
        "git_revision": git_revision(),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "torch_threads": 1,
        "per_epoch": log.rows,
    }
    (HERE / "rl_minigrid.json").write_text(json.dumps(record, indent=2) + "\n")
    for row in log.rows:
        print(row)
    print("wall", record["wall_time_s"], "s")
