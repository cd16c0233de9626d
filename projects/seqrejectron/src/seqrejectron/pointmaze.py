"""Environment (B): PointMaze (gymnasium-robotics) with hazard cells, a waypoint + PD expert with
Gaussian noise, and test dynamics from MuJoCo model edits (a JSON-style shift spec applied by
minari_format.apply_shift): a constant lateral "wind" force (the planar part of ``opt.gravity``)
and weaker actuators (``actuator gear`` scaled).

Reconstructed details [R]:
- The maze (5 x 7 cells, MAZE below): the start is a random free cell of the left column, the goal
  the top-right cell; the middle row's three inner cells are hazards (cost 1 and the episode ends
  when the point enters one; so is running out of time). The wind pushes towards the hazards.
- Actions are discretised so that SeqRejectron's deterministic machinery (validators disagree
  when their actions differ) applies unchanged: a force in {-1, 0, 1}^2 (9 actions), held for
  ``REPEAT`` MuJoCo steps (0.05 s). The expert computes a PD force towards the centre of the next
  cell on the BFS path (avoiding walls and hazards; the goal itself in the goal cell) and rounds
  each component to {-1, 0, 1} (threshold 1/3). In the demonstrations it executes that force
  plus Gaussian noise (``NOISE``, rounded the same way); the labels, and what the oracle stop and
  the dense cost compare with, are its noise-free action.
- Features: position, velocity / 5, goal position.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from seqrejectron.envs import Trajectory
from seqrejectron.experiment import World, WorldConfig, episode_metrics, fit_method
from seqrejectron.minari_format import apply_shift
from seqrejectron.search import fit_bc, greedy

MAZE = [
    [1, 1, 1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 1, 1, 1, 1, 1, 1],
]
HAZARDS = {(2, 2), (2, 3), (2, 4)}
GOAL_CELL = (1, 5)
START_CELLS = [(1, 1), (2, 1), (3, 1)]
SHIFT_SPEC = {
    "edits": [
        {"element": "opt", "field": "gravity", "value": [0.0, -6.0, -9.81]},  # wind: push to -y
        {"element": "actuator", "name": "motor_x", "field": "gear", "scale": 0.6},
        {"element": "actuator", "name": "motor_y", "field": "gear", "scale": 0.6},
    ]
}
REPEAT = 5
HORIZON = 100
NOISE = 0.3
KP, KD = 2.0, 0.6
LEVELS = (-1, 0, 1)
ACTIONS = np.array([(ax, ay) for ax in LEVELS for ay in LEVELS], dtype=np.float64)  # 9


def bfs_cells() -> dict[tuple[int, int], int]:
    dist = {GOAL_CELL: 0}
    queue = deque([GOAL_CELL])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            n = (r + dr, c + dc)
            if MAZE[n[0]][n[1]] == 0 and n not in HAZARDS and n not in dist:
                dist[n] = dist[(r, c)] + 1
                queue.append(n)
    return dist


DIST = bfs_cells()


class PointMaze:
    """One PointMaze instance (train dynamics, or test dynamics with ``shifted``)."""

    def __init__(self, shifted: bool) -> None:
        from gymnasium_robotics.envs.maze.point_maze import PointMazeEnv

        self.env = PointMazeEnv(maze_map=MAZE, continuing_task=False)
        self.env.reset(seed=0)
        if shifted:
            apply_shift(self.env.point_env.model, copy.deepcopy(SHIFT_SPEC))
        self.maze = self.env.maze

    def cell(self, pos) -> tuple[int, int]:
        r, c = self.maze.cell_xy_to_rowcol(np.asarray(pos))
        return int(r), int(c)

    def expert_force(self, obs: dict) -> np.ndarray:
        pos, vel = obs["observation"][:2], obs["observation"][2:]
        here = self.cell(pos)
        if here == GOAL_CELL or here not in DIST:
            target = obs["desired_goal"]
        else:
            r, c = here
            nxt = min(
                ((r + dr, c + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))),
                key=lambda n: DIST.get(n, 10**6),
            )
            target = (
                obs["desired_goal"]
                if nxt == GOAL_CELL
                else self.maze.cell_rowcol_to_xy(np.array(nxt))
            )
        return KP * (np.asarray(target) - pos) - KD * vel

    @staticmethod
    def discretise(force: np.ndarray) -> int:
        levels = np.where(force > 1 / 3, 1, np.where(force < -1 / 3, -1, 0))
        return int((levels[0] + 1) * 3 + (levels[1] + 1))

    @staticmethod
    def features(obs: dict) -> np.ndarray:
        o = obs["observation"]
        return np.concatenate([o[:2], o[2:] / 5, obs["desired_goal"]]).astype(np.float32)

    def rollout(self, policy, episode_seed: int, noise: float = 0.0) -> Trajectory:
        """``policy(feats, obs) -> action index`` (None: the expert, with Gaussian ``noise``)."""
        rng = np.random.default_rng(episode_seed)
        start = START_CELLS[rng.integers(len(START_CELLS))]
        obs, _ = self.env.reset(
            seed=int(episode_seed % 2**31),
            options={"goal_cell": np.array(GOAL_CELL), "reset_cell": np.array(start)},
        )
        feats, experts, actions = [], [], []
        cost = 1
        for _ in range(HORIZON):
            force = self.expert_force(obs)
            clean = self.discretise(force)
            f = self.features(obs)
            if policy is None:
                action = self.discretise(force + noise * rng.standard_normal(2))
            else:
                action = int(policy(f, obs))
            feats.append(f)
            experts.append(clean)
            actions.append(action)
            done = False
            for _ in range(REPEAT):
                obs, reward, terminated, _, _ = self.env.step(ACTIONS[action])
                if terminated:
                    cost, done = 0, True
                    break
                if self.cell(obs["observation"][:2]) in HAZARDS:
                    done = True
                    break
            if done:
                break
        experts, actions = np.array(experts), np.array(actions)
        return Trajectory(
            feats=np.stack(feats),
            z=np.zeros(len(actions), dtype=np.int64),
            expert=experts,
            actions=actions,
            cost=cost,
            dense_cost=int((experts != actions).sum()),
        )


SIZES_B = {"n_train": 100, "n_test": 100, "n_calibration": 150, "n_eval": 200}
SUBJECTS_B = (
    "seqrejectron",
    "bc",
    "novelty",
    "domain_classifier",
    "per_step_rejectron",
    "random_time",
    "random_validators",
    "oracle_stop",
)
TUNED_B = {"seqrejectron": {"lam": 5.0}, "per_step_rejectron": {"lam": 5.0}, "novelty": {"k": 1}}


def build_pointmaze_world(seed: int, sizes: dict[str, int]) -> World:
    train_env, test_env = PointMaze(shifted=False), PointMaze(shifted=True)
    base = seed * 1_000_000

    def expert_runs(env, split, count):
        runs = [env.rollout(None, base + split * 100_000 + i, NOISE) for i in range(count)]
        return runs

    train = expert_runs(train_env, 0, sizes["n_train"])  # labels: the noise-free action
    test = expert_runs(test_env, 1, sizes["n_test"])
    config = WorldConfig(horizon=HORIZON, shift="pointmaze-wind-gain", n_train=sizes["n_train"])
    pihat = fit_bc(
        train, config.hidden, config.bc_steps, config.bc_lr, seed, n_actions=len(ACTIONS)
    )

    def act(feats, obs):
        return int(greedy(pihat, torch.from_numpy(feats)[None])[0])

    def run(env, split, count):
        return [env.rollout(act, base + split * 100_000 + i) for i in range(count)]

    evaluation_p, evaluation_q = (
        run(train_env, 5, sizes["n_eval"]),
        run(test_env, 6, sizes["n_eval"]),
    )
    return World(
        config=config,
        seed=seed,
        train=train,
        test=test,
        pihat=pihat,
        calibration=run(train_env, 2, sizes["n_calibration"]),
        val_p=[],
        val_q=[],
        eval_p=evaluation_p,
        eval_q=evaluation_q,
    )


def run_pointmaze(seeds, quick: bool = False, epsilon: float = 0.05) -> dict[str, Any]:
    """Environment (B) once: every subject on one world per seed, eps = 0.05, the parameters
    the claim run tuned on environment (A) (no tuning on B)."""
    sizes = {k: 20 for k in SIZES_B} if quick else SIZES_B
    rows, worlds = [], {}
    for seed in seeds:
        start = time.perf_counter()
        world = build_pointmaze_world(seed, sizes)
        worlds[seed] = {
            "expert_train_cost": float(np.mean([t.cost for t in world.train])),
            "expert_test_cost": float(np.mean([t.cost for t in world.test])),
            "bc_train_cost": float(np.mean([t.cost for t in world.eval_p])),
            "bc_test_cost": float(np.mean([t.cost for t in world.eval_q])),
            "build_s": round(time.perf_counter() - start, 1),
        }
        for name in SUBJECTS_B:
            fitted = fit_method(
                world, name, epsilon, TUNED_B.get(name, {}), TUNED_B["seqrejectron"]
            )
            outcome = episode_metrics(fitted.rule, world.eval_p, world.eval_q)
            row = {"subject": name, "seed": seed}
            row.update({k: float(v.mean()) for k, v in outcome.items()})
            if "n_validators" in fitted.diagnostics:
                row["n_validators"] = float(fitted.diagnostics["n_validators"])
                row["rounds"] = fitted.diagnostics.get("rounds", [])
            if "target" in fitted.diagnostics:
                row["calibration_target"] = float(fitted.diagnostics["target"])
            rows.append(row)
    return {
        "maze": MAZE,
        "hazards": sorted(HAZARDS),
        "shift_spec": SHIFT_SPEC,
        "sizes": sizes,
        "epsilon": epsilon,
        "worlds": {str(k): v for k, v in worlds.items()},
        "rows": rows,
    }
