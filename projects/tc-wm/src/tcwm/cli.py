"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``tcwm.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from tcwm.data import TcwmDataModule
from tcwm.model import TcwmModule
from papers_cli import PapersCLI, cli_main


class TcwmCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.in_features", "model.in_features")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        TcwmModule,
        TcwmDataModule,
        project_file=__file__,
        args=args,
        cli_class=TcwmCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `tc-wm` script)."""
    train()
