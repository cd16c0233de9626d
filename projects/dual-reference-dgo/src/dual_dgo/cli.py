"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``dual_dgo.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from dual_dgo.data import DualDgoDataModule
from dual_dgo.model import DualDgoModule
from papers_cli import PapersCLI, cli_main


class DualDgoCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.checkpoint", "data.checkpoint")
        parser.link_arguments("data.length_cost", "model.length_cost")
        parser.link_arguments("model.verifier", "data.verifier")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        DualDgoModule,
        DualDgoDataModule,
        project_file=__file__,
        args=args,
        cli_class=DualDgoCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `dual-reference-dgo` script)."""
    train()
