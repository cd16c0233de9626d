"""LightningModule: wiring only (the AIC losses come from core, Eq. 7)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from aic.architectures import Architecture
from aic.core import (
    AICPolicy,
    deep_supervision_loss,
    halting_classifier_loss,
    halting_loss,
    halting_steps,
    policy_losses,
    select_steps,
    step_returns,
    voc_targets,
)
from aic.rl import A2CCollector, a2c_losses, evaluate_policy, random_policy_return
from aic.tasks import VOCAB, TaskName, get_task, obs_shape
from papers_cli import ConfigError, init_arguments

RANDOM_EPISODES = 50  # episodes of the uniform random policy logged beside the greedy return


class AicModule(LightningModule):
    """mode="aic": deep supervision + critic + VoC halting head (imitation of the expert);
    mode="fixed": the fixed-K counterpart (the same network trained on its K_max-th readout
    only, no halting); mode="a2c": reinforcement learning on a grid task (``rl.py``: A2C, no
    expert; each training batch only paces one update of n_envs x n_steps transitions, and the
    expert-labelled validation states measure the exact return).

    ``eval_episodes`` > 0 (grid tasks) rolls AIC out after every validation epoch and logs the
    mean episode return (``val/episode_return``) and refinement steps."""

    def __init__(
        self,
        task: TaskName = "lava-crossing",
        env_id: str | None = None,
        context: PositiveInt = 32,
        architecture: Architecture = "conv",
        dim: PositiveInt = 32,
        k_max: PositiveInt = 8,
        mode: Literal["aic", "fixed", "a2c"] = "aic",
        price_per_step: NonNegativeFloat = 0.01,
        voc_horizon: Literal["one_step", "cumulative"] = "one_step",
        voc_source: Literal["critic", "oracle"] = "critic",
        halt_objective: Literal["regression", "classifier"] = "regression",
        halt_threshold: NonNegativeFloat = 0.5,
        halt_weight: NonNegativeFloat = 1.0,
        critic_weight: NonNegativeFloat = 1.0,
        lr: PositiveFloat = 3e-3,
        lr_schedule: Literal["onecycle", "constant"] = "onecycle",
        eval_episodes: NonNegativeInt = 0,
        n_envs: PositiveInt = 8,
        n_steps: PositiveInt = 16,
        gamma: PositiveFloat = 0.95,
        entropy: NonNegativeFloat = 0.01,
        rl_seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        spec = get_task(task, env_id)
        self.spec = spec
        if mode == "a2c" and spec.domain != "grid":
            raise ConfigError(
                f"model.mode=a2c trains on grid worlds only; task '{task}' is {spec.domain}. "
                "Use a MiniGrid task (e.g. --data.task=lava-crossing) or mode=aic."
            )
        self.collector = None
        self.random_return: float | None = None
        self.policy = AICPolicy(
            obs_kind=spec.obs_kind,
            obs_shape=obs_shape(spec, context),
            n_actions=spec.n_actions,
            action_kind=spec.action_kind,
            architecture=architecture,
            dim=dim,
            k_max=k_max,
            vocab=VOCAB,
            action_scale=spec.action_scale,
            critic=spec.return_kind == "q",
            halt_objective=halt_objective,
        )

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.policy(obs)

    def losses(self, batch) -> dict[str, torch.Tensor]:
        obs, target, _difficulty, q_star = batch
        h = self.hparams
        out = self.policy(obs)
        per_step = policy_losses(self.spec.action_kind, out["actions"], target)
        losses = {"policy": deep_supervision_loss(per_step, deep=h.mode == "aic")}
        q_values = None
        exact = q_star if "q" in out else None  # exact values for the logged returns
        if "q" in out:
            losses["critic"] = F.mse_loss(out["q"], q_star)
            q_values = out["q"].detach() if h.voc_source == "critic" else q_star
        if h.mode == "aic":
            returns = step_returns(self.spec.return_kind, out["actions"], target, q_values)
            gains = voc_targets(returns, h.voc_horizon)
            if h.halt_objective == "classifier":  # Eq. 5': P(gain > price), halted below 1/2
                losses["halt"] = halting_classifier_loss(out["halt"], gains, h.price_per_step)
                threshold = h.halt_threshold
            else:  # Eq. 5: the gain itself, halted below the price
                losses["halt"] = halting_loss(out["halt"], gains)
                threshold = h.price_per_step
            steps = halting_steps(out["halt"].detach(), threshold)
            losses["mean_steps"] = steps.float().mean()
            # Eq. 3 under the exact values (grid: Q*/V*, language: log-lik in nats, robotics:
            # -squared distance to the expert) of the readout AIC halts at, per state
            exact_returns = step_returns(
                self.spec.return_kind, out["actions"].detach(), target, exact
            )
            losses["return_at_halt"] = select_steps(exact_returns[..., None], steps).mean()
        losses["return_at_k_max"] = step_returns(
            self.spec.return_kind, out["actions"][:, -1:].detach(), target, exact
        ).mean()
        losses["final_step_loss"] = per_step[-1].detach()
        losses["loss"] = (
            losses["policy"]
            + h.critic_weight * losses.get("critic", 0.0)
            + h.halt_weight * losses.get("halt", 0.0)
        )
        return losses

    def training_step(self, batch, batch_idx):
        if self.hparams.mode == "a2c":
            return self.a2c_step()
        losses = self.losses(batch)
        self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=False)
        return losses["loss"]

    def a2c_step(self) -> torch.Tensor:
        h = self.hparams
        if self.collector is None:  # each rank steps its own environments
            self.collector = A2CCollector(self.spec, h.n_envs, h.rl_seed + self.global_rank)
        rollout = self.collector.collect(self.policy, h.n_steps)
        losses = a2c_losses(self.policy, rollout, h.gamma, h.entropy, h.voc_horizon)
        self.log_dict({f"train/{k}": v for k, v in losses.items()})
        if rollout["finished_returns"]:
            self.log("train/episode_return", float(np.mean(rollout["finished_returns"])))
        return losses["loss"]

    def on_validation_epoch_end(self) -> None:
        h = self.hparams
        if h.eval_episodes and self.spec.domain == "grid" and not self.trainer.sanity_checking:
            was_training = self.policy.training
            mean_return, mean_steps = evaluate_policy(
                self.policy, self.spec, h.price_per_step, h.eval_episodes, seed=50_000
            )
            self.policy.train(was_training)
            self.log("val/episode_return", mean_return, sync_dist=True)
            self.log("val/episode_mean_steps", mean_steps, sync_dist=True)
            if self.random_return is None:  # the uniform random policy, same episode seeds
                self.random_return = random_policy_return(
                    self.spec, max(h.eval_episodes, RANDOM_EPISODES), seed=50_000
                )
            self.log("val/random_policy_return", self.random_return, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        losses = self.losses(batch)
        self.log_dict({f"val/{k}": v for k, v in losses.items()}, prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        losses = self.losses(batch)
        self.log_dict({f"test/{k}": v for k, v in losses.items()}, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        if self.hparams.lr_schedule == "constant":
            return optimizer
        steps = self.trainer.estimated_stepping_batches
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, self.hparams.lr, total_steps=steps
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
