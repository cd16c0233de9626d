"""LightningModule: wiring only. The objectives' math is in core.py; this file picks the
encoders, decoders and terms of one objective and trains them.

Objectives (``--model.objective``):

- ``counterfactual`` (the method): dual encoder, eq. (1) of core.py plus the self term (3),
  the instrument latent read from a *neighbour* (another object under the same condition);
- ``same_object`` (ablation): the same, with the instrument latent read from the target
  object's own view, the leakage route the neighbour closes;
- ``self_reconstruction`` (negative control): dual encoder trained only to rebuild each view
  from its own two latents;
- ``autoencoder`` (baseline): one encoder, one latent of the same total width, each view
  rebuilt from its own latent;
- ``translation`` (baseline): one encoder, A -> B and B -> A regression, no instrument latent;
- ``contrastive`` (baseline, AstroCLIP-style): one encoder, InfoNCE (6) across instruments;
- ``oracle`` (positive control): no encoders; the simulator's true parameters and observing
  condition stand in for z_p and z_s, through the same decoders, objective and probes.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from torch import nn

from counterfactual_instruments.core import Decoder, Encoder, FlowDecoder, chi2_loss, info_nce
from papers_cli.hparams import init_arguments

Objective = Literal[
    "counterfactual",
    "same_object",
    "self_reconstruction",
    "autoencoder",
    "translation",
    "contrastive",
    "oracle",
]
DUAL = ("counterfactual", "same_object", "self_reconstruction")
INSTRUMENTS = ("A", "B")


class CounterfactualInstrumentsModule(LightningModule):
    """Every hyper-parameter is typed, so a bad value is a parse error. ``n_bands_*``, ``size_*``,
    ``n_params`` and ``n_conditions`` are linked from the data."""

    def __init__(
        self,
        objective: Objective = "counterfactual",
        decoder: Literal["deterministic", "flow"] = "deterministic",
        intrinsic_dim: PositiveInt = 16,
        instrument_dim: PositiveInt = 4,
        width: PositiveInt = 16,
        self_weight: NonNegativeFloat = 1.0,
        temperature: PositiveFloat = 0.1,
        lr: PositiveFloat = 3e-3,
        weight_decay: NonNegativeFloat = 0.0,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        lr_decay_steps: NonNegativeInt = 0,
        flow_samples: PositiveInt = 4,
        flow_channels: list[PositiveInt] = [32, 64],  # noqa: B006 (jsonargparse reads the default)
        flow_steps: PositiveInt = 16,
        n_bands_a: PositiveInt = 3,
        n_bands_b: PositiveInt = 5,
        size_a: PositiveInt = 16,
        size_b: PositiveInt = 24,
        n_params: PositiveInt = 6,
        n_conditions: PositiveInt = 2,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline (papers_cli.hparams; builtin types for weights_only loading).
        self.save_hyperparameters(init_arguments(locals()))
        if decoder == "flow" and objective == "contrastive":
            raise ValueError("the contrastive baseline has no decoder: drop --model.decoder=flow")
        bands = {"A": n_bands_a, "B": n_bands_b}
        sizes = {"A": size_a, "B": size_b}
        if objective in DUAL:
            self.encoder = Encoder(bands, intrinsic_dim, width)
            self.instrument_encoder = Encoder(bands, instrument_dim, width)
            latent, condition = intrinsic_dim, instrument_dim
        elif objective == "oracle":
            self.encoder = self.instrument_encoder = None
            latent, condition = n_params, n_conditions
        else:  # one encoder, one latent as wide as the dual encoder's two together
            self.encoder = Encoder(bands, intrinsic_dim + instrument_dim, width)
            self.instrument_encoder = None
            latent, condition = intrinsic_dim + instrument_dim, 0
        self.decoders = None
        if objective != "contrastive":
            if decoder == "flow":
                heads = {
                    x: FlowDecoder(
                        bands[x], sizes[x], latent, condition, tuple(flow_channels), flow_steps
                    )
                    for x in INSTRUMENTS
                }
            else:
                heads = {
                    x: Decoder(bands[x], sizes[x], latent, condition, width) for x in INSTRUMENTS
                }
            self.decoders = nn.ModuleDict(heads)
        self.loss_terms: dict[str, torch.Tensor] = {}

    # -- latents ----------------------------------------------------------------------------
    def intrinsic(self, batch: dict, instrument: str, key: str = "image") -> torch.Tensor:
        """z_p of the view ``<key>_<instrument>`` (the oracle: the true parameters)."""
        if self.encoder is None:
            return batch["params"]
        return self.encoder(batch[f"{key}_{instrument}"], instrument)

    @property
    def instrument_source(self) -> str:
        """Which view the instrument encoder reads: the neighbour under the same condition (the
        method), or the target's own view (same_object, self_reconstruction)."""
        return "neighbour" if self.hparams.objective == "counterfactual" else "image"

    def instrument(self, batch: dict, instrument: str, key: str) -> torch.Tensor | None:
        """z_s read from the view ``<key>_<instrument>`` (the oracle: the true condition of that
        observation, ``partner_*`` keys the partner's); None for objectives without one."""
        if self.hparams.objective == "oracle":
            return batch[f"{'partner_cond' if key.startswith('partner') else 'cond'}_{instrument}"]
        if self.instrument_encoder is None:
            return None
        return self.instrument_encoder(batch[f"{key}_{instrument}"], instrument)

    # -- objectives -------------------------------------------------------------------------
    def reconstruction(self, batch, instrument, z_p, z_s) -> torch.Tensor:
        """The view of ``instrument`` generated from (z_p, z_s), scored against the observed
        view: chi2 (eq. 2) for the deterministic decoder, flow matching (eq. 4) for the flow
        decoder (in normalised flux units; the flow models the noise, so no weights)."""
        decoder, target = self.decoders[instrument], batch[f"image_{instrument}"]
        if self.hparams.decoder == "flow":
            return decoder.loss(target, z_p, z_s, generator=self._noise_generator())
        ivar, mask = batch[f"ivar_{instrument}"], batch[f"mask_{instrument}"]
        return chi2_loss(decoder(z_p, z_s), target, ivar, mask)

    def objective_terms(self, batch: dict) -> dict[str, torch.Tensor]:
        """The weighted loss terms of ``hparams.objective``; their sum is the loss."""
        h = self.hparams
        if h.objective == "contrastive":
            z_a, z_b = self.intrinsic(batch, "A"), self.intrinsic(batch, "B")
            return {"info_nce": info_nce(z_a, z_b, h.temperature)}
        z_a, z_b = self.intrinsic(batch, "A"), self.intrinsic(batch, "B")
        if h.objective == "autoencoder":
            own = self.reconstruction(batch, "A", z_a, None) + self.reconstruction(
                batch, "B", z_b, None
            )
            return {"self": own}
        if h.objective == "translation":
            cross = self.reconstruction(batch, "B", z_a, None) + self.reconstruction(
                batch, "A", z_b, None
            )
            return {"translation": cross}
        source = self.instrument_source
        s_a, s_b = self.instrument(batch, "A", source), self.instrument(batch, "B", source)
        own = self.reconstruction(batch, "A", z_a, s_a) + self.reconstruction(batch, "B", z_b, s_b)
        if h.objective == "self_reconstruction":
            return {"self": own}
        cross = self.reconstruction(batch, "B", z_a, s_b) + self.reconstruction(
            batch, "A", z_b, s_a
        )
        terms = {"counterfactual": cross}
        if h.self_weight > 0:
            terms["self"] = h.self_weight * own
        return terms

    def _noise_generator(self) -> torch.Generator:
        """Flow-matching noise, seeded by the step and the rank: a resumed run draws what the
        uninterrupted run drew, and DDP ranks draw different noise."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(1_000_003 * self.global_step + self.global_rank + 17)
        return generator

    # -- uses -------------------------------------------------------------------------------
    @torch.no_grad()
    def counterfactual_view(self, batch: dict) -> torch.Tensor | None:
        """Galaxy i as B would see it under the condition of the partner's B observation:
        D_B(E_p(x^A_i), z_s), z_s read from the partner's exposure the way the objective was
        trained (the method: the star beside the partner; same_object and self_reconstruction:
        the partner's own view); None for the contrastive baseline. Baselines without
        an instrument latent ignore the partner; the flow decoder returns the mean of
        ``flow_samples`` draws."""
        if self.decoders is None:
            return None
        z_p = self.intrinsic(batch, "A")
        z_s = self.instrument(batch, "B", f"partner_{self.instrument_source}")
        return self.render("B", z_p, z_s, batch["image_B"].shape)

    @torch.no_grad()
    def render(self, instrument: str, z_p, z_s, shape) -> torch.Tensor:
        """``instrument``'s view from the two latents: the deterministic decoder's output, or the
        mean of ``flow_samples`` Euler draws of the flow decoder (seeded: the same latents give
        the same view)."""
        decoder = self.decoders[instrument]
        if self.hparams.decoder == "deterministic":
            return decoder(z_p, z_s)
        generator = torch.Generator(device=self.device).manual_seed(0)
        draws = [
            decoder.sample(z_p, z_s, shape, generator) for _ in range(self.hparams.flow_samples)
        ]
        return torch.stack(draws).mean(0)

    # -- Lightning ----------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        self.loss_terms = self.objective_terms(batch)
        loss = sum(self.loss_terms.values())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = sum(self.objective_terms(batch).values())
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        """The objective and, where the split has truths, the counterfactual error against the
        noise-free truth (chi2 in the partner's noise units) (`uv run train test --ckpt_path`)."""
        self.log("test/loss", sum(self.objective_terms(batch).values()), sync_dist=True)
        view = self.counterfactual_view(batch) if "truth_B" in batch else None
        if view is not None:
            error = chi2_loss(view, batch["truth_B"], batch["partner_ivar_B"])
            self.log("test/counterfactual_chi2", error, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        """The three uses and the leakage on the test split (probes fit on the training
        split's latents): `uv run train test --ckpt_path PATH` reports them from a checkpoint."""
        from counterfactual_instruments.evaluation import evaluate

        data = self.trainer.datamodule
        if data is None or self.trainer.world_size > 1:
            return  # the probes need the whole training split in one process
        for name, values in evaluate(self, data).items():
            value = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            self.log(f"test/{name}", value)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        if self.hparams.lr_schedule == "constant":
            return optimizer
        # Cosine decay to zero over lr_decay_steps optimizer steps (0: the run's own length),
        # stepped per batch; a resumed run continues from the checkpoint's scheduler state.
        steps = self.hparams.lr_decay_steps or max(1, int(self.trainer.estimated_stepping_batches))
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
