"""The LightningModule: RLA-WM (two stages) and the token-space baselines, one interface.

``method="rla_wm"``: the first ``rla_steps`` steps train the RLA autoencoder (Eqs. 1-3); then
the autoencoder is frozen, its latents are standardised per dimension over the training pairs,
and the remaining steps train the flow world model over RLA (Eq. 5). Prediction: Euler
sampling (Eq. 6) of a standardised RLA, un-standardised and decoded by the frozen decoder;
rollouts feed predictions back (Eq. 7). The flow noise comes from a seeded generator that the
checkpoint carries, so a resumed run draws exactly the noise an uninterrupted one draws.

Baselines, on the same tokens, pairs and world-model steps: ``regression`` (DINO-WM style),
``token_flow`` (flow in full token space), ``rla_regression`` (the RLA regressed, no flow; it
has the autoencoder stage too) and ``persistence`` (copy x_t; nothing to train).
"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from papers_cli.hparams import init_arguments
from rlawm import core
from rlawm.baselines import RegressionWorldModel, RLARegressor, TokenFlowWorldModel
from rlawm.evaluate import predict_rollouts, score_rollouts

Method = Literal["rla_wm", "regression", "token_flow", "rla_regression", "persistence"]
USES_RLA = ("rla_wm", "rla_regression")


class WorldModelModule(L.LightningModule):
    def __init__(
        self,
        method: Method = "rla_wm",
        token_dim: PositiveInt = 32,
        tokens: PositiveInt = 16,
        action_dim: PositiveInt = 2,
        horizon: PositiveInt = 4,
        latent_tokens: PositiveInt = 4,
        latent_dim: PositiveInt = 8,
        residual: core.ResidualMode = "sub",
        codebook_size: NonNegativeInt = 0,
        width: PositiveInt = 64,
        depth: PositiveInt = 2,
        heads: PositiveInt = 4,
        rla_steps: NonNegativeInt = 600,
        lr: PositiveFloat = 1e-3,
        sample_steps: PositiveInt = 10,
        num_samples: PositiveInt = 8,
        min_truth_spread: NonNegativeFloat = 0.05,
        noise_seed: NonNegativeInt = 0,
    ):
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.automatic_optimization = False
        self.rla = None
        if method in USES_RLA:
            self.rla = core.RLAAutoencoder(
                token_dim,
                tokens,
                width,
                depth,
                heads,
                latent_tokens,
                latent_dim,
                residual,
                codebook_size,
            )
        shape = (latent_tokens, latent_dim)
        if method == "rla_wm":
            self.net = core.RLAWorldModel(
                token_dim, tokens, action_dim, latent_tokens, latent_dim, width, depth, depth, heads
            )
        elif method == "rla_regression":
            self.net = RLARegressor(
                token_dim, tokens, action_dim, latent_tokens, latent_dim, width, depth, heads
            )
        elif method == "regression":
            self.net = RegressionWorldModel(token_dim, tokens, action_dim, width, 2 * depth, heads)
        elif method == "token_flow":
            self.net = TokenFlowWorldModel(token_dim, tokens, action_dim, width, 2 * depth, heads)
        else:
            self.net = None
        self.register_buffer("z_mean", torch.zeros(shape))
        self.register_buffer("z_std", torch.ones(shape))
        self.register_buffer("z_ready", torch.tensor(False))
        self.noise = torch.Generator().manual_seed(noise_seed)

    # ------------------------------------------------------------------ prediction

    @property
    def generative(self) -> bool:
        return self.hparams.method in ("rla_wm", "token_flow")

    def standardised_rla(self, x_t, x_next) -> torch.Tensor:
        return (self.rla.encode(x_t, x_next)[0] - self.z_mean) / self.z_std

    def decode_standardised(self, x_t, z) -> torch.Tensor:
        return self.rla.decode(x_t, z * self.z_std + self.z_mean)

    def predict_chunk(self, x_t, chunk, generator=None, steps: int | None = None) -> torch.Tensor:
        """One sampled (or the regressed) x_hat_{t+h} [B, L, C] per start."""
        method, steps = self.hparams.method, steps or self.hparams.sample_steps
        if method == "persistence":
            return x_t
        if method == "regression":
            return self.net(x_t, chunk)
        if method == "token_flow":
            return self.net.sample(x_t, chunk, steps, generator)
        if method == "rla_regression":
            return self.decode_standardised(x_t, self.net(x_t, chunk))
        return self.decode_standardised(x_t, self.net.sample(x_t, chunk, steps, generator))

    def setup(self, stage: str) -> None:
        """The data's token grid and action size must be the model's (a pretrained encoder or
        a real robot sets them; the stand-in's sizes are linked by the CLI)."""
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if data is None or getattr(data, "world", None) is None:
            return
        h = self.hparams
        tokens, dim = data.token_shape
        actions = data.world.train_actions.shape[-1]
        if (tokens, dim) != (h.tokens, h.token_dim) or actions != h.action_dim:
            raise ValueError(
                f"the data give {tokens} tokens of {dim} channels and {actions}-d actions, the "
                f"model expects {h.tokens} x {h.token_dim} and {h.action_dim}-d: set "
                f"--model.tokens={tokens} --model.token_dim={dim} --model.action_dim={actions}"
            )

    # ------------------------------------------------------------------ training

    def in_rla_stage(self) -> bool:
        return self.rla is not None and self.global_step < self.hparams.rla_steps

    def configure_optimizers(self):
        groups = [
            m for m in (self.rla, self.net) if m is not None and any(True for _ in m.parameters())
        ]
        return [torch.optim.AdamW(m.parameters(), lr=self.hparams.lr) for m in groups]

    @torch.no_grad()
    def fit_latent_statistics(self) -> None:
        """Per-dimension mean and std of the frozen encoder's RLA over all training pairs."""
        x_t, x_next, _ = self.trainer.datamodule.pairs()
        z = torch.cat(
            [
                self.rla.encode(x_t[i : i + 512], x_next[i : i + 512])[0]
                for i in range(0, len(x_t), 512)
            ]
        )
        self.z_mean.copy_(z.mean(0))
        self.z_std.copy_(z.std(0).clamp_min(1e-4))
        self.z_ready.fill_(True)

    def training_step(self, batch, batch_idx):
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        x_t, x_next, chunk = batch["x_t"], batch["x_next"], batch["chunk"]
        if self.net is None:  # persistence: nothing to learn; the step still counts
            self.log("train/loss", 0.0)
            return None
        if self.in_rla_stage():
            optimizer, loss = optimizers[0], self.rla.loss(x_t, x_next)
            self.log("train/rla_loss", loss, prog_bar=True)
        else:
            if self.rla is not None:
                self.rla.requires_grad_(False)
                self.rla.eval()
                if not self.z_ready:
                    self.fit_latent_statistics()
            optimizer = optimizers[-1]
            method = self.hparams.method
            if method == "rla_wm":
                with torch.no_grad():
                    z = self.standardised_rla(x_t, x_next)
                loss = self.net.loss(x_t, chunk, z, generator=self.noise)
            elif method == "rla_regression":
                with torch.no_grad():
                    z = self.standardised_rla(x_t, x_next)
                loss = self.net.loss(x_t, chunk, z)
            elif method == "token_flow":
                loss = self.net.loss(x_t, chunk, x_next, generator=self.noise)
            else:
                loss = self.net.loss(x_t, chunk, x_next)
            self.log("train/wm_loss", loss, prog_bar=True)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["flow_noise_state"] = self.noise.get_state()

    def on_load_checkpoint(self, checkpoint) -> None:
        if "flow_noise_state" in checkpoint:
            self.noise.set_state(checkpoint["flow_noise_state"])

    # ------------------------------------------------------------------ evaluation

    def _score(self, groups, prefix: str) -> None:
        generator = torch.Generator().manual_seed(self.hparams.noise_seed + 1)
        samples = self.hparams.num_samples if self.generative else 1
        predictions = predict_rollouts(self.predict_chunk, groups, samples, generator)
        scores = score_rollouts(predictions, groups.tokens[:, :, 1:], self.hparams.min_truth_spread)
        for name in ("energy_distance", "feature_l1_best", "feature_l1_mean", "collapse_ratio"):
            values = scores[name]
            if len(values):
                self.log(f"{prefix}/{name}", float(values.mean()), batch_size=len(groups))

    def validation_step(self, groups, batch_idx):
        if self.rla is not None and not self.z_ready:
            return  # the world model has not started (still in the autoencoder stage)
        self._score(groups, "val")

    def test_step(self, groups, batch_idx):
        self._score(groups, "test")
