"""LightningModule: orchestration of the fit (the statistics live in core/fitting/transfer).

The module's parameters ARE the hazard parameters (theta, phi, and the target shift gamma); no
neural network is involved. One training epoch = one MCEM iteration on the source cohort (E-step
draws, then the two warm-started weighted M-step fits, Eq. Q of fitting.py) with M_k growing per
epoch; the stopping rule ends ``fit`` early. ``method: direct`` instead runs the direct ML fit
(then later epochs change nothing and the rule stops at once). Each validation fits the target's
shift gamma (transfer stage 2, Eq. T1) and logs the timely risk and the expected IBNR count.

Under DDP every process holds a shard of the subjects; the objective and its gradient inside
each L-BFGS step are all-reduced, so the processes take identical steps on the full-data
likelihood, and each draws its own shard's E-step samples (the shared ``SeedEveryStep`` seeds
every step from (seed, rank, epoch, batch); the E-step's generator is seeded from it).

Persistence: there is no optimizer step (L-BFGS runs inside the M-steps), so Lightning's
``ModelCheckpoint`` never fires; papers-cli's ``FitEndCheckpoint`` writes ``last.ckpt`` at the
end of the fit, and the MCEM state that lives outside the parameters (the current iterate, the
iterates being averaged, the stopping counter) is saved in it, so a resumed fit continues
exactly. At the end of every fit rank 0 also writes ``fitted_params.json`` and the per-policy
``timely_risk.csv`` (persist.py) into the run folder. ``train test --ckpt_path last.ckpt``
evaluates the saved parameters on the target (no refit): ``test/timely_risk``, ``test/ibnr``
and, for simulated data, ``test/risk_error``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt, restricted_number_type
from lightning.pytorch import LightningModule
from torch import nn

from papers_cli import ConfigError, init_arguments
from survival_delay.core import JointModel
from survival_delay.fitting import (
    MCEMSchedule,
    default_start,
    fit_direct,
    mcem_iteration,
)
from survival_delay.hazards import DelayFamily, EventFamily
from survival_delay.persist import save_fit

# M_k = start_draws * growth^k must not shrink from one MCEM iteration to the next.
Growth = restricted_number_type(None, float, (">=", 1))  # unnamed: see papers-cli's README


class JointHazardModule(LightningModule):
    def __init__(
        self,
        n_features: NonNegativeInt = 1,
        event_family: EventFamily = "weibull",
        delay_family: DelayFamily = "weibull",
        delay_covariates: bool = False,
        cuts: list[PositiveFloat] | None = None,
        quad_nodes: PositiveInt = 32,
        method: Literal["mcem", "direct"] = "mcem",
        start_draws: PositiveInt = 20,
        max_draws: PositiveInt = 500,
        growth: Growth = 1.5,
        tol: PositiveFloat = 5e-3,
        patience: PositiveInt = 3,
        average_last: PositiveInt = 5,
        m_step_iter: PositiveInt = 50,
        horizon: PositiveFloat = 1.0,
        gamma_prior_sd: PositiveFloat | None = 1.0,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        if start_draws > max_draws:
            raise ConfigError(
                f"model.start_draws={start_draws} exceeds model.max_draws={max_draws}; the Monte "
                "Carlo sample grows from start_draws up to max_draws, so raise max_draws or lower "
                "start_draws"
            )
        if cuts and event_family != "piecewise":
            raise ConfigError(
                f"model.cuts are the pieces of the piecewise event hazard, but event_family="
                f"{event_family!r}; drop the cuts or set --model.event_family=piecewise"
            )
        if cuts and any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)):
            raise ConfigError(f"model.cuts={cuts} must be strictly increasing times (years)")
        self.automatic_optimization = False
        self.joint = JointModel.build(
            n_features,
            event_family,
            delay_family,
            delay_covariates,
            tuple(cuts or ()) or None,
            quad_nodes,
        )
        self.schedule = MCEMSchedule(
            start_draws, max_draws, growth, 10**9, tol, patience, average_last, m_step_iter
        )
        self.theta = nn.Parameter(self.joint.event.init_params(1.0))
        self.phi = nn.Parameter(self.joint.delay.init_params(0.1))
        self.gamma = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        self._chain: dict | None = None
        self._history: list[dict] = []
        self._calm = 0

    def _reduce(self, value: torch.Tensor) -> torch.Tensor:
        return self.trainer.strategy.reduce(value, reduce_op="mean")

    def blocks(self) -> dict[str, torch.Tensor]:
        return {"theta": self.theta.data, "phi": self.phi.data, "gamma": self.gamma.data}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["mcem_state"] = {
            "chain": self._chain,
            "history": self._history,
            "calm": self._calm,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("mcem_state")
        if state is not None:
            self._chain, self._history, self._calm = state["chain"], state["history"], state["calm"]

    def training_step(self, batch, batch_idx):
        source = batch["source"]
        if self._chain is None:  # identical start on every process: mean of the shards' starts
            start = default_start(self.joint, source)
            self._chain = {k: self._reduce(v) for k, v in start.items()}
        draws = self.schedule.draws(self.current_epoch)
        free = ("theta", "phi")
        if self.hparams.method == "mcem":
            # Seeded per (seed, rank, epoch) by SeedEveryStep: resumed runs repeat the draws.
            generator = torch.Generator().manual_seed(torch.initial_seed())
            new = mcem_iteration(
                self.joint, source, self._chain, free, draws, generator,
                self.schedule.m_step_iter, self._reduce,
            )  # fmt: skip
        else:
            new = fit_direct(self.joint, source, self._chain, free, self._reduce)
        change = max(float((new[b] - self._chain[b]).abs().max()) for b in free)
        self._chain = new
        self._history = [*self._history, new][-self.schedule.average_last :]
        for name in free:  # the estimate: average of the last iterates
            getattr(self, name).data.copy_(torch.stack([h[name] for h in self._history]).mean(0))
        at_max = draws == self.schedule.max_draws or self.hparams.method == "direct"
        self._calm = self._calm + 1 if (change < self.schedule.tol and at_max) else 0
        if self._calm >= self.schedule.patience:
            self.trainer.should_stop = True
        loglik = self._reduce(self.joint.loglik(self.theta, self.phi, source) / len(source))
        self.log_dict(
            {
                "train/max_change": change,
                "train/draws": float(draws),
                "train/source_loglik": loglik,
            },
            prog_bar=True,
            batch_size=len(source),
        )

    def validation_step(self, batch, batch_idx):
        target = batch["target"]
        start = {**self.blocks(), "gamma": torch.zeros_like(self.gamma.data)}
        fitted = fit_direct(
            self.joint, target, start, ("gamma",), self._reduce, self.hparams.gamma_prior_sd
        )
        self.gamma.data.copy_(fitted["gamma"])
        theta, phi, gamma = fitted["theta"], fitted["phi"], fitted["gamma"]
        risk = self.joint.timely_risk(theta, target.x, self.hparams.horizon, gamma)  # [N]
        ibnr = self.joint.expected_ibnr(theta, phi, target, gamma)
        metrics = {
            "val/gamma": float(gamma),
            "val/timely_risk": self._reduce(risk.mean()),
            "val/ibnr": self._reduce(ibnr) * self.trainer.world_size,
        }
        truth = getattr(self.trainer.datamodule, "target_truth", None)
        if truth is not None:
            metrics["val/risk_error"] = metrics["val/timely_risk"] - float(truth.mean())
        self.log_dict(metrics, prog_bar=True, batch_size=len(target))

    def test_step(self, batch, batch_idx):
        """The saved parameters' evaluation on the target (no refit of gamma)."""
        target = batch["target"]
        theta, phi, gamma = self.theta.data, self.phi.data, self.gamma.data
        risk = self.joint.timely_risk(theta, target.x, self.hparams.horizon, gamma)
        ibnr = self.joint.expected_ibnr(theta, phi, target, gamma)
        metrics = {
            "test/gamma": float(gamma),
            "test/timely_risk": self._reduce(risk.mean()),
            "test/ibnr": self._reduce(ibnr) * self.trainer.world_size,
        }
        truth = getattr(self.trainer.datamodule, "target_truth", None)
        if truth is not None:
            metrics["test/risk_error"] = metrics["test/timely_risk"] - float(truth.mean())
        self.log_dict(metrics, batch_size=len(target))

    def on_fit_end(self) -> None:
        """Rank 0 writes fitted_params.json and timely_risk.csv (persist.py) to the run folder."""
        trainer = self.trainer
        # log_dir broadcasts rank 0's folder under DDP: a collective every rank must join.
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        if trainer.global_rank != 0 or trainer.sanity_checking or trainer.fast_dev_run:
            return
        data = trainer.datamodule
        config = {
            k: self.hparams[k]
            for k in (
                "n_features", "event_family", "delay_family", "delay_covariates", "cuts",
                "quad_nodes", "horizon",
            )
        }  # fmt: skip
        save_fit(
            folder, self.joint, self.blocks(), config, data.target,
            getattr(data, "target_ids", None),
        )  # fmt: skip

    def configure_optimizers(self):
        return None  # L-BFGS runs inside the M-steps (fitting.py) on the full data
