"""What the claim experiment calls for the vision half: a shared base pretraining per seed, then
one continued-pretraining arm from it, evaluated with frozen-backbone probes.

Arms (every one continues the same base for ``settings["steps"]`` learner steps):

- ``v_views``: learned views valued along u = P g_down (the method);
- ``fixed_augment``: fixed DINO augmentations (baseline);
- ``random_views``: view params uniform within the designer's bounds (baseline);
- ``random_direction``: the designer fed a random direction of the same norm (negative control).

Every run goes through the real CLI (``configs/vision.yaml`` plus ``settings``), quietly.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback

from papers_cli import quiet_fit
from vpretrain.vision_cli import VisionCLI
from vpretrain.vision_data import DigitScenesDataModule
from vpretrain.vision_model import VisionVPretrainModule

ARMS = {
    "v_views": {"view_mode": "learned", "value_direction": "downstream"},
    "fixed_augment": {"view_mode": "fixed"},
    "random_views": {"view_mode": "random"},
    "random_direction": {"view_mode": "learned", "value_direction": "random"},
}

# Sized so that a base and the four arms of one seed take about 40 s on one CPU core.
DEFAULT_SETTINGS: dict[str, Any] = {
    "base_steps": 40,
    "steps": 20,
    "model": {"eval_head_steps": 100},
    "data": {
        "batch_size": 16,
        "n_unlabeled": 320,
        "n_feedback": 128,
        "n_evaluation": 128,
        "n_probe_train": 256,
        "n_probe_test": 128,
    },
}


class StepRecorder(Callback):
    """Times every training batch and keeps the designer evidence each step logged."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.values: list[float] = []
        self.view_distances: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.durations.append(time.perf_counter() - self._start)
        metrics = trainer.callback_metrics
        distances = [float(v) for k, v in metrics.items() if k.endswith("_from_identity")]
        self.view_distances.append(float(np.mean(distances)))
        if "train/value" in metrics:
            self.values.append(float(metrics["train/value"]))


def fit(
    seed: int,
    settings: dict[str, Any],
    max_steps: int,
    model: dict[str, Any],
    ckpt_path: Path | None = None,
    callbacks=(),
):
    """One quiet run of the vision CLI up to ``max_steps`` learner steps (counted from 0, so a
    run resumed from ``ckpt_path`` continues to that total)."""
    overrides = ["--trainer.accelerator=cpu", f"--trainer.max_steps={max_steps}"]
    overrides += [f"--model.{k}={v}" for k, v in {**settings.get("model", {}), **model}.items()]
    overrides += [f"--data.{k}={v}" for k, v in settings.get("data", {}).items()]
    if ckpt_path is not None:
        overrides.append(f"--ckpt_path={ckpt_path}")
    return quiet_fit(
        VisionVPretrainModule,
        DigitScenesDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        callbacks=list(callbacks),
        cli_class=VisionCLI,
        default_config="vision.yaml",
    )


def pretrain_vision_base(seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Plain DINO with fixed augmentations for ``settings["base_steps"]`` steps; returns the
    Lightning checkpoint (weights, EMA teacher, centre, optimizer state, loop counters) as a
    dict, shared by every arm of the seed."""
    cli = fit(seed, settings, settings["base_steps"], ARMS["fixed_augment"])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "base.ckpt"
        cli.trainer.save_checkpoint(path)
        return torch.load(path, weights_only=True)


def run_vision_arm(
    arm: str, base: dict[str, Any], seed: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """Continue ``base`` for ``settings["steps"]`` steps as ``arm``, then evaluate: dense probes
    fitted on the feedback split and scored per evaluation scene, the linear probe per probe
    test item (the backbone frozen)."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {sorted(ARMS)}, got {arm!r}")
    recorder = StepRecorder()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "base.ckpt"
        # LightningCLI takes a checkpoint's hyper-parameters over the command line's, so the
        # arm's settings go into the copy of the base it resumes from.
        model = {**base["hyper_parameters"], **settings.get("model", {}), **ARMS[arm]}
        torch.save({**base, "hyper_parameters": model}, path)
        total = base["global_step"] + settings["steps"]
        cli = fit(seed, settings, total, ARMS[arm], ckpt_path=path, callbacks=[recorder])
    cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    items = cli.model.per_item_results()
    return {
        "seg_miou": items["seg_miou"],  # per evaluation scene, higher is better
        "depth_rmse": items["depth_rmse"],  # per evaluation scene, metres, lower is better
        "probe_correct": items["probe_correct"],  # 0/1 per probe test item
        "steps": float(cli.trainer.global_step - base["global_step"]),
        "wall_s": time.perf_counter() - start,
        "step_time_s": float(np.median(recorder.durations[1:] or recorder.durations)),
        "view_distance_from_identity": float(np.mean(recorder.view_distances)),
        "designer_movement": cli.model.designer_movement().item(),
        "mean_value": float(np.mean(recorder.values)) if recorder.values else float("nan"),
    }
