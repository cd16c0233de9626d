"""Real offline data: SeqRejectron on Minari datasets, deployed in the dataset's simulator.

Labelled demonstrations in the train dynamics and unlabelled expert state trajectories in the
test dynamics come from two Minari datasets under one data root (``minari_format.load_minari``;
the test dataset's actions are never read). The deployment rollouts run in the datasets'
gymnasium environment; the test dynamics are that environment with a JSON shift spec of MuJoCo
edits applied (``minari_format.apply_shift``), and an optional spec applied to both.

Reconstructed choices [R]:
- Features: the flattened observation (a dict observation's keys in sorted order, as Minari's
  reader flattens them), standardised by the labelled train states' mean and std.
- Actions: a discrete action space's actions as they are. A continuous one is rounded per
  component to {-1, 0, +1} times its bound (a component beyond a third of the bound counts):
  3^d actions, the grid environment (B) uses. The deterministic validators' disagreement
  (Eq. 1) needs discrete actions.
- Sparse cost: ``goal`` = 1 unless ``info["success"]`` turns true within the horizon (PointMaze,
  AntMaze); ``fall`` = 1 if the episode terminates before the horizon (Hopper, Walker2d).
- Only the demonstrations carry expert labels, so on real data the oracle stop and the dense
  cost are not available; rollouts record the expert's action as -1 (unknown).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from papers_cli import ConfigError
from seqrejectron.envs import Trajectory
from seqrejectron.minari_format import (
    Episode,
    apply_shift,
    check_same_observation_space,
    load_minari,
    read_shift_spec,
)

UNKNOWN = -1  # the expert's action where no expert was asked (rollouts, unlabelled data)
Cost = Literal["goal", "fall"]


def flatten_observation(obs) -> np.ndarray:
    """A gymnasium observation as one float vector (dict keys in sorted order, as Minari)."""
    if isinstance(obs, dict):
        return np.concatenate([np.ravel(obs[key]) for key in sorted(obs)]).astype(np.float32)
    return np.ravel(obs).astype(np.float32)


def action_grid(action_space) -> tuple[int, np.ndarray | None]:
    """The discrete action count, and for a continuous space each component's bound."""
    from gymnasium import spaces

    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n), None
    if isinstance(action_space, spaces.Box):
        high = np.asarray(action_space.high, dtype=np.float64).ravel()
        return 3 ** len(high), high
    raise ConfigError(f"action space {action_space} is neither Discrete nor Box")


def discretise_actions(actions: np.ndarray, high: np.ndarray | None) -> np.ndarray:
    """[R] Continuous actions [T, d] -> indices into the 3^d grid (component levels -1/0/+1,
    threshold a third of the bound, the first component most significant); discrete ones as
    they are."""
    if high is None:
        return np.asarray(actions).reshape(len(actions)).astype(np.int64)
    scaled = np.asarray(actions, dtype=np.float64).reshape(len(actions), -1) / high
    levels = np.where(scaled > 1 / 3, 2, np.where(scaled < -1 / 3, 0, 1))
    weights = 3 ** np.arange(levels.shape[1] - 1, -1, -1)
    return (levels * weights).sum(1).astype(np.int64)


def grid_action(index: int, high: np.ndarray | None):
    """The environment action of a grid index (inverse of ``discretise_actions``)."""
    if high is None:
        return int(index)
    digits = [(index // 3**k) % 3 for k in range(len(high) - 1, -1, -1)]
    return (np.array(digits, dtype=np.float64) - 1.0) * high


def mujoco_model(env):
    """The MuJoCo model under a gymnasium environment (PointMaze keeps it in ``point_env``)."""
    base = env.unwrapped
    for holder in (getattr(base, "point_env", None), getattr(base, "ant_env", None), base):
        if holder is not None and hasattr(holder, "model") and hasattr(holder.model, "opt"):
            return holder.model
    raise ConfigError(f"{type(base).__name__} has no MuJoCo model: a shift spec cannot apply")


def make_env(env_id: str, horizon: int, specs: list[dict]):
    """``gymnasium.make(env_id)`` (gymnasium-robotics registered) with the specs' edits."""
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    try:
        env = gym.make(env_id, max_episode_steps=horizon)
    except gym.error.Error as error:
        raise ConfigError(f"unknown environment id '{env_id}': {error}") from None
    for spec in specs:
        apply_shift(mujoco_model(env), spec)
    return env


class GymDynamics:
    """One dynamics of the real environment, rolled out like the miniature's ``Layout``."""

    def __init__(self, env, standardise, high, horizon: int, cost: Cost) -> None:
        self.env, self.standardise, self.high = env, standardise, high
        self.horizon, self.cost_rule = horizon, cost

    def rollout(self, policy, episode_seed: int) -> Trajectory:
        """``policy(feats, obs) -> grid index``; the sparse cost by ``cost`` (module docstring)."""
        obs, _ = self.env.reset(seed=int(episode_seed % 2**31))
        feats, actions = [], []
        cost = 1 if self.cost_rule == "goal" else 0
        for _ in range(self.horizon):
            f = self.standardise(flatten_observation(obs))
            action = int(policy(f, obs))
            feats.append(f)
            actions.append(action)
            obs, _, terminated, truncated, info = self.env.step(grid_action(action, self.high))
            if self.cost_rule == "goal" and info.get("success", False):
                cost = 0
                break
            if terminated:
                cost = 1 if self.cost_rule == "fall" else cost
                break
            if truncated:
                break
        actions = np.array(actions, dtype=np.int64)
        return Trajectory(
            feats=np.stack(feats),
            z=np.zeros(len(actions), dtype=np.int64),
            expert=np.full(len(actions), UNKNOWN),
            actions=actions,
            cost=cost,
        )


@dataclass
class OfflineProblem:
    """Labelled train trajectories, unlabelled test trajectories, and both dynamics."""

    train: list[Trajectory]
    test: list[Trajectory]
    train_env: GymDynamics
    test_env: GymDynamics
    n_actions: int
    in_features: int


def first_episodes(episodes: list[Episode], count: int, name: str) -> list[Episode]:
    if len(episodes) < count:
        raise ConfigError(f"{name} holds {len(episodes)} episodes, fewer than the {count} asked")
    return episodes[:count]


def load_offline_problem(
    data_root: str | Path,
    train_dataset: str,
    test_dataset: str,
    env_id: str,
    shift_spec: str | Path,
    train_spec: str | Path | None = None,
    n_train: int = 200,
    n_test: int = 200,
    horizon: int = 300,
    cost: Cost = "goal",
) -> OfflineProblem:
    """Read both datasets (the first ``n_train`` / ``n_test`` episodes by id), check them against
    each other and the environment, and build the train and test dynamics."""
    base = [read_shift_spec(train_spec)] if train_spec else []
    test_specs = [*base, read_shift_spec(shift_spec)]
    train_env = make_env(env_id, horizon, base)
    n_actions, high = action_grid(train_env.action_space)
    train_eps = first_episodes(load_minari(data_root, train_dataset), n_train, train_dataset)
    test_eps = first_episodes(load_minari(data_root, test_dataset), n_test, test_dataset)
    check_same_observation_space(train_eps, test_eps)
    env_dim = len(flatten_observation(train_env.observation_space.sample()))
    data_dim = train_eps[0].observations.shape[1]
    if env_dim != data_dim:
        raise ConfigError(
            f"the datasets' observations have {data_dim} values, {env_id}'s have {env_dim}: "
            "data and environment do not match"
        )
    test_env = make_env(env_id, horizon, test_specs)
    states = np.concatenate([e.observations[:-1] for e in train_eps])
    mean, std = states.mean(0), states.std(0) + 1e-6

    def standardise(x: np.ndarray) -> np.ndarray:
        return ((x - mean) / std).astype(np.float32)

    def trajectory(episode: Episode, labelled: bool) -> Trajectory:
        feats = standardise(episode.observations[:-1])
        labels = (
            discretise_actions(episode.actions, high)
            if labelled
            else np.full(len(feats), UNKNOWN, dtype=np.int64)
        )
        return Trajectory(
            feats=feats,
            z=np.zeros(len(feats), dtype=np.int64),
            expert=labels,
            actions=labels,
            cost=0,
        )

    return OfflineProblem(
        train=[trajectory(e, labelled=True) for e in train_eps],
        test=[trajectory(e, labelled=False) for e in test_eps],
        train_env=GymDynamics(train_env, standardise, high, horizon, cost),
        test_env=GymDynamics(test_env, standardise, high, horizon, cost),
        n_actions=n_actions,
        in_features=data_dim,
    )
