"""The reinforcement-learning path for grid worlds: advantage actor-critic (A2C) with AIC.

One file in the CleanRL manner, on the same ``AICPolicy``. Per update, n_envs environments
run n_steps steps with actions sampled from the last readout pi_K; then

    Q(s_t, a_t) <- G_t = sum_{i<n} gamma^i r_{t+i} + gamma^n V(s_{t+n}),  V = sum_a pi_K Q
    L_actor     = -log pi_K(a_t | s_t) (G_t - V(s_t)) - c_H H(pi_K)
    L_deep      = 1/(K-1) sum_{k<K} KL(sg[pi_K] || pi_k)        (deep supervision)
    L_halt      = Huber(u_k, sg[G_k]) with R_k = Q(s, argmax pi_k)  (Eq. 3-5, learned critic)

so the halting head learns from the value of computation under the learned critic alone.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from aic.core import AICPolicy, adaptive_act, halting_loss, step_returns, voc_targets
from aic.tasks import GRID_ACTIONS, Task, make_env, observe


def evaluate_policy(
    policy: AICPolicy, task: Task, price: float, episodes: int, seed: int, sample: bool = False
):
    """Mean return and mean refinement steps of the AIC policy (compacted inference), acting
    greedily or by sampling its readout."""
    generator = torch.Generator().manual_seed(seed)
    returns, steps, decisions = [], 0, 0
    for i in range(episodes):
        env = make_env(task.env_id, **task.make_kwargs)
        obs, _ = env.reset(seed=seed + i)
        total, done, length = 0.0, False, 0
        while not done and length < task.max_eval_steps:
            x = torch.from_numpy(observe(task, obs))[None]
            logits, k = adaptive_act(policy, x, price)
            if sample:
                action = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            else:
                action = logits.argmax()
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, length, done = total + reward, length + 1, terminated or truncated
            steps, decisions = steps + int(k), decisions + 1
        returns.append(total)
        env.close()
    return float(np.mean(returns)), steps / max(decisions, 1)


def random_policy_return(task: Task, episodes: int, seed: int) -> float:
    """Mean return of the uniform random policy on the episodes ``evaluate_policy`` plays
    (same episode seeds, same step cap): the baseline a learned policy must beat."""
    rng = np.random.default_rng(seed)
    returns = []
    for i in range(episodes):
        env = make_env(task.env_id, **task.make_kwargs)
        env.reset(seed=seed + i)
        total, done, length = 0.0, False, 0
        while not done and length < task.max_eval_steps:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(GRID_ACTIONS)))
            total, length, done = total + reward, length + 1, terminated or truncated
        returns.append(total)
        env.close()
    return float(np.mean(returns))


class A2CCollector:
    """n_envs environments stepped side by side with actions sampled from the last readout."""

    def __init__(self, task: Task, n_envs: int, seed: int):
        self.task = task
        self.rng = np.random.default_rng(seed)
        self.envs = [make_env(task.env_id, **task.make_kwargs) for _ in range(n_envs)]
        self.obs = [
            observe(task, env.reset(seed=seed * 1000 + i)[0]) for i, env in enumerate(self.envs)
        ]
        self.running = [0.0] * n_envs

    def collect(self, policy: AICPolicy, n_steps: int) -> dict:
        """n_steps transitions per environment; the returns of the episodes that ended."""
        batch_obs, actions, rewards, dones, finished = [], [], [], [], []
        for _ in range(n_steps):
            x = torch.from_numpy(np.stack(self.obs))
            with torch.no_grad():
                logits = policy(x)["actions"][:, -1]
            a = torch.distributions.Categorical(logits=logits).sample()
            step_rewards, step_dones = [], []
            for i, env in enumerate(self.envs):
                o, r, terminated, truncated, _ = env.step(int(a[i]))
                self.running[i] += r
                if terminated or truncated:
                    finished.append(self.running[i])
                    self.running[i] = 0.0
                    o, _ = env.reset(seed=int(self.rng.integers(1 << 30)))
                self.obs[i] = observe(self.task, o)
                step_rewards.append(r)
                step_dones.append(terminated or truncated)
            batch_obs.append(x)
            actions.append(a)
            rewards.append(torch.tensor(step_rewards, dtype=torch.float32))
            dones.append(torch.tensor(step_dones, dtype=torch.float32))
        return {
            "obs": batch_obs,
            "actions": actions,
            "rewards": rewards,
            "dones": dones,
            "last_obs": torch.from_numpy(np.stack(self.obs)),
            "finished_returns": finished,
        }

    def close(self) -> None:
        for env in self.envs:
            env.close()


def a2c_losses(
    policy: AICPolicy, rollout: dict, gamma: float, entropy: float, horizon: str = "one_step"
) -> dict:
    """The A2C + AIC losses of one rollout (module docstring); "loss" is their sum."""
    with torch.no_grad():  # bootstrap from V(s_{t+n}) = sum_a pi_K Q
        last = policy(rollout["last_obs"])
        value = (last["actions"][:, -1].softmax(-1) * last["q"]).sum(-1)
    targets = []
    for t in reversed(range(len(rollout["rewards"]))):
        value = rollout["rewards"][t] + gamma * value * (1 - rollout["dones"][t])
        targets.append(value)
    targets = torch.cat(targets[::-1])
    out = policy(torch.cat(rollout["obs"]))
    a = torch.cat(rollout["actions"])
    logp = out["actions"].log_softmax(-1)  # [B, K, A]
    final = logp[:, -1]
    q_taken = out["q"].gather(1, a[:, None])[:, 0]
    baseline = (final.exp() * out["q"]).sum(-1).detach()
    advantage = targets - baseline
    actor = -(final.gather(1, a[:, None])[:, 0] * advantage).mean()
    actor = actor - entropy * -(final.exp() * final).sum(-1).mean()
    teacher = final.detach().exp()[:, None]
    deep = (teacher * (final.detach()[:, None] - logp[:, :-1])).sum(-1).mean()
    critic = F.mse_loss(q_taken, targets)
    returns = step_returns("q", out["actions"], None, out["q"].detach())
    halt = halting_loss(out["halt"], voc_targets(returns, horizon))
    losses = {"actor": actor, "deep": deep, "critic": critic, "halt": halt}
    losses["loss"] = actor + deep + critic + halt
    return losses


def train_a2c(
    task: Task,
    architecture: str = "conv",
    dim: int = 16,
    k_max: int = 6,
    updates: int = 300,
    n_envs: int = 8,
    n_steps: int = 16,
    gamma: float = 0.95,
    lr: float = 2e-3,
    entropy: float = 0.01,
    seed: int = 0,
    horizon: str = "cumulative",
) -> tuple[AICPolicy, list[float]]:
    """Train an AIC policy by A2C on a grid task (no expert anywhere); returns the policy and
    the returns of the training episodes in the order they ended. ``horizon`` keeps this
    function's earlier cumulative VoC target (its test was calibrated on it); the CLI path
    (model.mode=a2c) uses model.voc_horizon, one-step by default."""
    torch.manual_seed(seed)
    collector = A2CCollector(task, n_envs, seed)
    shape = collector.obs[0].shape
    policy = AICPolicy(
        "grid", shape, GRID_ACTIONS, "discrete", architecture, dim, k_max, critic=True
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    episode_returns = []
    for _ in range(updates):
        rollout = collector.collect(policy, n_steps)
        episode_returns += rollout["finished_returns"]
        loss = a2c_losses(policy, rollout, gamma, entropy, horizon)["loss"]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
    collector.close()
    return policy.eval(), episode_returns
