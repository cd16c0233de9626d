"""LightningModule: joint two-representation flow matching under one time schedule.

``schedule`` picks how the lagging (texture) time follows the global time:
- ``learned``: LAS. The first ``probe_steps`` optimise f jointly with the model (corrected
  objective + speed regulariser); then the stable window is found, f is averaged over it and
  frozen, the model is reset to its initial weights (unless ``warm_start``) and the main stage
  trains with f* fixed: no schedule gradients, no extra cost per step. ``probe_steps=0`` freezes
  the start schedule at once (the zero-length-probe control). The probe's state (whether it is
  still running, its logged curves, the initial weights, its report) lives in the checkpoint, so
  a resumed run continues the probe or the main stage and never refreezes.
- ``frozen``: a given f* (``frozen_slopes``, e.g. from an earlier probe), no probe.
- ``synchronous`` (f = identity), ``power`` (f = tau^p), ``sfd`` (SFD's shifted schedule).
"""

from __future__ import annotations

import copy
import time
from typing import Literal

import torch
from jsonargparse.typing import (
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
    restricted_number_type,
)
from lightning.pytorch import LightningModule
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from async_schedule.baselines import PowerSchedule, SFDShiftedPath
from async_schedule.core import (
    ConvexSchedule,
    arclength_time_grid,
    average_schedules,
    corrected_lag_weight,
    detect_stable_window,
    guided_velocity,
    interpolate,
    joint_flow_matching_loss,
    sample_global_time,
    sample_joint_ode,
    schedule_corrected_weight,
    schedule_time_grid,
)
from async_schedule.networks import DualTimeDiT
from papers_cli import ConfigError, UserError, init_arguments

# tau^p is convex (semantics lead) only for p >= 1; p = 1 is the synchronous schedule.
PowerExponent = restricted_number_type(None, float, (">=", 1))  # unnamed: see papers-cli's README
CURVE_GRID = torch.linspace(0, 1, 101, dtype=torch.float64)


class AsyncDiffusionModule(LightningModule):
    def __init__(
        self,
        schedule: Literal["learned", "frozen", "synchronous", "power", "sfd"] = "learned",
        power_exponent: PowerExponent = 2.0,
        sfd_delta: OpenUnitInterval = 0.3,
        frozen_slopes: list[PositiveFloat] | None = None,
        corrected: bool = True,
        probe_steps: NonNegativeInt = 100,
        probe_diagnostics: bool = False,
        speed_weight: NonNegativeFloat = 0.01,
        schedule_lr: PositiveFloat = 0.05,
        schedule_bins: PositiveInt = 8,
        schedule_init: float = -3.0,
        window_lag: PositiveInt = 10,
        window_threshold: PositiveFloat = 0.1,
        window_rule: Literal["relative", "absolute"] = "relative",
        average: Literal["window", "last"] = "window",
        warm_start: bool = False,
        lead_loss_weight: NonNegativeFloat = 1.0,
        time_loc: float = 0.0,
        time_scale: PositiveFloat = 1.0,
        uniform_share: ClosedUnitInterval = 0.1,
        lag_channels: PositiveInt = 1,
        lag_size: PositiveInt = 16,
        lead_channels: PositiveInt = 8,
        lead_size: PositiveInt = 1,
        patch: PositiveInt = 4,
        width: PositiveInt = 64,
        depth: PositiveInt = 4,
        heads: PositiveInt = 4,
        num_classes: NonNegativeInt = 0,
        label_dropout: ClosedUnitInterval = 0.1,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.0,
        ema_decay: ClosedUnitInterval = 0.995,
        sample_steps: PositiveInt = 16,
        test_samples: PositiveInt = 1000,
        ode_method: Literal["euler", "heun"] = "euler",
        sample_grid: Literal["uniform", "arclength"] = "uniform",
        guidance_scale: NonNegativeFloat = 1.0,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        if schedule == "frozen" and not (
            frozen_slopes
            and len(frozen_slopes) >= 2
            and all(b > a for a, b in zip(frozen_slopes, frozen_slopes[1:], strict=False))
        ):
            raise ConfigError(
                "--model.schedule=frozen needs --model.frozen_slopes: f*'s knot slopes, at least "
                "two and strictly increasing (schedule_slopes() of a learned run prints them)"
            )
        grid = lag_size // patch
        if lag_size % patch or (lead_size != 1 and lead_size % grid):
            raise ConfigError(
                f"model.lag_size={lag_size} must be a multiple of model.patch={patch}, and "
                f"model.lead_size={lead_size} a multiple of the token grid lag_size / patch = "
                f"{grid}; change the sizes or the patch"
            )
        if width % 4 or width % heads:
            raise ConfigError(
                f"model.width={width} must be a multiple of 4 (2-D sin-cos positions) and of "
                f"model.heads={heads}; change one of them"
            )
        self.network = DualTimeDiT(
            lag_channels,
            lag_size,
            lead_channels,
            lead_size,
            patch,
            width,
            depth,
            heads,
            num_classes,
        )
        self.ema = AveragedModel(self.network, multi_avg_fn=get_ema_multi_avg_fn(ema_decay))
        self.ema.requires_grad_(False)
        self.schedule = self._build_schedule()
        self.probing = schedule == "learned" and probe_steps > 0
        self.schedule.requires_grad_(self.probing)
        # DDP leaves the schedule alone (its gradient is averaged over ranks by hand during the
        # probe, on_before_optimizer_step), so freezing it mid-run is safe under plain DDP:
        # otherwise DDP waits for a gradient the frozen schedule never produces.
        self._ddp_params_and_buffers_to_ignore = [
            f"schedule.{name}" for name, _ in self.schedule.named_parameters()
        ]
        self._initial_network = copy.deepcopy(self.network.state_dict()) if self.probing else None
        self.probe_curves: list[torch.Tensor] = []  # f on CURVE_GRID at every probe step
        self.probe_slopes: list[torch.Tensor] = []
        # per probe step, the gradient on the schedule's a_k split into its sources [3, K]
        self.probe_gradients: list[torch.Tensor] = []
        self._partial_gradients: tuple[torch.Tensor, torch.Tensor] | None = None
        self.probe_report: dict = {}
        self._probe_start = 0.0

    def _build_schedule(self) -> torch.nn.Module:
        h = self.hparams
        if h.schedule == "learned":
            return ConvexSchedule(h.schedule_bins, h.schedule_init)
        if h.schedule == "frozen":
            # float64: a fitted member's first slopes can differ in the fifth digit, which
            # float32 differences would blur (the member must stay strictly convex)
            slopes = torch.tensor(h.frozen_slopes, dtype=torch.float64)
            return ConvexSchedule.from_normalised_slopes(slopes)
        if h.schedule == "sfd":
            return SFDShiftedPath(h.sfd_delta)
        return PowerSchedule(1.0 if h.schedule == "synchronous" else h.power_exponent)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        shapes = datamodule.latent_shapes() if hasattr(datamodule, "latent_shapes") else None
        h = self.hparams
        expected = {
            "lead": (h.lead_channels, h.lead_size, h.lead_size),
            "lag": (h.lag_channels, h.lag_size, h.lag_size),
        }
        for name, shape in (shapes or {}).items():
            if shape != expected[name]:
                raise ConfigError(
                    f"the data's {name} latent is {shape} (channels, height, width) but the model "
                    f"expects {expected[name]}: set --model.{name}_channels={shape[0]} and "
                    f"--model.{name}_size={shape[1]} (or change the data)"
                )

    @property
    def main_stage_step(self) -> int:
        """Optimiser steps of the main stage (the probe's steps are not counted)."""
        offset = self.hparams.probe_steps if self.hparams.schedule == "learned" else 0
        return self.global_step - offset

    def times(self, tau: torch.Tensor):
        """(t_lead, t_lag, lag weight or None) for global times tau (Eqs. 2 and 5)."""
        density = {
            "loc": self.hparams.time_loc,
            "scale": self.hparams.time_scale,
            "uniform_share": self.hparams.uniform_share,
        }
        if isinstance(self.schedule, SFDShiftedPath):
            t_lead, t_lag = self.schedule.times(tau)
            weight = (
                schedule_corrected_weight(tau, t_lag, self.schedule.lag_speed(tau), **density)
                if self.hparams.corrected
                else None
            )
            return t_lead, t_lag, weight
        weight = (
            corrected_lag_weight(tau, self.schedule, **density) if self.hparams.corrected else None
        )
        return tau, self.schedule(tau), weight

    def training_step(self, batch, batch_idx):
        losses = self._losses(batch, drop_labels=True)
        loss = losses["loss"]
        if self.probing:
            speed = self.schedule.kinetic_excess()
            penalty = self.hparams.speed_weight * speed
            loss = loss + penalty
            self.log("schedule/speed", speed)
        elif isinstance(self.schedule, ConvexSchedule):  # the same key before and after freezing
            with torch.no_grad():
                self.log("schedule/speed", self.schedule.kinetic_excess())
        if self.probing and self.hparams.probe_diagnostics:  # a backward pass per probe step
            lag_term = losses["loss"] - self.hparams.lead_loss_weight * losses["loss_lead"]
            self._partial_gradients = tuple(  # diagnostic; the optimiser sees the total only
                torch.autograd.grad(term, self.schedule.raw_increments, retain_graph=True)[0]
                if term.requires_grad
                else torch.zeros_like(self.schedule.raw_increments)
                for term in (lag_term, penalty)
            )
        self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        losses = self._losses(batch, drop_labels=False)
        self.log("val/loss", losses["loss"], prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        losses = self._losses(batch, drop_labels=False)
        self.log("test/loss", losses["loss"], sync_dist=True)

    def on_test_epoch_end(self) -> None:
        """`train test --ckpt_path`: FD-digit, precision/recall and class coverage of
        ``test_samples`` unconditional samples against the miniature's test digits."""
        data = getattr(self.trainer, "datamodule", None)
        if getattr(data, "miniature", None) is None:
            return
        from async_schedule.evaluate import balanced_labels, class_coverage_tv, digit_quality

        evaluator = data.evaluator()
        images, labels = data.reference("test")
        n = self.hparams.test_samples
        _, texture = self.generate(
            n,
            generator=torch.Generator().manual_seed(0),
            labels=balanced_labels(n, self.hparams.num_classes, self.device),
        )
        quality = digit_quality(evaluator, texture.cpu(), images)
        quality["class_tv"] = class_coverage_tv(evaluator, texture.cpu(), labels)
        self.log_dict({f"test/{k}": float(v) for k, v in quality.items()})

    def _losses(self, batch, drop_labels: bool) -> dict[str, torch.Tensor]:
        lead, lag, labels = batch["lead"], batch["lag"], batch["label"]
        h = self.hparams
        tau = sample_global_time(
            len(lead), None, h.time_loc, h.time_scale, h.uniform_share, device=lead.device
        )
        t_lead, t_lag, weight = self.times(tau)
        x_lead, u_lead = interpolate(lead, torch.randn_like(lead), t_lead)
        x_lag, u_lag = interpolate(lag, torch.randn_like(lag), t_lag)
        if h.num_classes and drop_labels:  # CFG training: the null class for a share of labels
            drop = torch.rand(len(labels), device=labels.device) < h.label_dropout
            labels = torch.where(drop, h.num_classes, labels)
        v_lead, v_lag = self.network(
            x_lead, x_lag, t_lead, t_lag, labels if h.num_classes else None
        )
        return joint_flow_matching_loss(v_lead, v_lag, u_lead, u_lag, weight, h.lead_loss_weight)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Under DDP, average the schedule's gradient over ranks (DDP ignores it, see
        __init__). Probe diagnostic: the schedule gradient's lead / lag / speed parts. The lead
        part is the remainder, i.e. the gradient that reaches f through the semantic head."""
        if self.probing and self.trainer.world_size > 1:
            for param in self.schedule.parameters():
                if param.grad is not None:
                    param.grad = self.trainer.strategy.reduce(param.grad, reduce_op="mean")
        if self.probing and self._partial_gradients is not None:
            total = self.schedule.raw_increments.grad
            lag, speed = self._partial_gradients
            self.probe_gradients.append(torch.stack([total - lag - speed, lag, speed]).cpu())
        self._partial_gradients = None

    def on_train_start(self) -> None:
        self._probe_start = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.ema.update_parameters(self.network)
        if hasattr(self.schedule, "raw_increments"):
            with torch.no_grad():
                self.log("schedule/f_half", self.schedule(CURVE_GRID[50:51].to(self.device))[0])
        if not self.probing:
            return
        with torch.no_grad():
            self.probe_curves.append(self.schedule(CURVE_GRID.to(self.device)).cpu())
            self.probe_slopes.append(self.schedule.normalised_slopes().detach().double().cpu())
        if self.global_step >= self.hparams.probe_steps:
            self.freeze_schedule()

    def freeze_schedule(self) -> None:
        """End of the probe: Eq. 7 (stable window), Eq. 8 (average), freeze, reset the model."""
        h = self.hparams
        curves = torch.stack(self.probe_curves)
        relative = h.window_rule == "relative"
        start = detect_stable_window(curves, h.window_lag, h.window_threshold, relative=relative)
        if h.average == "last":  # ablation: the last probe iterate instead of the window mean
            start = len(curves) - 1
        averaged = average_schedules(torch.stack(self.probe_slopes[start:]))
        with torch.no_grad():
            self.schedule.raw_increments.copy_(averaged.raw_increments)
        self.schedule.requires_grad_(False)
        self.probing = False
        optimizer = self.optimizers().optimizer
        if not h.warm_start:  # fresh main model: only the schedule is reused
            self.network.load_state_dict(self._initial_network)
            for param in self.network.parameters():
                optimizer.state.pop(param, None)
            self.ema.module.load_state_dict(self._initial_network)
            self.ema.n_averaged.zero_()
        for param in self.schedule.parameters():
            optimizer.state.pop(param, None)
        with torch.no_grad():
            frozen = self.schedule(CURVE_GRID.to(self.device)).cpu()
        self._initial_network = None  # the probe is over; nothing will reset the model again
        self.probe_report = {
            "window_start": start,
            "window_length": len(curves) - start,
            "probe_steps": len(curves),
            "probe_wall_s": time.perf_counter() - self._probe_start,
            "f_half_start": float(curves[0][50]),
            "f_half_final": float(curves[-1][50]),
            "f_half_frozen": float(frozen[50]),
            "max_lag_frozen": float((CURVE_GRID - frozen).max()),
            "movement_sup": float((curves - curves[0]).abs().amax()),
            # how much f still moved over the probe's last tenth (a converged probe: ~0)
            "last_tenth_movement_sup": float(
                (curves[-1] - curves[int(0.9 * (len(curves) - 1))]).abs().max()
            ),
            "frozen_from_start_sup": float((frozen - curves[0]).abs().max()),
            "gradients": summarise_probe_gradients(self.probe_gradients),
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The probe's state, which lives outside the optimizer: without it a resumed run
        would restart the probe from the config, refreeze and reset the trained network."""
        checkpoint["las_probe"] = {
            "probing": self.probing,
            "curves": list(self.probe_curves),
            "slopes": list(self.probe_slopes),
            "gradients": list(self.probe_gradients),
            "report": self.probe_report,
            "initial_network": self._initial_network,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("las_probe")
        if state is None:  # a checkpoint without probe state (e.g. a baseline's): nothing to do
            return
        self.probing = bool(state["probing"])
        self.schedule.requires_grad_(self.probing)
        self.probe_curves = list(state["curves"])
        self.probe_slopes = list(state["slopes"])
        self.probe_gradients = list(state["gradients"])
        self.probe_report = dict(state["report"])
        self._initial_network = state["initial_network"] if self.probing else None

    @torch.no_grad()
    def schedule_curve(self) -> torch.Tensor:
        """t_lag on CURVE_GRID of global times (SFD: its path at u = (1 + D) tau) [101]."""
        grid = CURVE_GRID.to(self.device)
        if isinstance(self.schedule, SFDShiftedPath):
            return self.schedule.times(grid)[1].cpu()
        return self.schedule(grid).cpu()

    def schedule_slopes(self) -> list[float]:
        """f*'s normalised knot slopes (for ``--model.schedule=frozen``)."""
        return self.schedule.normalised_slopes().tolist()

    def time_grid(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.schedule, SFDShiftedPath):
            return self.schedule.time_grid(steps)
        if self.hparams.sample_grid == "arclength":
            return arclength_time_grid(self.schedule, steps)
        return schedule_time_grid(self.schedule, steps)

    @torch.no_grad()
    def generate(
        self,
        num_samples: int,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        labels: torch.Tensor | None = None,
        guidance_scale: float | None = None,
        guide: torch.nn.Module | None = None,
        use_ema: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint ODE sampling (Eq. 9); CFG when labels are given and guidance_scale != 1,
        AutoGuidance when a weaker ``guide`` network is given (Eq. 10)."""
        h = self.hparams
        steps = steps or h.sample_steps
        scale = h.guidance_scale if guidance_scale is None else guidance_scale
        network = self.ema.module if use_ema else self.network
        lead_times, lag_times = (t.to(self.device) for t in self.time_grid(steps))
        x_lead = torch.randn(
            num_samples, h.lead_channels, h.lead_size, h.lead_size, generator=generator
        )
        x_lag = torch.randn(
            num_samples, h.lag_channels, h.lag_size, h.lag_size, generator=generator
        )

        def velocity(a, b, t_lead, t_lag):
            good = network(a, b, t_lead, t_lag, labels)
            if scale == 1.0:
                return good
            if guide is not None:
                return guided_velocity(good, guide(a, b, t_lead, t_lag, labels), scale)
            if labels is None:
                raise UserError("classifier-free guidance needs class labels (or pass a guide)")
            return guided_velocity(good, network(a, b, t_lead, t_lag, None), scale)

        return sample_joint_ode(
            velocity,
            x_lead.to(self.device),
            x_lag.to(self.device),
            lead_times,
            lag_times,
            h.ode_method,
        )

    def configure_optimizers(self):
        groups = [{"params": list(self.network.parameters())}]
        schedule_params = list(self.schedule.parameters())
        if schedule_params:  # the schedule's own learning rate, no weight decay
            groups.append(
                {"params": schedule_params, "lr": self.hparams.schedule_lr, "weight_decay": 0.0}
            )
        return torch.optim.AdamW(groups, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def summarise_probe_gradients(gradients: list[torch.Tensor]) -> dict:
    """Per source (lead loss, corrected lag loss, speed penalty): the derivative along "more lag"
    (every a_k up by one, i.e. the sum over k; positive = gradient descent removes lag), its mean,
    its standard deviation over probe steps, and the mean gradient vector over the a_k."""
    if not gradients:
        return {}
    stacked = torch.stack(gradients).double()  # [steps, 3, K]
    toward_lag = stacked.sum(-1)  # [steps, 3]
    return {
        source: {
            "more_lag_derivative_mean": float(toward_lag[:, i].mean()),
            "more_lag_derivative_std": float(toward_lag[:, i].std(correction=0)),
            "mean_gradient": stacked[:, i].mean(0).tolist(),
        }
        for i, source in enumerate(("lead", "lag", "speed"))
    }
