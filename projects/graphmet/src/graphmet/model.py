"""LightningModule: wiring only (model from core/baselines, objective from core, metrics)."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule

from graphmet.baselines import MessagePassingProcessor
from graphmet.core import GraphWeatherModel, training_objective
from graphmet.koopman import KoopmanProcessor
from graphmet.mesh import WeatherGraph
from graphmet.metrics import weighted_rmse


class ConfigError(ValueError):
    """An inconsistent model configuration."""

    user_facing = True


def build_model(
    processor: str, channels: int, dim: int, depth: int, modes: int, rank: int, pairing: str
) -> GraphWeatherModel:
    """GraphMet (``processor="graphmet"``) or the message-passing baseline, same enc/dec."""
    if processor == "graphmet":
        if modes % 2 and pairing == "modes":
            raise ConfigError(f"modes={modes} must be even to pair basis vectors")
        core = KoopmanProcessor(dim, modes, rank, pairing)
    elif processor == "message_passing":
        core = MessagePassingProcessor(dim, depth)
    else:
        raise ConfigError(f"processor must be 'graphmet' or 'message_passing', got {processor!r}")
    return GraphWeatherModel(channels, dim, core)


class GraphmetModule(LightningModule):
    def __init__(
        self,
        processor: str = "graphmet",
        channels: int = 2,
        dim: int = 24,
        depth: int = 4,
        modes: int = 64,
        rank: int = 16,
        pairing: str = "modes",
        alpha: float = 0.1,
        lambda_geo: float = 1.0,
        lr: float = 2e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_model(processor, channels, dim, depth, modes, rank, pairing)

    def attach_graph(self, graph: WeatherGraph) -> None:
        self.net.attach_graph(graph)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if self.net.graph is None and datamodule is not None:
            self.attach_graph(datamodule.graph)

    def training_step(self, batch, batch_idx):
        terms = training_objective(self.net, batch, self.hparams.alpha, self.hparams.lambda_geo)
        for name, value in terms.items():
            self.log(f"train/{name}", value, prog_bar=name == "loss")
        return terms["loss"]

    def validation_step(self, batch, batch_idx):
        prediction, _ = self.net.rollout(batch[:, 0], batch[:, 1:])
        rmse = weighted_rmse(prediction, batch[:, 1:], self.net.graph.loss_weight)  # [T, C]
        self.log("val/rmse", rmse.mean(), prog_bar=True, sync_dist=True)
        self.log("val/rmse_last", rmse[-1].mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
