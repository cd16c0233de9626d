"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``tcwm.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from tcwm.data import TcwmDataModule
from tcwm.model import TcwmModule

# The model's sizes are the data's (an embedding, state or action size other than the data's
# cannot be configured by mistake): read from the DataModule once it has loaded its arrays.
LINKED_SIZES = ("embed_dim", "n_tokens", "state_dim", "align_dim", "action_dim")


class TcwmCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.history", "model.history")
        for size in LINKED_SIZES:
            parser.link_arguments(f"data.{size}", f"model.{size}", apply_on="instantiate")


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
