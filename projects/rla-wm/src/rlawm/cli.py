"""Entry points: ``train`` (LightningCLI) and ``reproduce`` (the claim experiment, claim.py)."""

from __future__ import annotations

from rlawm.data import RlawmDataModule
from rlawm.model import RlawmModule
from papers_cli import PapersCLI, cli_main


class RlawmCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.in_features", "model.in_features")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        RlawmModule,
        RlawmDataModule,
        project_file=__file__,
        args=args,
        cli_class=RlawmCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `rla-wm` script)."""
    train()


def reproduce() -> None:
    """Console entry point of `uv run reproduce`."""
    from rlawm.claim import run_claim_experiment

    run_claim_experiment()
