"""Entry point of the vision half: ``v-pretraining-vision`` (LightningCLI over the vision module
and data, starting from configs/vision.yaml)."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from vpretrain.vision_data import DigitScenesDataModule
from vpretrain.vision_model import VisionVPretrainModule


class VisionCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        for shared in ("image_size", "num_channels", "num_classes", "ignore_index"):
            parser.link_arguments(f"data.{shared}", f"model.{shared}")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the vision module and data; returns the CLI (trainer, model, data)."""
    return cli_main(
        VisionVPretrainModule,
        DigitScenesDataModule,
        project_file=__file__,
        args=args,
        cli_class=VisionCLI,
        default_config="vision.yaml",
    )


def main() -> None:
    """Console entry point of ``v-pretraining-vision``."""
    train()
