"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``graphmet.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

import torch

from graphmet.data import GraphmetDataModule
from graphmet.model import GraphmetModule
from papers_cli import PapersCLI, cli_main

# The miniature's ops are small: on a shared 2-core machine one thread per process was 6-9x
# faster than two (OpenMP oversubscription), measured with the training step of both models.
CPU_THREADS = 1


class GraphmetCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.modes", "model.modes")
        parser.link_arguments("data.basis", "model.basis")
        parser.link_arguments(
            "data.variables", "model.channels", compute_fn=lambda v: len(v or [0, 0])
        )
        parser.link_arguments(
            "data.static_variables", "model.static_channels", compute_fn=lambda v: len(v or [])
        )
        parser.link_arguments(
            "data.forcing_variables", "model.forcing_channels", compute_fn=lambda v: len(v or [])
        )


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        GraphmetModule,
        GraphmetDataModule,
        project_file=__file__,
        args=args,
        cli_class=GraphmetCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `graphmet` script)."""
    torch.set_num_threads(CPU_THREADS)
    train()
