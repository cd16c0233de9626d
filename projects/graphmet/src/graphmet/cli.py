"""``train`` (LightningCLI) and ``reproduce`` (method vs baselines, writes results/)."""

from __future__ import annotations

import time

import torch
from lightning.pytorch import Trainer

from graphmet.baselines import MeanBaseline
from graphmet.data import GraphmetDataModule
from graphmet.model import GraphmetModule
from papers_cli import PapersCLI, cli_main, reproduce_parser
from papers_eval import write_results
from papers_gpu import seed_everything


class GraphmetCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.in_features", "model.in_features")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        GraphmetModule,
        GraphmetDataModule,
        project_file=__file__,
        args=args,
        cli_class=GraphmetCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `graphmet` script)."""
    train()


def reproduce() -> None:
    """Console entry point of `uv run reproduce`."""
    run_claim_experiment()


def run_claim_experiment(argv: list[str] | None = None) -> dict:
    """TEMPLATE claim experiment: the trained model beats the mean predictor on held-out MSE."""
    args = reproduce_parser(__doc__ or "", project_file=__file__).parse_args(argv)
    start = time.perf_counter()
    seed_everything(args.seed)
    data = GraphmetDataModule(n_train=128 if args.quick else 512, seed=args.seed)
    data.setup()
    model = GraphmetModule(in_features=data.hparams.in_features)
    Trainer(
        max_epochs=2 if args.quick else 20,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model, data)
    x_val, y_val = data.val_set.tensors
    with torch.no_grad():
        method_mse = torch.mean((model(x_val) - y_val) ** 2).item()
    baseline = MeanBaseline().fit(data.train_set.tensors[1])
    baseline_mse = torch.mean((baseline.predict(x_val) - y_val) ** 2).item()
    metrics = {"method": {"val_mse": method_mse}, "mean_baseline": {"val_mse": baseline_mse}}
    write_results(
        args.out,
        project="graphmet",
        experiment="template claim",
        claim="The trained model has lower held-out MSE than the mean predictor.",
        criterion="val_mse(method) < 0.5 * val_mse(mean_baseline)",
        holds=method_mse < 0.5 * baseline_mse,
        metrics=metrics,
        config={"quick": args.quick},
        seeds=[args.seed],
        wall_time_s=time.perf_counter() - start,
    )
    return metrics
