"""LightningModule: wiring only (model from core/baselines, objective from core, metrics)."""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from graphmet.baselines import MessagePassingProcessor
from graphmet.core import GraphWeatherModel, training_objective
from graphmet.koopman import KoopmanProcessor
from graphmet.mesh import WeatherGraph
from graphmet.metrics import weighted_rmse
from papers_cli import ConfigError

Processor = Literal["graphmet", "message_passing"]
Pairing = Literal["modes", "channels"]


def build_model(
    processor: Processor,
    channels: int,
    dim: int,
    depth: int,
    modes: int,
    rank: int,
    pairing: Pairing,
) -> GraphWeatherModel:
    """GraphMet (``processor="graphmet"``) or the message-passing baseline, same enc/dec."""
    if processor == "message_passing":
        return GraphWeatherModel(channels, dim, MessagePassingProcessor(dim, depth))
    if pairing == "modes" and modes % 2:
        raise ConfigError(
            f"data.modes={modes} must be even: pairing=modes rotates basis vectors in pairs "
            "(or set --model.pairing=channels)"
        )
    if pairing == "channels" and rank % 2:
        raise ConfigError(
            f"model.rank={rank} must be even: pairing=channels rotates lifted channels in pairs "
            "(or set --model.pairing=modes)"
        )
    return GraphWeatherModel(channels, dim, KoopmanProcessor(dim, modes, rank, pairing))


class GraphmetModule(LightningModule):
    def __init__(
        self,
        processor: Processor = "graphmet",
        channels: PositiveInt = 2,
        dim: PositiveInt = 24,
        depth: PositiveInt = 4,
        modes: PositiveInt = 64,
        rank: PositiveInt = 16,
        pairing: Pairing = "modes",
        alpha: NonNegativeFloat = 0.1,
        lambda_geo: NonNegativeFloat = 1.0,
        lr: PositiveFloat = 2e-3,
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
