"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``aic.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

import torch

from aic.data import AicDataModule
from aic.model import AicModule
from papers_cli import PapersCLI, cli_main


class AicCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.task", "model.task")
        parser.link_arguments("data.context", "model.context")
        parser.link_arguments("data.env_id", "model.env_id")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the AIC module and the task data; returns the CLI (trainer, model)."""
    return cli_main(AicModule, AicDataModule, project_file=__file__, args=args, cli_class=AicCLI)


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `aic` script)."""
    torch.set_num_threads(1)
    train()
