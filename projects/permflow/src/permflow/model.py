"""LightningModule wiring PermFlow and the Sinkhorn baselines to the shared networks."""

import math
from typing import Literal

import lightning as L
import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt

from papers_cli import ConfigError, init_arguments
from permflow import baselines, core
from permflow.data import PermutationSize, Task
from permflow.evaluate import LOGGED_METRICS, permutation_metrics
from permflow.networks import AxialNet, SortingNet


class PermutationModel(L.LightningModule):
    """One module for every method; only the objective and the sampler differ.

    The constructor's defaults are those of ``configs/default.yaml`` (a test checks it), so a
    model built in code is the model ``uv run train`` trains.

    method: ``permflow`` (flow matching, Eq. 4-9 of core; ``prediction`` picks the velocity or
    an endpoint parameterisation of the same field: linear with the projected MSE, or row-softmax
    with cross-entropy), ``sinkhorn`` (deterministic Sinkhorn network) or ``gumbel_sinkhorn``
    (Gumbel noise in training, its temperature annealed geometrically from ``sinkhorn_tau`` to
    ``gumbel_tau_final``). ``project``: under ``velocity`` and ``endpoint`` it drops the projector
    from the loss and the sampler; under ``endpoint_softmax`` the loss has no projector to drop,
    so it changes the sampler only. ``gumbel_noise`` scales the Gumbel noise of training.
    ``endpoint_temperature`` (sampling only, ``endpoint_softmax``): the sampler's endpoint is
    softmax(logits / temperature) row-wise; below 1 it sharpens the endpoint towards a vertex,
    an option against the Euler chain drifting off the vertex-bound segments training sees
    (issue 50; 1 is the trained field as is).
    decode (baselines only): ``noiseless`` Hungarian(L) or ``noisy`` Hungarian(L +
    decode_noise * g) per sample.
    """

    def __init__(
        self,
        task: Task = "sorting",
        method: Literal["permflow", "sinkhorn", "gumbel_sinkhorn"] = "permflow",
        n: PermutationSize = 5,
        width: PositiveInt = 32,
        depth: PositiveInt = 2,
        grid_depth: PositiveInt = 1,
        heads: PositiveInt = 4,
        image_dim: PositiveInt = 64,
        channels: tuple[PositiveInt, ...] = (16, 32),
        digits: PositiveInt = 1,
        sigma: PositiveFloat = 0.45,
        coupling: Literal["nearest", "independent"] = "nearest",
        project: bool = True,
        prediction: Literal["velocity", "endpoint", "endpoint_softmax"] = "endpoint_softmax",
        time_sampling: Literal["uniform", "logit_normal", "early"] = "early",
        sampler: Literal["euler", "heun"] = "euler",
        steps: PositiveInt = 20,
        endpoint_temperature: PositiveFloat = 1.0,
        sinkhorn_tau: PositiveFloat = 1.0,
        sinkhorn_iters: PositiveInt = 20,
        sinkhorn_loss: Literal["mse", "ce"] = "mse",
        gumbel_noise: NonNegativeFloat = 1.0,
        gumbel_tau_final: PositiveFloat = 0.3,
        decode: Literal["noiseless", "noisy"] = "noiseless",
        decode_noise: NonNegativeFloat = 1.0,
        num_samples: PositiveInt = 16,
        lr: PositiveFloat = 1e-3,
        lr_decay_steps: PositiveInt = 1500,
        weight_decay: NonNegativeFloat = 1e-4,
    ):
        super().__init__()
        if width % heads:
            raise ConfigError(
                f"model.width={width} must be a multiple of model.heads={heads} (each attention "
                "head gets width / heads channels); change one of them"
            )
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        flow = method == "permflow"
        if task == "sorting":
            self.net = SortingNet(
                n,
                flow,
                width,
                depth,
                heads,
                image_dim,
                channels=channels,
                digits=digits,
                grid_depth=grid_depth,
            )
        else:
            self.net = AxialNet(flow, width, depth, heads)
        self._eval_outputs: list[dict[str, np.ndarray]] = []

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

    def draw_training_noise(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x0 ~ Eq. (4) and t for one training batch, from the global generators.

        Those generators are re-seeded before every batch from (run seed, rank, epoch, batch)
        by papers_gpu's SeedEveryStep (added to every fit by papers_cli), so under DDP each rank
        draws its own x0 and t, and a resumed run draws what the uninterrupted run drew.
        """
        x0 = core.sample_base(batch_size, self.hparams.n, self.hparams.sigma, device=self.device)
        u = torch.rand(batch_size).to(self.device)
        if self.hparams.time_sampling == "logit_normal":
            t = torch.sigmoid(torch.randn(batch_size)).to(self.device)
        elif self.hparams.time_sampling == "early":  # density 1/(2 sqrt t): the input is most
            t = u**2  # informative at small t
        else:
            t = u
        return x0, t

    def gumbel_tau(self) -> float:
        """Gumbel-Sinkhorn's training temperature, annealed geometrically over the run."""
        hp = self.hparams
        trainer = self._trainer
        if trainer is None or not trainer.max_steps or trainer.max_steps < 0:
            return hp.sinkhorn_tau
        progress = min(trainer.global_step / trainer.max_steps, 1.0)
        return hp.sinkhorn_tau * (hp.gumbel_tau_final / hp.sinkhorn_tau) ** progress

    # ------------------------------------------------------------------ objectives

    def training_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hp = self.hparams
        targets = core.permutation_matrices(batch["optima"])  # [B, K, n, n]
        num_valid = batch["num_valid"]
        feats = self.features(batch["condition"])
        b = targets.shape[0]
        if hp.method == "permflow":
            x0, t = self.draw_training_noise(b)  # [B, n, n], [B]
            if hp.coupling == "nearest":
                x1, _ = core.nearest_target_coupling(x0, targets, num_valid)
            else:
                x1, _ = core.independent_coupling(targets, num_valid)
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
                logits, self.gumbel_tau(), hp.sinkhorn_iters, hp.gumbel_noise
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
        decode_noise: float | None = None,
        oracle: bool = False,
        temperature: float | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """m permutations per input -> (perms [B, m, n], per-input diagnostics).

        Diagnostics: ``violation`` and ``negative_mass`` [B] of the continuous outputs (largest
        over the samples); flows add ``nearest`` [B, m], the slot of each x0's nearest valid
        target (the coupling's choice), baselines ``violation_200`` [B] (Sinkhorn run to 200
        iterations). ``oracle=True`` integrates the exact posterior endpoint field, Eq. (12) of
        core, with the same base, sampler and decode (the positive control; it reads V(c) from
        the batch). ``temperature`` overrides ``endpoint_temperature``.
        """
        hp = self.hparams
        temperature = hp.endpoint_temperature if temperature is None else temperature
        feats = self.features(batch["condition"])
        b, n = feats.shape[0], hp.n
        if hp.method == "permflow" or oracle:
            x0 = core.sample_base(b * num_samples, n, hp.sigma, generator, self.device)
            targets = core.permutation_matrices(batch["optima"]).to(x0.dtype)  # [B, K, n, n]
            targets = targets.repeat_interleave(num_samples, dim=0)  # [B*m, K, n, n]
            num_valid = batch["num_valid"].repeat_interleave(num_samples, dim=0)
            _, nearest = core.nearest_target_coupling(x0, targets, num_valid)
            repeated = None if oracle else feats.repeat_interleave(num_samples, dim=0)

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                if oracle:
                    endpoint = core.posterior_endpoint(x, t, targets, num_valid, hp.sigma)
                    return core.velocity_from_endpoint(endpoint, x, t)
                output = self.net(repeated, x, t).to(x.dtype)
                if hp.prediction == "endpoint":
                    return core.velocity_from_endpoint(output, x, t)
                if hp.prediction == "endpoint_softmax":
                    endpoint = (output / temperature).softmax(dim=-1)
                    return core.velocity_from_endpoint(endpoint, x, t)
                return output

            x1 = core.integrate(
                velocity,
                x0,
                steps=steps or hp.steps,
                method=sampler or hp.sampler,
                project=hp.project if project is None else project,
            )  # [B*m, n, n]
            perms = core.hungarian_decode(x1).reshape(b, num_samples, n)
            stats = {
                "violation": core.constraint_violation(x1).view(b, num_samples).amax(1),
                "negative_mass": core.negative_mass(x1).view(b, num_samples).amax(1),
                "nearest": nearest.view(b, num_samples),
            }
            return perms, {k: v.cpu().numpy() for k, v in stats.items()}
        logits = self.net(feats).float()  # [B, n, n]
        soft = baselines.log_sinkhorn(logits, hp.sinkhorn_tau, hp.sinkhorn_iters).exp()
        converged = baselines.log_sinkhorn(logits, hp.sinkhorn_tau, 200).exp()
        if (decode or hp.decode) == "noisy":
            noise = hp.decode_noise if decode_noise is None else decode_noise
            perms = baselines.decode_noisy(logits, num_samples, noise, generator)
        else:
            perms = baselines.decode_noiseless(logits, num_samples)
        stats = {
            "violation": core.constraint_violation(soft),
            "violation_200": core.constraint_violation(converged),
            "negative_mass": core.negative_mass(soft),
        }
        return perms, {k: v.cpu().numpy() for k, v in stats.items()}

    # ------------------------------------------------------------------ validation and test

    def _sample_for_metrics(self, batch, batch_idx: int) -> None:
        generator = torch.Generator().manual_seed(batch_idx)
        perms, stats = self.sample_permutations(batch, self.hparams.num_samples, generator)
        self._eval_outputs.append(
            {
                "samples": perms,
                "optima": batch["optima"].cpu().numpy(),
                "num_valid": batch["num_valid"].cpu().numpy(),
                **stats,
            }
        )

    def _log_metrics(self, prefix: str) -> None:
        if not self._eval_outputs:
            return
        outputs = {
            k: np.concatenate([o[k] for o in self._eval_outputs]) for k in self._eval_outputs[0]
        }
        self._eval_outputs.clear()
        metrics = permutation_metrics(**outputs)
        for key in LOGGED_METRICS:
            if key in metrics and len(metrics[key]):  # mode_balance may have no inputs
                value = float(np.mean(metrics[key]))
                self.log(f"{prefix}/{key}", value, sync_dist=True, prog_bar=key == "both_modes")

    def validation_step(self, batch, batch_idx):
        self._sample_for_metrics(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def test_step(self, batch, batch_idx):
        """``uv run train test --ckpt_path ...``: the claim's metrics on the test split."""
        self._sample_for_metrics(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def configure_optimizers(self):
        """AdamW with a cosine decay of the learning rate to 0 over ``lr_decay_steps``, then flat.

        The length is a hyper-parameter rather than the trainer's step budget, so that a run
        stopped early and resumed follows the uninterrupted run's schedule exactly.
        """
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        decay_steps = self.hparams.lr_decay_steps

        def factor(step: int) -> float:
            return 0.5 * (1 + math.cos(math.pi * min(step / decay_steps, 1.0)))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
