"""Evaluation: per-step readout tables and environment rollouts under any halting rule."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import mannwhitneyu, spearmanr

from aic.core import AICPolicy, adaptive_act, select_steps, step_returns, voc_targets
from aic.tasks import Episode, Task


@torch.no_grad()
def readout_table(policy: AICPolicy, obs: torch.Tensor, batch: int = 512) -> dict:
    """Every step's readout for a set of states: actions [N, K, A], halt [N, K], features."""
    policy.eval()
    parts = [policy(obs[i : i + batch]) for i in range(0, obs.shape[0], batch)]
    return {k: torch.cat([p[k] for p in parts]) for k in ("actions", "halt", "features")}


def exact_returns(task: Task, actions: torch.Tensor, target, q_star) -> torch.Tensor:
    """R_k(s) under the exact oracle (Eq. 3 with Q* or the expert), [N, K]."""
    if task.return_kind == "q":
        return step_returns("q", actions, None, q_star)
    return step_returns(task.return_kind, actions, target)


def to_env_action(task: Task, action: torch.Tensor):
    if task.action_kind == "discrete":
        return int(action.argmax())
    return action.numpy()


def rollout(task: Task, act, n_episodes: int, seed: int) -> dict:
    """Run n_episodes side by side; ``act(obs [B, ...], truth)`` returns (readouts, steps).

    ``truth`` holds, per state, what exact halting needs: Q* (grids) or the expert action."""
    episodes = [Episode(task, seed + i) for i in range(n_episodes)]
    steps_of = np.zeros(n_episodes)  # refinement steps summed over each episode's decisions
    total_steps, decisions = 0, 0
    while True:
        live = [e for e in episodes if not e.done]
        if not live:
            break
        obs = torch.from_numpy(np.stack([e.policy_obs() for e in live]))
        if task.domain == "grid":
            truth = torch.from_numpy(np.stack([e.q_values() for e in live]))
        else:
            truth = torch.from_numpy(np.stack([e.expert_action() for e in live]))
        readouts, steps = act(obs, truth)
        total_steps += int(steps.sum())
        decisions += len(live)
        for episode, action, k in zip(live, readouts, steps.tolist(), strict=True):
            steps_of[episodes.index(episode)] += k
            episode.step(to_env_action(task, action))
    out = {
        "return": float(np.mean([e.total_return for e in episodes])),
        "success": float(np.mean([e.success for e in episodes])),
        "mean_steps": total_steps / max(decisions, 1),
        "episode_returns": np.array([e.total_return for e in episodes]),
        "episode_success": np.array([float(e.success) for e in episodes]),
        # mean refinement steps per decision within each episode
        "episode_mean_steps": steps_of / np.maximum([e.length for e in episodes], 1),
    }
    for e in episodes:
        e.close()
    return out


def table_rule(policy: AICPolicy, task: Task, choose):
    """An ``act`` for rollouts from a rule on the full readout table (baselines)."""

    @torch.no_grad()
    def act(obs, truth):
        table = readout_table(policy, obs)
        if task.return_kind == "q":
            returns = step_returns("q", table["actions"], None, truth)
        else:
            returns = step_returns(task.return_kind, table["actions"], truth)
        steps = choose(table, returns)
        return select_steps(table["actions"], steps), steps

    return act


def compacted_rule(policy: AICPolicy, price: float):
    """AIC's own inference for rollouts: halted samples leave the batch (core.adaptive_act)."""

    def act(obs, truth):
        policy.eval()
        return adaptive_act(policy, obs, price)

    return act


def head_quality(halt: torch.Tensor, true_returns: torch.Tensor, price: float) -> dict[str, float]:
    """How well the halting head's values u_k [N, K] rank the exact one-step gain
    g_k = R*_{k+1} - R*_k of the readouts (pooled over k < K_max): the AUC of u_k for
    "g_k > price" (the probability that a paying step outranks a non-paying one; 0.5 is
    state-blind) and the Spearman rank correlation of u_k with g_k. NaN when one class is empty."""
    gain = voc_targets(true_returns, "one_step")[:, :-1].flatten().double().numpy()
    value = halt[:, :-1].flatten().double().numpy()
    label = gain > price
    n_pos, n_neg = int(label.sum()), int((~label).sum())
    auc = float("nan")
    if n_pos and n_neg:
        auc = float(mannwhitneyu(value[label], value[~label]).statistic / (n_pos * n_neg))
    rho = float(spearmanr(value, gain).statistic) if gain.std() > 0 else float("nan")
    return {"auc": auc, "spearman": rho, "paying_fraction": n_pos / max(n_pos + n_neg, 1)}
