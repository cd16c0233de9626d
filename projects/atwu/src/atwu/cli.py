"""``train`` (LightningCLI: fine-tune, then unlearn); ``reproduce`` is ``atwu.claim:main``."""

from __future__ import annotations

from atwu.data import UnlearningDataModule
from atwu.model import UnlearningModule
from papers_cli import PapersCLI, cli_main


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the unlearning module and the TOFU / TOFU-mini data."""
    return cli_main(UnlearningModule, UnlearningDataModule, project_file=__file__, args=args)


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `atwu` script)."""
    train()
