"""LightningModule: wiring only (model from core/baselines, objective from core, metrics)."""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from graphmet.baselines import MessagePassingProcessor
from graphmet.core import GraphWeatherModel, training_objective
from graphmet.koopman import IdentityProcessor, KoopmanProcessor
from graphmet.mesh import WeatherGraph
from graphmet.metrics import activity, weighted_rmse
from papers_cli import ConfigError, init_arguments

Processor = Literal["graphmet", "message_passing", "identity"]
Pairing = Literal["auto", "modes", "channels"]
Basis = Literal["laplacian", "fourier"]


def resolve_pairing(pairing: Pairing, basis: Basis) -> str:
    """``auto``: mode pairs on the Fourier basis (cos/sin pairs), channel pairs otherwise.
    Pairing Laplacian eigenvectors would rotate unrelated modes into each other: refused."""
    if pairing == "auto":
        return "modes" if basis == "fourier" else "channels"
    if pairing == "modes" and basis != "fourier":
        raise ConfigError(
            "model.pairing=modes needs the Fourier basis (data.basis=fourier, periodic domain): "
            "Laplacian eigenvectors come in no (cos, sin) pairs; use pairing=channels or auto"
        )
    return pairing


def build_model(
    processor: Processor,
    channels: int,
    dim: int,
    depth: int,
    modes: int,
    rank: int,
    pairing: Pairing,
    basis: Basis = "laplacian",
    static_channels: int = 0,
    forcing_channels: int = 0,
) -> GraphWeatherModel:
    """GraphMet (``processor="graphmet"``), the message-passing baseline or the
    encoder-decoder with no processor (``identity``), all with the same encoder and decoder."""
    extra = {"static_channels": static_channels, "forcing_channels": forcing_channels}
    if processor == "message_passing":
        return GraphWeatherModel(channels, dim, MessagePassingProcessor(dim, depth), **extra)
    if processor == "identity":
        return GraphWeatherModel(channels, dim, IdentityProcessor(), **extra)
    pairing = resolve_pairing(pairing, basis)
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
    return GraphWeatherModel(channels, dim, KoopmanProcessor(dim, modes, rank, pairing), **extra)


class GraphmetModule(LightningModule):
    def __init__(
        self,
        processor: Processor = "graphmet",
        channels: PositiveInt = 2,
        static_channels: NonNegativeInt = 0,
        forcing_channels: NonNegativeInt = 0,
        dim: PositiveInt = 24,
        depth: PositiveInt = 4,
        modes: PositiveInt = 64,
        rank: PositiveInt = 16,
        pairing: Pairing = "auto",
        basis: Basis = "laplacian",
        alpha: NonNegativeFloat = 0.1,
        lambda_geo: NonNegativeFloat = 1.0,
        spectral_weight: NonNegativeFloat = 0.0,
        forecast_steps: PositiveInt | None = None,
        oneshot_weight: NonNegativeFloat = 0.0,
        lr: PositiveFloat = 2e-3,
    ) -> None:
        """``basis`` is linked from data.basis; ``forecast_steps``: steps of the forecast loss
        (default: the whole training window; the Koopman loss always uses every lead);
        ``spectral_weight``: beta of the FFT-amplitude loss G5 (the spectral-loss baseline);
        ``oneshot_weight``: gamma of the one-shot term G6 (GraphMet only; trains Eq. K5)."""
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.net = build_model(
            processor,
            channels,
            dim,
            depth,
            modes,
            rank,
            pairing,
            basis,
            static_channels,
            forcing_channels,
        )

    def attach_graph(
        self,
        graph: WeatherGraph,
        climatology: torch.Tensor | None = None,
        increment_scale: torch.Tensor | None = None,
    ) -> None:
        self.net.attach_graph(graph, climatology, increment_scale)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if self.net.graph is None and datamodule is not None:
            self.attach_graph(datamodule.graph, datamodule.climatology, datamodule.increment_scale)

    def on_fit_start(self) -> None:
        if self.hparams.spectral_weight > 0 and self.net.graph.interior_shape is None:
            raise ConfigError(
                "model.spectral_weight > 0 needs a planar grid (regional or periodic): the "
                "FFT-amplitude loss is not defined on the sphere here"
            )

    def training_step(self, batch, batch_idx):
        h = self.hparams
        terms = training_objective(
            self.net,
            batch,
            h.alpha,
            h.lambda_geo,
            h.spectral_weight,
            h.forecast_steps,
            h.oneshot_weight,
        )
        for name, value in terms.items():
            self.log(f"train/{name}", value, prog_bar=name == "loss")
        return terms["loss"]

    def _rollout_scores(self, batch, prefix: str) -> None:
        channels, weight = self.net.channels, self.net.graph.loss_weight
        prediction, _ = self.net.rollout(batch[:, 0, :, :channels], batch[:, 1:])
        truth = batch[:, 1:, :, :channels]
        rmse = weighted_rmse(prediction, truth, weight)  # [T, C]
        self.log(f"{prefix}/rmse", rmse.mean(), prog_bar=prefix == "val", sync_dist=True)
        self.log(f"{prefix}/rmse_last", rmse[-1].mean(), sync_dist=True)
        if prefix == "test":
            clim = self.net.graph.climatology[:, :channels]
            score = activity(prediction, truth, clim, weight)  # [T, C]
            self.log("test/activity_last", score[-1].mean(), sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._rollout_scores(batch, "val")

    def test_step(self, batch, batch_idx):
        """`train test --ckpt_path PATH`: RMSE and activity of rollouts on the test split."""
        self._rollout_scores(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
