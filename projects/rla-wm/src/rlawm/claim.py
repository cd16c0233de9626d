"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

TEMPLATE claim: the trained regressor has less than half the mean predictor's held-out squared
error. Every subject runs on every seed (the seed sets data, initialisation and noise):

- ``mlp``: the method, trained through the real CLI with the learning rate tuned on validation;
- ``mean_predictor``: the baseline;
- ``untrained`` (negative control): the same network with no training step;
- ``true_weights`` (positive control): the miniature's generating map, an oracle.

papers_eval applies the checks to the method and to both controls and computes the verdict.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlawm.baselines import MeanBaseline
from rlawm.cli import RlawmCLI
from rlawm.core import squared_errors
from rlawm.data import RlawmDataModule
from rlawm.model import RlawmModule
from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import judge, load_claim_spec, run_seeds, tune, write_claim

CLAIM_FILE = project_dir_of(__file__) / "configs" / "claim.yaml"
SUBJECTS = ("mlp", "mean_predictor", "untrained", "true_weights")
METRICS = ("test_sq_error", "val_mse")


def fit(seed: int, settings: dict[str, Any], params: dict[str, Any], train: bool = True):
    """One run of the real CLI (no logger, no checkpoints); ``train=False`` stops before the
    first step, which gives the data and the network at its initialisation."""
    overrides = [f"--trainer.max_epochs={settings['max_epochs']}"]
    overrides += [f"--model.{key}={value}" for key, value in params.items()]
    if not train:
        overrides.append("--trainer.max_steps=0")
    return quiet_fit(
        RlawmModule,
        RlawmDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        cli_class=RlawmCLI,
    )


def evaluate(predict, data: RlawmDataModule) -> dict[str, np.ndarray]:
    """Per-item squared errors on the test split and the validation MSE."""
    with torch.no_grad():
        x_test, y_test = data.test_set.tensors
        x_val, y_val = data.val_set.tensors
        return {
            "test_sq_error": squared_errors(predict(x_test), y_test).numpy(),
            "val_mse": squared_errors(predict(x_val), y_val).mean().item(),
        }


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed, judge, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    spec = load_claim_spec(
        CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, quick=args.quick, seeds=args.seeds
    )
    start = time.perf_counter()
    settings = dict(spec.settings)

    def validation_score(subject: str, params: dict[str, Any], seed: int) -> float:
        cli = fit(seed, settings, params)
        return evaluate(cli.model, cli.datamodule)["val_mse"]

    tuning = tune(spec, validation_score)
    moved: list[float] = []

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        initial = fit(seed, settings, tuning.best["mlp"], train=False)
        data = initial.datamodule
        if subject == "mlp":
            trained = fit(seed, settings, tuning.best["mlp"]).model
            moved.append(relative_change(initial.model, trained))
            return evaluate(trained, data)
        if subject == "untrained":
            return evaluate(initial.model, data)
        if subject == "mean_predictor":
            return evaluate(MeanBaseline().fit(data.train_set.tensors[1]).predict, data)
        weights = torch.from_numpy(data.true_weights)
        return evaluate(lambda x: x @ weights, data)

    results = run_seeds(spec, run_one)
    judgement = judge(spec, results)
    write_claim(
        args.out,
        project="rla-wm",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence={"relative_parameter_change_of_mlp": float(np.mean(moved))},
    )
    return {"verdict": judgement.verdict, "results": results}


def relative_change(before: torch.nn.Module, after: torch.nn.Module) -> float:
    """||theta_after - theta_before|| / ||theta_before||: how far training moved the network."""
    a = torch.cat([p.detach().flatten() for p in before.parameters()])
    b = torch.cat([p.detach().flatten() for p in after.parameters()])
    return ((b - a).norm() / a.norm()).item()
