"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``seqrejectron.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from seqrejectron.data import SeqRejectronDataModule
from seqrejectron.model import SeqRejectronModule


class SeqRejectronCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.in_features", "model.in_features")
        parser.link_arguments("data.n_test", "model.n_test")
        parser.link_arguments("data.n_actions", "model.n_actions")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        SeqRejectronModule,
        SeqRejectronDataModule,
        project_file=__file__,
        args=args,
        cli_class=SeqRejectronCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `seqrejectron` script)."""
    train()
