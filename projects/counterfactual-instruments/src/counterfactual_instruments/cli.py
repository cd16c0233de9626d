"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``counterfactual_instruments.claim:main``; claim.py imports this module, never the reverse."""

from __future__ import annotations

from counterfactual_instruments.data import (
    CounterfactualInstrumentsDataModule,
    probe_target_count,
)
from counterfactual_instruments.model import CounterfactualInstrumentsModule
from papers_cli import PapersCLI, cli_main


class CounterfactualInstrumentsCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The stems and heads follow the data's bands and stamp sizes.
        parser.link_arguments("data.bands_a", "model.n_bands_a", compute_fn=len)
        parser.link_arguments("data.bands_b", "model.n_bands_b", compute_fn=len)
        parser.link_arguments("data.size_a", "model.size_a")
        parser.link_arguments("data.size_b", "model.size_b")
        # Real data's probe targets are the catalogue columns --data.probe_variables names.
        parser.link_arguments(
            "data.probe_variables", "model.n_params", compute_fn=probe_target_count
        )


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the project's module and data; returns the CLI (trainer, model)."""
    return cli_main(
        CounterfactualInstrumentsModule,
        CounterfactualInstrumentsDataModule,
        project_file=__file__,
        args=args,
        cli_class=CounterfactualInstrumentsCLI,
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the `counterfactual-instruments` script)."""
    train()
