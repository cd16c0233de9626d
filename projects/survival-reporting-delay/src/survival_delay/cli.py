"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``survival_delay.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from survival_delay.data import SurvivalDelayDataModule
from survival_delay.model import JointHazardModule


class SurvivalDelayCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.n_features", "model.n_features")
        parser.link_arguments("data.horizon", "model.horizon")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the joint-hazard module and data; returns the CLI (trainer, model)."""
    return cli_main(
        JointHazardModule,
        SurvivalDelayDataModule,
        project_file=__file__,
        args=args,
        cli_class=SurvivalDelayCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the `survival-reporting-delay` script)."""
    train()
