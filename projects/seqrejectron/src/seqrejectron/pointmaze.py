"""Environment (B): PointMaze (gymnasium-robotics) with hazard cells, a waypoint + proportional
expert with Gaussian noise, and test dynamics from MuJoCo model edits (JSON-style specs applied by
minari_format.apply_shift): a constant push towards the hazards (the planar part of
``opt.gravity``) and weaker actuators (``actuator gear`` scaled).

Reconstructed details [R] (this design, the third, chosen in a pilot on seeds 20-25 at the
claim's sizes, results/pilot_b/redesign_seeds20_25.log; the earlier designs, one-hot bins, and
what failed with them are in the README's environment (B) section and results/pilot_b):
- The maze (5 x 7 cells, MAZE below): the start is the top-left or the bottom-left free cell
  (equally likely), the goal the right end of the middle row, whose three inner cells are hazards
  (cost 1 and the episode ends when the point enters one; so does running out of time). From the
  top start the BFS path runs along the top row, right above the hazards; from the bottom start
  along the bottom row, right above the maze's bottom wall. The push (``WIND`` m/s^2 towards -y)
  drives the point down in both: into the hazards on the top route, against the harmless wall on
  the bottom route.
- Both dynamics give the point a joint damping of ``DAMPING`` (``TRAIN_SPEC``; the asset's is 1)
  so that its motion is damping-dominated (velocity about proportional to force). The test
  dynamics add ``SHIFT_SPEC`` (push ``WIND``, gear x ``GAIN``).
- The abstract state is the position's bin, ``BINS`` x ``BINS`` per 1 m cell. The expert
  computes a proportional force (``KP``) from the bin's centre towards the centre of the next
  cell on the BFS path that avoids walls and hazards (the goal cell's centre in the goal cell),
  but it does not correct drift across its lane unless it has drifted more than ``MARGIN``
  towards a hazard cell beside this cell or the next one; then it pushes away at full force.
  Each component is rounded to {-1, 0, 1} (threshold 1/3): 9 actions, each held for ``REPEAT``
  MuJoCo steps (0.05 s). The expert is a function of the bin, so "agree with the expert on every
  training step" is attainable. In the demonstrations the expert executes its force plus
  Gaussian noise (``NOISE``, rounded the same way); the labels, and what the oracle stop and the
  dense cost compare with, are its noise-free action. Without the push the demonstrations stay
  within the start's reset noise (+-0.25 m) of the lane's centre line, so training never shows
  the expert's correction; under the push the expert corrects on the top route (and reaches the
  goal) and plays "along the lane, no correction" when pressed against the bottom wall.
- Features: the bin centre's (x, y) in metres. pi-hat (BC, L2 ``BC_WEIGHT_DECAY``) extrapolates
  "along the lane, no sideways force" to the unseen low bins of both routes: right on the bottom
  route (the expert plays the same there), wrong on the top route (it sags into the hazards). So
  the test states training did not cover split into ones where pi-hat is right and ones where it
  is wrong, and novelty (or any stop on "unseen") stops more than the oracle stop does. (With the
  one-hot of the bin, the second design, pi-hat was wrong on every unseen bin, so novelty, random
  validators and the oracle stop coincided; in the first design, where every route ran above the
  hazards and the expert corrected drift from its lane everywhere, BC on bin-centre coordinates
  extrapolated the expert's "push up when low" correctly and never failed.)
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from typing import Any

import numpy as np

from seqrejectron.envs import Trajectory
from seqrejectron.experiment import (
    TUNING_EXECUTED_WEIGHT,
    World,
    WorldConfig,
    episode_metrics,
    episode_seeds,
    fit,
    tuning_score,
    world_from_demonstrations,
)
from seqrejectron.minari_format import apply_shift

MAZE = [
    [1, 1, 1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 0, 0, 0, 0, 0, 1],
    [1, 1, 1, 1, 1, 1, 1],
]
HAZARDS = {(2, 2), (2, 3), (2, 4)}
GOAL_CELL = (2, 5)  # [R] the right end of the hazard row: two routes, above and below the hazards
START_CELLS = [(1, 1), (3, 1)]  # [R] top-left (route above the hazards), bottom-left (below)
DAMPING = 20.0  # [R] the point's joint damping in BOTH dynamics (the asset's is 1)
TRAIN_SPEC = {
    "edits": [
        {"element": "dof", "name": "ball_x", "field": "damping", "value": DAMPING},
        {"element": "dof", "name": "ball_y", "field": "damping", "value": DAMPING},
    ]
}
WIND = 10.0  # [R] m/s^2 towards -y (the hazards' side of the path)
GAIN = 0.6  # [R] actuator gear scale in the test dynamics
SHIFT_SPEC = {
    "edits": [
        {"element": "opt", "field": "gravity", "value": [0.0, -WIND, -9.81]},  # wind: push to -y
        {"element": "actuator", "name": "motor_x", "field": "gear", "scale": GAIN},
        {"element": "actuator", "name": "motor_y", "field": "gear", "scale": GAIN},
    ]
}
REPEAT = 5
HORIZON = 100
NOISE = 0.1  # [R] demonstrations' execution noise (0.15 let 200 demos cover the test bins)
KP = 2.0
BC_STEPS = 1000
BC_WEIGHT_DECAY = 1e-3  # [R] Adam L2: weights of bins never seen in training decay to 0
MARGIN = 0.25  # [R] the expert corrects sideways only this far (m) off its lane towards a hazard
BINS = 8  # [R] position bins per cell and axis (the abstract state's resolution)
LEVELS = (-1, 0, 1)
ACTIONS = np.array([(ax, ay) for ax in LEVELS for ay in LEVELS], dtype=np.float64)  # 9
ROWS, COLS = len(MAZE) * BINS, len(MAZE[0]) * BINS
N_FEATURES = 2


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


def bin_of(pos) -> tuple[int, int]:
    """The abstract state: the (fine row, fine column) bin of the position; cells are 1 m, row 0
    on top (gymnasium-robotics' convention: y = height / 2 - (row + 0.5))."""
    fr = int(np.clip(np.floor((len(MAZE) / 2 - pos[1]) * BINS), 0, ROWS - 1))
    fc = int(np.clip(np.floor((pos[0] + len(MAZE[0]) / 2) * BINS), 0, COLS - 1))
    return fr, fc


def bin_centre(fr: int, fc: int) -> np.ndarray:
    return np.array([(fc + 0.5) / BINS - len(MAZE[0]) / 2, len(MAZE) / 2 - (fr + 0.5) / BINS])


def cell_centre(cell) -> np.ndarray:
    return np.array([cell[1] + 0.5 - len(MAZE[0]) / 2, len(MAZE) / 2 - cell[0] - 0.5])


def expert_force_at(state) -> np.ndarray:
    """The expert's proportional force, computed from the abstract state (the bin's centre):
    towards the centre of the next cell on the BFS path that avoids walls and hazards."""
    fr, fc = state
    pos = bin_centre(fr, fc)
    here = (fr // BINS, fc // BINS)
    if here == GOAL_CELL or here not in DIST:
        target = cell_centre(GOAL_CELL if here == GOAL_CELL else here)
    else:
        r, c = here
        nxt = min(
            ((r + dr, c + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))),
            key=lambda n: DIST.get(n, 10**6),
        )
        target = cell_centre(nxt)
        force = KP * (target - pos)
        # [R] the expert does not correct drift across its lane (walls are harmless) unless it
        # has drifted more than MARGIN towards a hazard cell (beside this cell or the next);
        # then it pushes away at full force.
        axis = 1 if nxt[0] == r else 0  # the lane's cross axis: y for a move along a row
        offset = (pos - cell_centre(here))[axis]
        side = (1 if offset < 0 else -1, 0) if axis == 1 else (0, 1 if offset > 0 else -1)
        across = {(r + side[0], c + side[1]), (nxt[0] + side[0], nxt[1] + side[1])}
        if abs(offset) > MARGIN and across & HAZARDS:  # beside this cell or the next one
            force[axis] = -np.sign(offset)
        else:
            force[axis] = 0.0
        return force
    return KP * (target - pos)


def discretise(force: np.ndarray) -> int:
    levels = np.where(force > 1 / 3, 1, np.where(force < -1 / 3, -1, 0))
    return int((levels[0] + 1) * 3 + (levels[1] + 1))


def features_of(state) -> np.ndarray:
    """[R] The bin centre's (x, y) in metres: smooth features, so pi-hat and the validators (the
    same MLP class) generalise to unseen bins near the demonstrated lanes."""
    return bin_centre(*state).astype(np.float32)


class PointMaze:
    """One PointMaze instance (train dynamics, or test dynamics with ``shifted``)."""

    def __init__(self, shifted: bool) -> None:
        from gymnasium_robotics.envs.maze.point_maze import PointMazeEnv

        self.env = PointMazeEnv(maze_map=MAZE, continuing_task=False)
        self.env.reset(seed=0)
        apply_shift(self.env.point_env.model, copy.deepcopy(TRAIN_SPEC))
        if shifted:
            apply_shift(self.env.point_env.model, copy.deepcopy(SHIFT_SPEC))
        self.maze = self.env.maze

    def cell(self, pos) -> tuple[int, int]:
        r, c = self.maze.cell_xy_to_rowcol(np.asarray(pos))
        return int(r), int(c)

    @staticmethod
    def state(obs: dict) -> tuple[int, int]:
        return bin_of(obs["observation"][:2])

    def expert_force(self, obs: dict) -> np.ndarray:
        return expert_force_at(self.state(obs))

    discretise = staticmethod(discretise)

    @staticmethod
    def features(obs: dict) -> np.ndarray:
        return features_of(PointMaze.state(obs))

    def rollout(self, policy, episode_seed: int, noise: float = 0.0) -> Trajectory:
        """``policy(feats, obs) -> action index`` (None: the expert, with Gaussian ``noise``)."""
        rng = np.random.default_rng(episode_seed)
        start = START_CELLS[rng.integers(len(START_CELLS))]
        obs, _ = self.env.reset(
            seed=int(episode_seed % 2**31),
            options={"goal_cell": np.array(GOAL_CELL), "reset_cell": np.array(start)},
        )
        self.env.goal = cell_centre(GOAL_CELL)  # [R] the goal exactly at its cell's centre
        feats, experts, actions = [], [], []
        cost = 1
        for _ in range(HORIZON):
            force = self.expert_force(obs)
            clean = discretise(force)
            f = self.features(obs)
            if policy is None:
                action = discretise(force + noise * rng.standard_normal(2))
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


SIZES_B = {"n_train": 200, "n_test": 200, "n_calibration": 150, "n_val": 100, "n_eval": 200}
SUBJECTS_B = (
    "seqrejectron",
    "bc",
    "ensemble",
    "novelty",
    "domain_classifier",
    "per_step_rejectron",
    "random_time",
    "random_validators",
    "oracle_stop",
)
# The validator-search grid tuned on (B)'s validation split: the old (20, 100, 500) jumped from
# "stop everything" (100) to "stop nothing" (500); filled in (issue 59).
LAMS_B = (20.0, 50.0, 100.0, 200.0, 500.0)


@functools.lru_cache(maxsize=8)
def build_pointmaze_world(seed: int, sizes: tuple[tuple[str, int], ...]) -> World:
    """Expert demonstrations in P (labelled, executed with Gaussian noise) and Q (states only),
    pi-hat by behaviour cloning, and pi-hat's rollouts in both dynamics (calibration, validation
    and evaluation splits, each with its own episode seeds). ``sizes``: ``tuple(dict.items())``."""
    sizes = dict(sizes)
    train_env, test_env = PointMaze(shifted=False), PointMaze(shifted=True)

    def expert_runs(env, split, count):
        return [env.rollout(None, s, NOISE) for s in episode_seeds(seed, split, count)]

    train = expert_runs(train_env, 0, sizes["n_train"])  # labels: the noise-free action
    test = expert_runs(test_env, 1, sizes["n_test"])
    config = WorldConfig(
        horizon=HORIZON,
        shift="pointmaze-wind-gain",
        **sizes,
        bc_steps=BC_STEPS,
        bc_weight_decay=BC_WEIGHT_DECAY,
        n_actions=len(ACTIONS),
    )
    return world_from_demonstrations(config, seed, train_env, test_env, train, test)


def pointmaze_summary(world: World) -> dict[str, float]:
    """The precondition's numbers: the expert's and BC's costs in both dynamics, the oracle stop's
    train stop rate, and the share of the expert's test states whose bin occurs in training."""
    seen = {tuple(f) for t in world.train for f in t.feats}
    test_states = [tuple(f) for t in world.test for f in t.feats]
    return {
        "expert_train_cost": float(np.mean([t.cost for t in world.train])),
        "expert_test_cost": float(np.mean([t.cost for t in world.test])),
        "bc_train_cost": float(np.mean([t.cost for t in world.eval_p])),
        "bc_test_cost": float(np.mean([t.cost for t in world.eval_q])),
        "bc_test_hazard": float(np.mean([t.cost == 1 and len(t) < HORIZON for t in world.eval_q])),
        "oracle_train_stop": float(np.mean([np.any(t.actions != t.expert) for t in world.eval_p])),
        "test_state_coverage": float(np.mean([s in seen for s in test_states])),
    }


def tune_lam_b(
    worlds, name: str, epsilon: float, lams=LAMS_B, executed_weight=TUNING_EXECUTED_WEIGHT
) -> tuple[float, dict]:
    """The validator search's Lambda for (B): the grid value with the lowest validation
    ``tuning_score`` (the claim's tuning metric), averaged over the seeds' worlds."""
    scores = {}
    for lam in lams:
        values = []
        for world in worlds:
            fitted = fit(world, name, epsilon, {"lam": lam}, {"lam": lam})
            outcome = episode_metrics(fitted.rule, world.val_p, world.val_q)
            values.append(tuning_score(outcome, executed_weight))
        scores[lam] = float(np.mean(values))
    return min(scores, key=lambda lam: (scores[lam], lams.index(lam))), scores


def run_pointmaze(
    seeds, quick: bool = False, epsilon: float = 0.05, params: dict | None = None
) -> dict[str, Any]:
    """Environment (B) once, for `seqrejectron-sweeps`: every subject on one world per seed at
    ``epsilon``; Lambda tuned on (B)'s validation split, the baselines' knobs from ``params``
    (the claim run's tuning on (A))."""
    sizes = {k: 20 for k in SIZES_B} if quick else SIZES_B
    params = dict(params or {})
    worlds = {seed: build_pointmaze_world(seed, tuple(sizes.items())) for seed in seeds}
    for name in ("seqrejectron", "per_step_rejectron"):
        params[name] = {"lam": tune_lam_b(list(worlds.values()), name, epsilon)[0]}
    rows = []
    for seed, world in worlds.items():
        for name in SUBJECTS_B:
            fitted = fit(world, name, epsilon, params.get(name, {}), params["seqrejectron"])
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
        "train_spec": TRAIN_SPEC,
        "sizes": sizes,
        "epsilon": epsilon,
        "params": params,
        "worlds": {str(k): pointmaze_summary(w) for k, w in worlds.items()},
        "rows": rows,
    }
