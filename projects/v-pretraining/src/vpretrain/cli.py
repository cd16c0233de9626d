"""Entry points: ``train`` (LightningCLI) and ``reproduce`` (the claim experiment, claim.py)."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from vpretrain.data import VPretrainDataModule
from vpretrain.model import VPretrainModule


class VPretrainCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        VPretrainModule,
        VPretrainDataModule,
        project_file=__file__,
        args=args,
        cli_class=VPretrainCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `v-pretraining` script)."""
    train()


def reproduce() -> None:
    """Console entry point of `uv run reproduce`."""
    from vpretrain.claim import run_claim_experiment

    run_claim_experiment()
