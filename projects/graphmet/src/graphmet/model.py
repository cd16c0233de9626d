"""LightningModule: wiring only (losses from core, optimizer, logging)."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule

from graphmet.core import make_regressor, regression_loss


class GraphmetModule(LightningModule):
    def __init__(self, in_features: int = 8, hidden: int = 32, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = make_regressor(in_features, hidden)

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

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
