"""LightningModule: wiring only (losses from core, optimizer, logging)."""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from tcwm.core import make_regressor, regression_loss
from papers_cli.hparams import init_arguments


class TcwmModule(LightningModule):
    """The example regressor. Every hyper-parameter is typed, so a bad value is a parse error."""

    def __init__(
        self,
        in_features: PositiveInt = 8,
        hidden: PositiveInt = 32,
        activation: Literal["gelu", "relu", "tanh"] = "gelu",
        lr: PositiveFloat = 1e-2,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.net = make_regressor(in_features, hidden, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = regression_loss(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/mse", regression_loss(self(x), y), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        """The paper's metrics on the test split (`uv run train test --ckpt_path PATH`)."""
        x, y = batch
        self.log("test/mse", regression_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
