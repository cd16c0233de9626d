"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``permflow.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from permflow.data import PermutationDataModule
from permflow.model import PermutationModel


class PermFlowCLI(PapersCLI):
    """Links the sizes that data and model share, so they cannot disagree."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.n", "model.n")
        parser.link_arguments("data.task", "model.task")
        parser.link_arguments("data.digits", "model.digits")


def train(args: list[str] | None = None) -> PapersCLI:
    """``uv run train``: PermFlow on task A by default; any config in configs/ layers on top."""
    return cli_main(
        PermutationModel,
        PermutationDataModule,
        project_file=__file__,
        args=args,
        cli_class=PermFlowCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `permflow` script)."""
    train()
