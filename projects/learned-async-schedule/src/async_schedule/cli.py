"""``train`` (LightningCLI) and its CLI class. The other entry points live beside what they run
and this module never imports them: ``reproduce`` (the claim experiment) and
``learned-async-schedule-ablations`` (the design note's ablations) in claim.py,
``learned-async-schedule-sample`` (paper scale: checkpoint -> samples -> VAE decode -> ADM .npz)
in sample.py."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, Trainer

from async_schedule.data import MultiRepDataModule
from async_schedule.evaluate import TrainingReport
from async_schedule.model import AsyncDiffusionModule
from papers_cli import PapersCLI, cli_main


class ReportingCLI(PapersCLI):
    """`uv run train`'s CLI: the shared one plus a report of what the run learned (samples,
    FD-digit, the schedule with its start) written beside the logs when a fit ends."""

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        return super()._instantiate_trainer(config, [*callbacks, TrainingReport()])


def train(args: list[str] | None = None) -> PapersCLI:
    """``uv run train``: LAS (probe + main stage) on the MNIST miniature by default."""
    return cli_main(
        AsyncDiffusionModule,
        MultiRepDataModule,
        project_file=__file__,
        args=args,
        cli_class=ReportingCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique script)."""
    train()
