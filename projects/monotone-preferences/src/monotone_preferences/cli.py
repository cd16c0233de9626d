"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``monotone_preferences.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from monotone_preferences.data import MonotonePreferencesDataModule
from monotone_preferences.model import MonotonePreferencesModule
from papers_cli import PapersCLI, cli_main


class MonotonePreferencesCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.in_features", "model.in_features")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        MonotonePreferencesModule,
        MonotonePreferencesDataModule,
        project_file=__file__,
        args=args,
        cli_class=MonotonePreferencesCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `monotone-preferences` script)."""
    train()
