"""LightningModule wiring PermFlow and the Sinkhorn baselines to the shared networks."""

from typing import Literal

import lightning as L
import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt

from papers_cli import ConfigError
from permflow import baselines, core
from permflow.data import PermutationSize, Task
from permflow.evaluate import permutation_metrics
from permflow.networks import AxialNet, SortingNet


class PermutationModel(L.LightningModule):
    """One module for every method; only the objective and the sampler differ.

    method: ``permflow`` (flow matching, Eq. 4-9 of core; ``prediction`` picks the velocity or
    an endpoint parameterisation of the same field: linear with the projected MSE, or row-softmax
    with cross-entropy), ``sinkhorn`` (deterministic Sinkhorn
    network) or ``gumbel_sinkhorn``. decode (baselines only): ``noiseless`` Hungarian(L) or
    ``noisy`` Hungarian(L + g) per sample.
    """

    def __init__(
        self,
        task: Task = "sorting",
        method: Literal["permflow", "sinkhorn", "gumbel_sinkhorn"] = "permflow",
        n: PermutationSize = 5,
        width: PositiveInt = 64,
        depth: PositiveInt = 2,
        heads: PositiveInt = 4,
        image_dim: PositiveInt = 64,
        channels: tuple[PositiveInt, ...] = (16, 32),
        sigma: PositiveFloat = 1.0,
        coupling: Literal["nearest", "independent"] = "nearest",
        project: bool = True,
        prediction: Literal["velocity", "endpoint", "endpoint_softmax"] = "velocity",
        time_sampling: Literal["uniform", "logit_normal", "early"] = "uniform",
        sampler: Literal["euler", "heun"] = "euler",
        steps: PositiveInt = 20,
        sinkhorn_tau: PositiveFloat = 1.0,
        sinkhorn_iters: PositiveInt = 20,
        sinkhorn_loss: Literal["mse", "ce"] = "mse",
        gumbel_noise: NonNegativeFloat = 1.0,
        decode: Literal["noiseless", "noisy"] = "noiseless",
        num_samples: PositiveInt = 16,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 1e-4,
    ):
        super().__init__()
        if width % heads:
            raise ConfigError(
                f"model.width={width} must be a multiple of model.heads={heads} (each attention "
                "head gets width / heads channels); change one of them"
            )
        self.save_hyperparameters()
        flow = method == "permflow"
        if task == "sorting":
            self.net = SortingNet(n, flow, width, depth, heads, image_dim, channels=channels)
        else:
            self.net = AxialNet(flow, width, depth, heads)
        self._val_outputs: list[tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]] = []

    # ------------------------------------------------------------------ shared pieces

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        hp = getattr(datamodule, "hparams", {})
        for key in ("n", "task"):
            if key in hp and hp[key] != self.hparams[key]:
                raise ConfigError(
                    f"data.{key}={hp[key]!r} but model.{key}={self.hparams[key]!r}; "
                    f"set both to the same value"
                )

    def check_condition(self, condition: torch.Tensor) -> None:
        """Catch shape mismatches between a batch and the model with an actionable message."""
        n = self.hparams.n
        if self.hparams.task == "slap":
            if condition.shape[-1] != condition.shape[-2]:
                raise ValueError(f"cost matrices must be square, got {tuple(condition.shape)}")
            if not torch.isfinite(condition).all():
                raise ValueError("cost matrix contains NaN or inf")
        if condition.shape[1] != n:
            raise ValueError(f"batch has n={condition.shape[1]} items but model.n={n}")

    def features(self, condition: torch.Tensor) -> torch.Tensor:
        """Per-input features computed once and reused across ODE steps."""
        self.check_condition(condition)
        if self.hparams.task == "sorting":
            return self.net.encode_items(condition)  # [B, n, image_dim]
        return condition  # [B, n, n]

    def sample_time(self, batch_size: int) -> torch.Tensor:
        if self.hparams.time_sampling == "logit_normal":
            return torch.sigmoid(torch.randn(batch_size, device=self.device))
        if self.hparams.time_sampling == "early":  # density 1/(2 sqrt t): the input is most
            return torch.rand(batch_size, device=self.device) ** 2  # informative at small t
        return torch.rand(batch_size, device=self.device)

    # ------------------------------------------------------------------ objectives

    def training_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hp = self.hparams
        targets = core.permutation_matrices(batch["optima"])  # [B, K, n, n]
        num_valid = batch["num_valid"]
        feats = self.features(batch["condition"])
        b = targets.shape[0]
        if hp.method == "permflow":
            x0 = core.sample_base(b, hp.n, hp.sigma, device=self.device)  # [B, n, n]
            if hp.coupling == "nearest":
                x1, _ = core.nearest_target_coupling(x0, targets, num_valid)
            else:
                x1, _ = core.independent_coupling(targets, num_valid)
            t = self.sample_time(b)
            output = self.net(feats, core.interpolate(x0, x1, t), t).float()
            if hp.prediction == "endpoint":
                return core.endpoint_loss(output, x1, project=hp.project)
            if hp.prediction == "endpoint_softmax":
                return core.endpoint_cross_entropy(output, x1)
            return core.cfm_loss(output, x0, x1, project=hp.project)
        # Baselines see one valid permutation, drawn uniformly: the single label of a sample.
        label, _ = core.independent_coupling(targets, num_valid)
        logits = self.net(feats).float()
        if hp.method == "gumbel_sinkhorn":
            log_s = baselines.gumbel_sinkhorn(
                logits, hp.sinkhorn_tau, hp.sinkhorn_iters, hp.gumbel_noise
            )
        else:
            log_s = baselines.log_sinkhorn(logits, hp.sinkhorn_tau, hp.sinkhorn_iters)
        return baselines.sinkhorn_loss(log_s, label, hp.sinkhorn_loss)

    def training_step(self, batch, batch_idx):
        loss = self.training_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["num_valid"]))
        return loss

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def sample_permutations(
        self,
        batch: dict[str, torch.Tensor],
        num_samples: int,
        generator: torch.Generator | None = None,
        steps: int | None = None,
        sampler: str | None = None,
        project: bool | None = None,
        decode: str | None = None,
    ) -> tuple[np.ndarray, torch.Tensor]:
        """m permutations per input -> (perms [B, m, n], violation [B] of the continuous output)."""
        hp = self.hparams
        feats = self.features(batch["condition"])
        b, n = feats.shape[0], hp.n
        if hp.method == "permflow":
            repeated = feats.repeat_interleave(num_samples, dim=0)  # [B*m, ...]
            x0 = core.sample_base(b * num_samples, n, hp.sigma, generator, self.device)

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                output = self.net(repeated, x, t).to(x.dtype)
                if hp.prediction == "endpoint":
                    return core.velocity_from_endpoint(output, x, t)
                if hp.prediction == "endpoint_softmax":
                    return core.velocity_from_endpoint(output.softmax(dim=-1), x, t)
                return output

            x1 = core.integrate(
                velocity,
                x0,
                steps=steps or hp.steps,
                method=sampler or hp.sampler,
                project=hp.project if project is None else project,
            )  # [B*m, n, n]
            perms = core.hungarian_decode(x1).reshape(b, num_samples, n)
            return perms, core.constraint_violation(x1).view(b, num_samples).amax(1)
        logits = self.net(feats).float()  # [B, n, n]
        soft = baselines.log_sinkhorn(logits, hp.sinkhorn_tau, hp.sinkhorn_iters).exp()
        if (decode or hp.decode) == "noisy":
            perms = baselines.decode_noisy(logits, num_samples, hp.gumbel_noise, generator)
        else:
            perms = baselines.decode_noiseless(logits, num_samples)
        return perms, core.constraint_violation(soft)

    # ------------------------------------------------------------------ validation

    def validation_step(self, batch, batch_idx):
        generator = torch.Generator().manual_seed(batch_idx)
        perms, violation = self.sample_permutations(batch, self.hparams.num_samples, generator)
        self._val_outputs.append(
            (perms, batch["optima"].cpu().numpy(), batch["num_valid"].cpu().numpy(), violation)
        )

    def on_validation_epoch_end(self) -> None:
        if not self._val_outputs:
            return
        perms, optima, num_valid, violation = zip(*self._val_outputs, strict=True)
        self._val_outputs.clear()
        metrics = permutation_metrics(
            np.concatenate(perms), np.concatenate(optima), np.concatenate(num_valid)
        )
        metrics["violation"] = float(torch.cat(violation).max())
        for key in (
            "unambiguous_accuracy",
            "valid_rate",
            "both_modes",
            "mode_balance",
            "violation",
        ):
            if key in metrics:
                self.log(f"val/{key}", metrics[key], sync_dist=True, prog_bar=key == "both_modes")

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        total_steps = max(int(self.trainer.estimated_stepping_batches), 1)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
