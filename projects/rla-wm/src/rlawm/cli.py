"""``train``: the LightningCLI class and entry point (papers.train). ``reproduce`` is
``rlawm.claim:main``; claim.py imports this module, never the other way round."""

from __future__ import annotations

from papers_cli import PapersCLI, cli_main
from rlawm.data import PushWorldDataModule
from rlawm.model import WorldModelModule


def token_count(image_size: int, patch_size: int) -> int:
    return (image_size // patch_size) ** 2


class RLACLI(PapersCLI):
    """The stand-in encoder's sizes set the model's token shape, so they cannot disagree (a
    pretrained encoder's shape is checked when the model meets the data)."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments(
            ("data.image_size", "data.patch_size"), "model.tokens", compute_fn=token_count
        )
        parser.link_arguments("data.encoder_width", "model.token_dim")
        parser.link_arguments("data.horizon", "model.horizon")


def train(args: list[str] | None = None) -> PapersCLI:
    """``uv run train``: RLA then RLA-WM on the push miniature (configs/default.yaml)."""
    return cli_main(
        WorldModelModule, PushWorldDataModule, project_file=__file__, args=args, cli_class=RLACLI
    )


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `rla-wm` script)."""
    train()
