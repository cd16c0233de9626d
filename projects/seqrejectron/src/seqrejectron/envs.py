"""Environment (A): MiniGrid lava crossing, the BFS expert, and the test-dynamics wrappers.

Train dynamics P are MiniGrid's own. Test dynamics Q are a wrapper around the same layout:

- ``wind``: gusts; after a forward move the wind blows with probability ``strength`` and pushes
  the agent one cell in a random compass direction when that cell is empty floor.
- ``ice``: a forward move slides one more cell when, with probability ``strength``, the ice is
  slippery and the next cell is empty floor.

Neither pushes the agent into lava, so the expert (which replans from wherever it is) never fails;
a policy that has only seen nominal trajectories meets states it never saw. The wrapper draws one
uniform number per step whatever the action, so two policies run on the same seeded episode see
the same wind until their actions differ (the coupling of the design note).

The expert is the greedy descent of the BFS distance to the goal over non-lava cells, computed
from the observed layout: forward when the cell ahead is closer to the goal, else turn towards a
closer side cell, else turn left. It is a function of the abstract state ``z = (fwd_ok, left_ok,
right_ok)`` (8 values), which is what the exact policy class of ``core.exact_search`` reads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from minigrid.envs import CrossingEnv

EMPTY, WALL, LAVA, GOAL = 0, 1, 2, 3
LEFT, RIGHT, FORWARD = 0, 1, 2
N_ACTIONS = 3
DIRECTIONS = np.array(
    [(1, 0), (0, 1), (-1, 0), (0, -1)]
)  # MiniGrid: 0 east, 1 south, 2 west, 3 north
SHIFTS = ("none", "wind", "ice")


class ShiftError(ValueError):
    user_facing = True


class ShiftedDynamics(gym.Wrapper):
    """The test dynamics Q (``wind`` or ``ice``) around a MiniGrid env; ``none`` is P."""

    def __init__(self, env: gym.Env, shift: str, strength: float) -> None:
        if shift not in SHIFTS:
            raise ShiftError(f"unknown shift '{shift}'; choose one of {SHIFTS}")
        super().__init__(env)
        self.shift, self.strength = shift, strength
        self.rng = np.random.default_rng(0)

    def seed_dynamics(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def step(self, action):
        # two draws per step, whatever the action: the coupling of two policies on one episode
        draw, heading = self.rng.random(), int(self.rng.integers(4))
        base = self.env.unwrapped
        before = tuple(base.agent_pos)
        obs, reward, terminated, truncated, info = self.env.step(action)
        moved = tuple(base.agent_pos) != before
        if self.shift == "none" or terminated or not moved or draw >= self.strength:
            return obs, reward, terminated, truncated, info
        if self.shift == "wind":
            target = tuple(np.asarray(base.agent_pos) + DIRECTIONS[heading])
        else:
            target = tuple(np.asarray(base.agent_pos) + DIRECTIONS[base.agent_dir])
        if base.grid.get(*target) is None:
            base.agent_pos = np.array(target)
        return obs, reward, terminated, truncated, info


class LavaCrossing(CrossingEnv):
    """MiniGrid's lava crossing whose step skips rendering the partial-view observation: the
    policies read ``features`` (pose and egocentric view from the full grid), and the render
    took 80% of a step."""

    def gen_obs(self):
        return {"direction": self.agent_dir}


def make_env(
    size: int, crossings: int, horizon: int, layout_seed: int, shift: str, strength: float
):
    """A lava-crossing layout (fixed by ``layout_seed``) under dynamics ``shift``."""
    env = ShiftedDynamics(
        LavaCrossing(size=size, num_crossings=crossings, max_steps=horizon), shift, strength
    )
    env.reset(seed=layout_seed)
    return env


def cell_types(env) -> np.ndarray:
    """[W, H] cell codes of the current layout (EMPTY, WALL, LAVA, GOAL)."""
    grid = env.unwrapped.grid
    codes = np.zeros((grid.width, grid.height), dtype=np.int64)
    names = {"wall": WALL, "lava": LAVA, "goal": GOAL}
    for x in range(grid.width):
        for y in range(grid.height):
            cell = grid.get(x, y)
            codes[x, y] = EMPTY if cell is None else names.get(cell.type, WALL)
    return codes


def bfs_distance(cells: np.ndarray) -> np.ndarray:
    """Cell distance to the goal through non-lava, non-wall cells (inf where unreachable)."""
    dist = np.full(cells.shape, np.inf)
    goal = tuple(np.argwhere(cells == GOAL)[0])
    dist[goal] = 0
    queue = deque([goal])
    while queue:
        x, y = queue.popleft()
        for dx, dy in DIRECTIONS:
            nx, ny = x + dx, y + dy
            if cells[nx, ny] in (EMPTY, GOAL) and dist[nx, ny] == np.inf:
                dist[nx, ny] = dist[x, y] + 1
                queue.append((nx, ny))
    return dist


def abstract_state(dist: np.ndarray, pos, direction: int) -> int:
    """z = 4 fwd_ok + 2 left_ok + right_ok: which neighbouring cells are closer to the goal."""
    here = dist[pos[0], pos[1]]
    flags = []
    for turn in (0, -1, 1):  # ahead, left, right
        dx, dy = DIRECTIONS[(direction + turn) % 4]
        flags.append(int(dist[pos[0] + dx, pos[1] + dy] < here))
    return 4 * flags[0] + 2 * flags[1] + flags[2]


# The expert as a table over z: forward if the cell ahead is closer, else turn to a closer side,
# else turn left (the goal is behind).
EXPERT_TABLE = np.array(
    [FORWARD if z & 4 else LEFT if z & 2 else RIGHT if z & 1 else LEFT for z in range(8)]
)


# pi-hat's input size, the same on every grid: (x, y), heading one-hot (4), 3x3 view x 4 codes.
N_FEATURES = 2 + 4 + 36


def features(cells: np.ndarray, pos, direction: int) -> np.ndarray:
    """pi-hat's input: the position as two coordinates scaled to [0, 1], one-hot heading, and the
    egocentric 3x3 view (cell codes one-hot). Shape [N_FEATURES].

    Why coordinates and not one-hot x and y (the encoding before issue 59): a one-hot unit of a
    row or column no demonstration visits is 0 on every training state, so a validator can give it
    any weight at no training cost and disagree with pi-hat on every state in that row, whether
    pi-hat is right there or not; the neural search then stops wherever the state is new, like
    1-NN novelty. With coordinates a cell the wind pushes the agent into lies between cells
    training saw, and a validator can only disagree there by bending its function near states it
    must keep agreeing on (pilot: the method's lead over novelty went from 0 to about 0.07 of
    the test episodes executed, README "Environment (A) since issue 59")."""
    w, h = cells.shape
    out = np.zeros(N_FEATURES, dtype=np.float32)
    out[0] = pos[0] / (w - 1)
    out[1] = pos[1] / (h - 1)
    out[2 + direction] = 1
    forward, right = DIRECTIONS[direction], DIRECTIONS[(direction + 1) % 4]
    k = 0
    for ahead in (1, 0, -1):
        for side in (-1, 0, 1):
            x, y = np.asarray(pos) + ahead * forward + side * right
            code = cells[x, y] if 0 <= x < w and 0 <= y < h else WALL
            out[6 + 4 * k + code] = 1
            k += 1
    return out


@dataclass
class Trajectory:
    """States s_0..s_{T-1} at which an action was taken, and what happened."""

    feats: np.ndarray  # [T, F]
    z: np.ndarray  # [T] abstract states
    expert: np.ndarray  # [T] the expert's action at each state
    actions: np.ndarray  # [T] the action taken
    cost: int  # 1 if the episode ended in lava or ran out of time, else 0
    dense_cost: int = 0  # steps whose action differs from the expert's
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class Layout:
    """One environment instance: size, horizon, dynamics and the cached layout arrays."""

    size: int
    crossings: int
    horizon: int
    layout_seed: int
    shift: str = "none"
    strength: float = 0.0

    def __post_init__(self) -> None:
        self.env = make_env(
            self.size, self.crossings, self.horizon, self.layout_seed, self.shift, self.strength
        )
        self.cells = cell_types(self.env)
        self.dist = bfs_distance(self.cells)
        start_region = (self.cells == EMPTY) & np.isfinite(self.dist)
        start_region[self.size // 2 :, :] = False
        start_region[:, self.size // 2 :] = False
        self.starts = np.argwhere(start_region)

    def with_shift(self, shift: str, strength: float) -> Layout:
        return Layout(self.size, self.crossings, self.horizon, self.layout_seed, shift, strength)

    def expert_action(self, pos, direction: int) -> int:
        return int(EXPERT_TABLE[abstract_state(self.dist, pos, direction)])

    def rollout(self, policy, episode_seed: int) -> Trajectory:
        """Run ``policy(feats [F], z) -> action`` from a seeded start under this layout's
        dynamics until the goal, lava or the horizon."""
        rng = np.random.default_rng(episode_seed)
        base = self.env.unwrapped
        start = self.starts[rng.integers(len(self.starts))]
        base.agent_pos, base.agent_dir = np.array(start), int(rng.integers(4))
        base.step_count = 0
        self.env.seed_dynamics(episode_seed + 7_919)
        feats, zs, experts, actions = [], [], [], []
        cost = 1
        for _ in range(self.horizon):
            pos, direction = tuple(base.agent_pos), base.agent_dir
            f = features(self.cells, pos, direction)
            z = abstract_state(self.dist, pos, direction)
            action = int(policy(f, z))
            feats.append(f)
            zs.append(z)
            experts.append(int(EXPERT_TABLE[z]))
            actions.append(action)
            _, reward, terminated, truncated, _ = self.env.step(action)
            if terminated:
                cost = 0 if reward > 0 else 1
                break
            if truncated:
                break
        experts, actions = np.array(experts), np.array(actions)
        return Trajectory(
            feats=np.stack(feats),
            z=np.array(zs),
            expert=experts,
            actions=actions,
            cost=cost,
            dense_cost=int((experts != actions).sum()),
        )


def expert_policy(feats: np.ndarray, z: int) -> int:
    return int(EXPERT_TABLE[z])
