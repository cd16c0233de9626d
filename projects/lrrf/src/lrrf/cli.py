"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``lrrf.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from lrrf.data import LrrfDataModule
from lrrf.model import LrrfModule
from papers_cli import PapersCLI, cli_main


class LrrfCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.dataset", "model.dataset")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(LrrfModule, LrrfDataModule, project_file=__file__, args=args,
                    cli_class=LrrfCLI)  # fmt: skip


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `lrrf` script)."""
    train()
