"""Entry points: ``train`` (LightningCLI), ``reproduce`` (the claim experiment, claim.py),
``learned-async-schedule-ablations`` (the design note's ablations, claim.py) and
``learned-async-schedule-sample`` (paper scale: checkpoint -> samples -> VAE decode -> ADM .npz,
sample.py)."""

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


def reproduce() -> None:
    """Console entry point of `uv run reproduce`."""
    from async_schedule.claim import run_claim_experiment

    run_claim_experiment()


def ablations() -> None:
    """Console entry point of the ablation experiment (not part of the claim's verdict)."""
    from async_schedule.claim import run_ablations

    run_ablations()


def sample() -> None:
    """Console entry point of the paper-scale sample-and-decode command."""
    from async_schedule.sample import sample_to_adm

    sample_to_adm()
