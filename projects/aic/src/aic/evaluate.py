"""Evaluation: per-step readout tables, environment rollouts under any halting rule, and the
comparison of AIC with the fixed counterpart and the halting baselines."""

from __future__ import annotations

import time

import numpy as np
import torch

from aic import baselines
from aic.core import AICPolicy, adaptive_act, count_flops, halting_steps, select_steps, step_returns
from aic.protocol import matched_budget, removal_curve, validity, value_of
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
        for episode, action in zip(live, readouts, strict=True):
            episode.step(to_env_action(task, action))
    out = {
        "return": float(np.mean([e.total_return for e in episodes])),
        "success": float(np.mean([e.success for e in episodes])),
        "mean_steps": total_steps / max(decisions, 1),
        "episode_returns": [e.total_return for e in episodes],
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


def halting_rules(task, aic: AICPolicy, train_table, train_target, settings, seed: int) -> dict:
    """name -> choose(table, exact_returns) for the baselines that share AIC's backbone."""
    k_max = aic.k_max
    step_losses = baselines.per_sample_step_losses(
        task.action_kind, train_table["actions"], train_target
    )
    features = train_table["features"]
    rules = {}
    for prior in settings["ponder_priors"]:
        unit = baselines.fit_halting_unit(
            features,
            step_losses,
            lambda lam, loss, p=prior: baselines.ponder_loss(lam, loss, p),
            seed=seed,
        )
        rules[f"PonderNet (lambda_p={prior})"] = lambda t, r, u=unit: baselines.ponder_steps(
            u(t["features"])
        )
    for tau in settings["act_taus"]:
        unit = baselines.fit_halting_unit(
            features, step_losses, lambda h, loss, t=tau: baselines.act_loss(h, loss, t), seed=seed
        )
        rules[f"ACT (tau={tau})"] = lambda t, r, u=unit: baselines.act_steps(u(t["features"]))
    thresholds = settings["confidence"][task.action_kind]
    for c in thresholds:
        rules[f"confidence exit (c={c})"] = lambda t, r, c=c: baselines.confidence_steps(
            t["actions"], task.action_kind, c
        )
    price = settings["price"]
    rules[f"oracle halting (lambda={price})"] = lambda t, r: baselines.oracle_steps(r, price)
    generator = torch.Generator().manual_seed(seed)
    mean_aic = float(halting_steps(train_table["halt"], price).float().mean())
    rules["random halting (AIC's mean K)"] = lambda t, r: baselines.random_steps(
        t["actions"].shape[0], k_max, mean_aic, generator
    )
    return rules


def evaluate_pair(task: Task, aic, fixed, data, settings: dict, seed: int) -> dict:
    """All methods and the six protocol components for one (task, architecture)."""
    start = time.perf_counter()
    k_max, price = aic.k_max, settings["price"]
    train = data.train_arrays
    n_fit = min(len(train["obs"]), settings["n_fit_states"])
    train_obs = torch.from_numpy(train["obs"][:n_fit])
    train_target = torch.from_numpy(train["target"][:n_fit])
    train_table = readout_table(aic, train_obs)
    rules = halting_rules(task, aic, train_table, train_target, settings, seed)

    val = data.val_arrays
    val_obs = torch.from_numpy(val["obs"])
    target = torch.from_numpy(val["target"])
    q_star = torch.from_numpy(val["q"]) if "q" in val else None
    difficulty = torch.from_numpy(val["difficulty"])
    table = readout_table(aic, val_obs)
    returns = exact_returns(task, table["actions"], target, q_star)  # [N, K]
    fixed_returns = exact_returns(task, readout_table(fixed, val_obs)["actions"], target, q_star)

    flops = count_flops(aic, val_obs)
    online = task.domain != "language"
    episodes, ep_seed = settings["episodes"].get(task.domain, 0), 10_000 + seed

    def record(steps, act=None):
        row = {
            "offline_return": float(value_of(returns, steps).mean()),
            "mean_steps": float(steps.float().mean()),
        }
        if online and act is not None:
            roll = rollout(task, act, episodes, ep_seed)
            row.update(
                {
                    "return": roll["return"],
                    "success": roll["success"],
                    "mean_steps": roll["mean_steps"],
                }
            )
        else:
            row["return"] = row["offline_return"]
        row["compute_saved_pct"] = 100 * (1 - row["mean_steps"] / k_max)
        row["flops_per_decision"] = flops["encoder"] + row["mean_steps"] * flops["per_step"]
        return row

    methods = {}
    full = torch.full((val_obs.shape[0],), k_max)
    fixed_row = {"offline_return": float(fixed_returns[:, -1].mean()), "mean_steps": k_max}
    if online:
        every_step = table_rule(fixed, task, lambda t, r: baselines.fixed_steps(len(r), k_max))
        roll = rollout(task, every_step, episodes, ep_seed)
        fixed_row.update({"return": roll["return"], "success": roll["success"]})
    else:
        fixed_row["return"] = fixed_row["offline_return"]
    fixed_row["compute_saved_pct"] = 0.0
    fixed_row["flops_per_decision"] = flops["encoder"] + k_max * flops["per_step"]
    methods[f"fixed counterpart (K={k_max})"] = fixed_row

    aic_steps = halting_steps(table["halt"], price)
    methods[f"AIC (lambda={price})"] = record(aic_steps, compacted_rule(aic, price))
    frontier = {"aic": [], "fixed": []}
    for p in settings["price_sweep"]:
        row = record(halting_steps(table["halt"], p), compacted_rule(aic, p))
        frontier["aic"].append({"price": p, **row})
    for k in range(1, k_max + 1):
        fixed_k = table_rule(aic, task, lambda t, r, k=k: baselines.fixed_steps(len(r), k))
        row = record(full.clamp(max=k), fixed_k)
        frontier["fixed"].append({"k": k, **row})
    for name, choose in rules.items():
        steps = choose(table, returns)
        methods[name] = record(steps, table_rule(aic, task, choose))

    fractions = settings["removal_fractions"]
    protocol = {
        "matched_budget": matched_budget(returns, aic_steps),
        "removal": removal_curve(returns, aic_steps, fractions, settings["n_random"], seed),
        "validity": validity(aic_steps, difficulty, returns, seed),
        "frontier": frontier,
    }
    if task.name == "program-lm":  # VoC vs confidence on unpredictable noise characters
        noise = difficulty < 0
        conf_name = next(n for n in rules if n.startswith("confidence"))
        conf_steps = rules[conf_name](table, returns)
        protocol["noise_tokens"] = {
            "aic_mean_steps_on_noise": float(aic_steps[noise].float().mean()),
            "aic_mean_steps_on_answers": float(aic_steps[difficulty > 0].float().mean()),
            "confidence_mean_steps_on_noise": float(conf_steps[noise].float().mean()),
        }
    return {
        "methods": methods,
        "protocol": protocol,
        "flops": flops,
        "eval_s": time.perf_counter() - start,
    }
