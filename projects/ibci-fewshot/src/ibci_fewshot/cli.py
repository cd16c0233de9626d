"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``ibci_fewshot.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from ibci_fewshot.data import IbciDataModule
from ibci_fewshot.model import IbciModule
from papers_cli import PapersCLI, cli_main


class IbciCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.channels", "model.channels")
        parser.link_arguments("data.n_sessions", "model.n_sessions", apply_on="instantiate")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        IbciModule,
        IbciDataModule,
        project_file=__file__,
        args=args,
        cli_class=IbciCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `ibci-fewshot` script)."""
    train()
