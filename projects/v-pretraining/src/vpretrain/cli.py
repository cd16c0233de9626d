"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``vpretrain.claim:main``; claim.py imports this module, never the other way round."""

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
