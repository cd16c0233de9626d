"""LightningModule: TC-WM and the models compared with it, one class, wiring only.

``representation`` picks the state space the dynamics and the planner work in:

- ``tcwm`` (the method): z = W e per patch (``projection``: learned, or the ablations' random /
  PCA maps), the first ``aligned_dims`` channels aligned with the state by InfoNCE
  (``align_weight``; 0 is the no-alignment ablation, ``align_shuffle`` the negative control that
  aligns against shuffled states), the embedding reconstructed from z (``recon_weight``; 0 is the
  no-reconstruction ablation), dynamics in z; eq. 1 of ``tcwm.core``;
- ``embedding`` (DINO-WM): dynamics and planning cost on the full frozen patch embeddings, with
  proprio tokens (``proprio_weight`` > 0: the state enters and leaves as one token, as DINO-WM's
  proprio encoder);
- ``pldm`` (the PLDM-style baseline, Sobal et al. 2025): its own encoder learned from the raw
  observation (``ObservationEncoder``, an MLP over the whole frame's tokens, no frozen features
  in the cost), trained jointly with the dynamics by prediction without a stop-gradient, VICReg's
  variance and covariance terms, temporal smoothness and an inverse-dynamics head; the planner's
  cost is the full learned latent;
- ``state`` (the positive control, an oracle): dynamics on the true state, the same planner.

``dynamics="persistence"`` (a negative control) copies the latent forward: no learned dynamics.
"""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from torch import nn

from papers_cli import ConfigError
from papers_cli.hparams import init_arguments
from tcwm.core import (
    LinearProjection,
    ObservationEncoder,
    Predictor,
    StatePredictor,
    aligned_summary,
    dynamics_loss,
    info_nce,
    inverse_dynamics_loss,
    latent_cost,
    reconstruction_loss,
    temporal_smoothness,
    vc_regularizer,
)


class TcwmModule(LightningModule):
    """A world model over frozen embeddings (or states) trained on reward-free windows."""

    def __init__(
        self,
        embed_dim: PositiveInt = 384,
        n_tokens: PositiveInt = 1,
        state_dim: PositiveInt = 2,
        align_dim: PositiveInt = 2,
        action_dim: PositiveInt = 2,
        history: PositiveInt = 1,
        representation: Literal["tcwm", "embedding", "pldm", "state"] = "tcwm",
        latent_dim: PositiveInt = 16,
        aligned_dims: PositiveInt = 2,
        projection: Literal["learned", "random", "pca"] = "learned",
        align_weight: NonNegativeFloat = 1.0,
        recon_weight: NonNegativeFloat = 1.0,
        temperature: PositiveFloat = 0.1,
        critic: Literal["neg_sq_dist", "dot"] = "neg_sq_dist",
        align_shuffle: bool = False,
        stop_gradient: bool = True,
        dynamics: Literal["learned", "persistence"] = "learned",
        proprio_weight: NonNegativeFloat = 0.0,
        context_weight: NonNegativeFloat = 0.0,
        state_cost_dims: PositiveInt = 2,
        variance_weight: NonNegativeFloat = 1.0,
        covariance_weight: NonNegativeFloat = 1.0,
        temporal_weight: NonNegativeFloat = 0.1,
        inverse_dynamics_weight: NonNegativeFloat = 1.0,
        width: PositiveInt = 64,
        layers: PositiveInt = 2,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 1e-4,
        shuffle_seed: NonNegativeInt = 0,
        plan_pairs: NonNegativeInt = 10,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline (papers_cli.hparams; builtin types for weights_only checkpoints).
        self.save_hyperparameters(init_arguments(locals()))
        if representation == "tcwm":
            if latent_dim > embed_dim:
                raise ConfigError(
                    f"model.latent_dim={latent_dim} exceeds the embedding width {embed_dim}"
                )
            if aligned_dims > latent_dim:
                raise ConfigError(
                    f"model.aligned_dims={aligned_dims} exceeds model.latent_dim={latent_dim}: "
                    "the aligned subspace is part of the latent"
                )
            self.projection = LinearProjection(embed_dim, latent_dim, projection)
            self.decoder = nn.Linear(latent_dim, embed_dim)  # R: linear [G]
            self.state_encoder = nn.Linear(align_dim, aligned_dims)  # g: linear critic map [R]
            dim = latent_dim
        elif representation == "pldm":
            self.observation_encoder = ObservationEncoder(n_tokens, embed_dim, latent_dim, width)
            self.inverse_dynamics = nn.Sequential(  # PLDM's inverse-dynamics head [G: sizes]
                nn.Linear(2 * latent_dim, width), nn.GELU(), nn.Linear(width, action_dim)
            )
            dim, n_tokens = latent_dim, 1  # one learned token per frame
        else:
            dim = embed_dim
        proprio = state_dim if representation == "embedding" and proprio_weight > 0 else 0
        if representation == "state":
            self.predictor = StatePredictor(state_dim, action_dim, history, width)
        else:
            self.predictor = Predictor(
                dim, n_tokens, action_dim, history, width, layers, proprio_dim=proprio
            )
        self.shuffle = torch.Generator().manual_seed(shuffle_seed)

    # ------------------------------------------------------------------ the model's spaces
    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Frozen tokens [..., P, D] -> the latent the dynamics run in."""
        if self.hparams.representation == "tcwm":
            return self.projection(tokens)
        if self.hparams.representation == "pldm":
            return self.observation_encoder(tokens)
        return tokens

    def observation(self, tokens, states):
        """The model's state of one observation: (latent, proprio) for the embedding models,
        the true state for the oracle."""
        if self.hparams.representation == "state":
            return states, None
        proprio = (
            states
            if self.hparams.proprio_weight and self.hparams.representation == "embedding"
            else None
        )
        return self.encode(tokens), proprio

    def step(self, hist, action, proprio_hist=None):
        """One step of the dynamics from ``hist`` [B, h, ...] and action [B, A]."""
        if self.hparams.dynamics == "persistence":
            return hist[:, -1], None if proprio_hist is None else proprio_hist[:, -1]
        if self.hparams.representation == "state":
            return self.predictor(hist, action), None
        return self.predictor(hist, action, proprio_hist)

    def rollout(self, hist, actions, proprio_hist=None):
        """Open-loop predictions for an action sequence [B, H, A]: a list of H (latent, proprio)."""
        out = []
        for k in range(actions.shape[1]):
            latent, proprio = self.step(hist, actions[:, k], proprio_hist)
            out.append((latent, proprio))
            hist = torch.cat([hist[:, 1:], latent[:, None]], 1)
            if proprio_hist is not None:
                proprio_hist = torch.cat([proprio_hist[:, 1:], proprio[:, None]], 1)
        return out

    def plan_cost(self, latent, goal, proprio=None, goal_proprio=None) -> torch.Tensor:
        """Planning cost of predicted final latents [N, ...] against the goal's."""
        h = self.hparams
        if h.representation == "state":
            dims = h.state_cost_dims
            return (latent[..., :dims] - goal[..., :dims]).pow(2).sum(-1)
        if h.representation == "tcwm":
            return latent_cost(latent, goal, h.aligned_dims, h.context_weight)
        cost = latent_cost(latent, goal)
        if proprio is not None:
            cost = cost + h.proprio_weight * (proprio - goal_proprio).pow(2).mean(-1)
        return cost

    # ------------------------------------------------------------------ training
    def losses(self, batch) -> dict[str, torch.Tensor]:
        """Eq. 1's terms on a batch of windows (tokens [B, h+1, P, D], ...)."""
        h = self.hparams
        n = h.history
        action = batch["actions"][:, n - 1]  # a_t moves frame t (the last history frame) to t+1
        states = batch["states"]
        if h.representation == "state":
            predicted = self.predictor(states[:, :n], action)
            return {"dyn": dynamics_loss(predicted, states[:, n])}
        tokens = batch["tokens"]
        z = self.encode(tokens)
        if h.representation == "pldm":
            return self.pldm_losses(z, action)
        proprio_hist = states[:, :n] if self.predictor.proprio_dim else None
        predicted, proprio = self.predictor(z[:, :n], action, proprio_hist)
        terms = {"dyn": dynamics_loss(predicted, z[:, n], h.stop_gradient)}
        if proprio is not None:
            terms["proprio"] = h.proprio_weight * dynamics_loss(proprio, states[:, n])
        if h.representation == "tcwm":
            if h.align_weight > 0:
                u = aligned_summary(z.flatten(0, 1), h.aligned_dims)
                aligned = batch["aligned"].flatten(0, 1)
                if h.align_shuffle:  # the negative control: states of other frames
                    aligned = aligned[torch.randperm(len(aligned), generator=self.shuffle)]
                v = self.state_encoder(aligned)
                terms["nce"] = h.align_weight * info_nce(u, v, h.temperature, h.critic)
            if h.recon_weight > 0:
                terms["rec"] = h.recon_weight * reconstruction_loss(self.decoder(z), tokens)
        return terms

    def pldm_losses(self, z: torch.Tensor, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """The PLDM baseline's objective on learned latents z [B, h+1, 1, d]: prediction through
        the target (no stop-gradient: VICReg's terms keep the latent from collapsing), variance
        and covariance over every frame, temporal smoothness and inverse dynamics of a_t;
        weights [G]."""
        h = self.hparams
        n = h.history
        predicted, _ = self.predictor(z[:, :n], action)
        variance, covariance = vc_regularizer(z.flatten(0, 1).flatten(1))
        return {
            "dyn": dynamics_loss(predicted, z[:, n], stop_gradient=False),
            "var": h.variance_weight * variance,
            "cov": h.covariance_weight * covariance,
            "time": h.temporal_weight * temporal_smoothness(z),
            "idm": h.inverse_dynamics_weight
            * inverse_dynamics_loss(
                self.inverse_dynamics, z[:, n - 1].flatten(1), z[:, n].flatten(1), action
            ),
        }

    def training_step(self, batch, batch_idx):
        terms = self.losses(batch)
        loss = sum(terms.values())
        for name, value in terms.items():
            self.log(f"train/{name}", value)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        terms = self.losses(batch)
        for name, value in terms.items():
            self.log(f"val/{name}", value, sync_dist=True)
        self.log("val/loss", sum(terms.values()), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        """Losses on the test windows (planning and probes: ``on_test_epoch_end``)."""
        for name, value in self.losses(batch).items():
            self.log(f"test/{name}", value, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        """The paper's scores on the test episodes (``uv run train test --ckpt_path PATH``):
        open-loop probe R^2 at horizons 1-5, TC-WM's identifiability, and CEM planning success
        on ``plan_pairs`` seeded start/goal pairs in the miniature's simulator."""
        from tcwm.data import world_for
        from tcwm.evaluate import (
            PlanBudget,
            identifiability,
            open_loop_probe,
            plan_to_goal,
            start_goal_pairs,
        )

        data = self.trainer.datamodule
        arrays, episodes = data.arrays, data.episodes
        was_training = self.training
        self.eval()
        scores = open_loop_probe(self, arrays, episodes["train"], episodes["test"])
        for k, score in enumerate(scores, 1):
            self.log(f"test/probe_r2_h{k}", score)
        if self.hparams.representation == "tcwm":
            for name, value in identifiability(
                self, arrays, episodes["train"], episodes["test"]
            ).items():
                self.log(f"test/{name}", value)
        if self.hparams.plan_pairs and data.hparams.source in ("synthetic", "pointmaze", "reacher"):
            world, budget = world_for(data.hparams), PlanBudget()
            pairs = start_goal_pairs(
                world, self.hparams.plan_pairs, data.hparams.kappa, budget.goal_offset, seed=10_000
            )
            runs = [plan_to_goal(self, world, p, budget, seed=i) for i, p in enumerate(pairs)]
            world.close()
            self.log("test/success", sum(r["success"] for r in runs) / len(runs))
            self.log("test/final_distance", sum(r["final_distance"] for r in runs) / len(runs))
        self.train(was_training)

    def on_fit_start(self) -> None:
        """The PCA ablation fixes W to the training embeddings' top principal directions."""
        if self.hparams.representation == "tcwm" and self.hparams.projection == "pca":
            data = self.trainer.datamodule
            tokens = data.arrays["tokens"][data.episodes["train"]]
            self.projection.set_pca(tokens.reshape(-1, tokens.shape[-1]).to(self.device))

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]  # not the fixed W
        return torch.optim.AdamW(
            trainable, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
