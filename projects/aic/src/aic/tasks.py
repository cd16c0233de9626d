"""The twelve tasks: real gymnasium environments with oracle or scripted experts, and two
character-level language-modelling tasks.

Grid worlds (MiniGrid, fully observed symbolic grid, actions left/right/forward): the expert is
exact dynamic programming on the known grid, which also gives the exact Q*(s, a) / V*(s) and
the true difficulty (optimal steps to the goal). Robotics (state observations): PointMaze (BFS
over maze cells to the next waypoint + PD control), Reacher (Jacobian-transpose PD on
fingertip-to-target), the inverted pendulums (LQR on MuJoCo's own finite-difference
linearisation). Language: a synthetic variable-depth pointer-chasing stream with unpredictable
noise digits, and characters of a pinned list of Python standard-library source files.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np

from papers_cli import ConfigError, UserError

GAMMA = 0.95  # discount of the grid worlds' exact values: V*(s) = GAMMA ** (steps to the goal)
GRID_ACTIONS = 3  # left, right, forward: all the navigation tasks need
CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
VOCAB = len(CHARS) + 1  # + unknown character
CHAR_INDEX = {c: i for i, c in enumerate(CHARS)}

# Fixed so the corpus is the same file list on every machine with this Python minor version.
STDLIB_FILES = (
    "textwrap.py",
    "heapq.py",
    "bisect.py",
    "colorsys.py",
    "fnmatch.py",
    "string.py",
    "json/encoder.py",
    "json/decoder.py",
    "shlex.py",
    "queue.py",
)


@dataclass(frozen=True)
class Task:
    name: str
    env_id: str  # gymnasium id, or "text:<source>" for the language tasks
    domain: str  # grid | robotics | language
    obs_kind: str  # grid | vector | sequence
    action_kind: str  # discrete | continuous
    return_kind: str  # q | imitation | likelihood (core.step_returns)
    n_actions: int
    max_eval_steps: int = 100
    make_kwargs: dict = field(default_factory=dict)
    action_scale: float = 1.0


TaskName = Literal[
    "lava-crossing",
    "simple-crossing",
    "simple-crossing-11",
    "lava-gap",
    "four-rooms",
    "point-maze-umaze",
    "point-maze-medium",
    "reacher",
    "inverted-pendulum",
    "inverted-double-pendulum",
    "program-lm",
    "stdlib-lm",
]  # the keys of TASKS (test_tasks keeps them equal)
TASKS = {
    t.name: t
    for t in [
        Task("lava-crossing", "MiniGrid-LavaCrossingS9N2-v0", "grid", "grid", "discrete", "q", 3),
        Task("simple-crossing", "MiniGrid-SimpleCrossingS9N1-v0", "grid", "grid", "discrete",
             "q", 3),
        Task("simple-crossing-11", "MiniGrid-SimpleCrossingS11N5-v0", "grid", "grid",
             "discrete", "q", 3),
        Task("lava-gap", "MiniGrid-LavaGapS7-v0", "grid", "grid", "discrete", "q", 3),
        Task("four-rooms", "MiniGrid-FourRooms-v0", "grid", "grid", "discrete", "q", 3,
             max_eval_steps=100),
        Task("point-maze-umaze", "PointMaze_UMaze-v3", "robotics", "vector", "continuous",
             "imitation", 2, max_eval_steps=300, make_kwargs={"continuing_task": False}),
        Task("point-maze-medium", "PointMaze_Medium-v3", "robotics", "vector", "continuous",
             "imitation", 2, max_eval_steps=400, make_kwargs={"continuing_task": False}),
        Task("reacher", "Reacher-v5", "robotics", "vector", "continuous", "imitation", 2,
             max_eval_steps=50),
        Task("inverted-pendulum", "InvertedPendulum-v5", "robotics", "vector", "continuous",
             "imitation", 1, max_eval_steps=300, action_scale=3.0),
        Task("inverted-double-pendulum", "InvertedDoublePendulum-v5", "robotics", "vector",
             "continuous", "imitation", 1, max_eval_steps=300),
        Task("program-lm", "text:synthetic-programs", "language", "sequence", "discrete",
             "likelihood", VOCAB),
        Task("stdlib-lm", "text:python-stdlib", "language", "sequence", "discrete",
             "likelihood", VOCAB),
    ]
}  # fmt: skip


def get_task(name: str, env_id: str | None = None) -> Task:
    """A registered task; ``env_id`` points its expert and model at another gymnasium id of
    the same family (e.g. a larger MiniGrid crossing), checked to build offline."""
    if name not in TASKS:
        raise UserError(f"Unknown task '{name}'. Known tasks: {', '.join(TASKS)} (--data.task).")
    task = TASKS[name]
    if env_id is None or env_id == task.env_id:
        return task
    if task.domain == "language":
        raise ConfigError(f"Task '{name}' reads text, not an environment; drop --data.env_id.")
    make_env(env_id, **task.make_kwargs).close()
    return dataclasses.replace(task, env_id=env_id)


def make_env(env_id: str, **kwargs) -> gym.Env:
    """Build a gymnasium env offline (no rendering); unknown ids are a UserError."""
    import minigrid  # noqa: F401  (registers MiniGrid-*)

    with contextlib.redirect_stdout(io.StringIO()):  # gymnasium-robotics prints a notice
        import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    try:
        env = gym.make(env_id, render_mode=None, **kwargs)
    except gym.error.Error as error:
        raise UserError(
            f"Unknown or unavailable environment id '{env_id}' ({error}). Use a gymnasium id "
            "registered by gymnasium[mujoco], minigrid or gymnasium-robotics, e.g. "
            "MiniGrid-LavaCrossingS9N2-v0, Reacher-v5 or PointMaze_UMaze-v3."
        ) from None
    if env_id.startswith("MiniGrid"):
        from minigrid.wrappers import FullyObsWrapper

        env = FullyObsWrapper(env)
    return env


# ----------------------------------------------------------------------------- grid worlds
DIRECTIONS = np.array([(1, 0), (0, 1), (-1, 0), (0, -1)])  # MiniGrid: right, down, left, up


class GridOracle:
    """Exact shortest-path dynamic programming on a static MiniGrid layout."""

    def __init__(self, env: gym.Env):
        grid = env.unwrapped.grid
        self.width, self.height = grid.width, grid.height
        kinds = np.full((self.width, self.height), "empty", dtype=object)
        for x in range(self.width):
            for y in range(self.height):
                cell = grid.get(x, y)
                if cell is not None:
                    kinds[x, y] = cell.type
        self.lava = kinds == "lava"
        self.passable = (kinds == "empty") | (kinds == "goal") | self.lava
        steps = np.full((self.width, self.height, 4), np.inf)
        steps[kinds == "goal"] = 0.0
        while True:  # Bellman backups until the distances stop changing
            turn = np.minimum(np.roll(steps, 1, axis=2), np.roll(steps, -1, axis=2)) + 1
            forward = np.full_like(steps, np.inf)
            for d, (dx, dy) in enumerate(DIRECTIONS):
                ahead = np.full((self.width, self.height), np.inf)
                src = steps[:, :, d]
                xs = slice(max(dx, 0), self.width + min(dx, 0))
                ys = slice(max(dy, 0), self.height + min(dy, 0))
                xd = slice(max(-dx, 0), self.width + min(-dx, 0))
                yd = slice(max(-dy, 0), self.height + min(-dy, 0))
                ahead[xd, yd] = np.where(
                    self.passable[xs, ys] & ~self.lava[xs, ys], src[xs, ys], np.inf
                )
                forward[:, :, d] = ahead + 1
            new = np.minimum(steps, np.minimum(turn, forward))
            new[kinds == "goal"] = 0.0
            if np.array_equal(new, steps):
                break
            steps = new
        self.steps = steps

    def q_values(self, pos, direction: int) -> np.ndarray:
        """Exact Q*(s, a) / V*(s) for left, right, forward: the fraction of the optimal return
        an action keeps (1 for an optimal action, 0 for stepping into lava). Normalising by
        V*(s) makes a price per step mean the same on near and far states."""
        x, y = int(pos[0]), int(pos[1])
        left = GAMMA ** (1 + self.steps[x, y, (direction - 1) % 4])
        right = GAMMA ** (1 + self.steps[x, y, (direction + 1) % 4])
        fx, fy = x + DIRECTIONS[direction][0], y + DIRECTIONS[direction][1]
        if self.lava[fx, fy]:
            forward = 0.0
        elif self.passable[fx, fy]:
            forward = GAMMA ** (1 + self.steps[fx, fy, direction])
        else:
            forward = GAMMA ** (1 + self.steps[x, y, direction])
        q = np.array([left, right, forward], dtype=np.float64)
        return (q / q.max()).astype(np.float32)

    def difficulty(self, pos, direction: int) -> float:
        return float(self.steps[int(pos[0]), int(pos[1]), direction])


# ----------------------------------------------------------------------------- robotics
class PointMazeExpert:
    """BFS over maze cells to the goal cell; PD control towards the next cell's centre."""

    def __init__(self, env: gym.Env, gain: float = 10.0, damping: float = 1.0):
        self.env, self.gain, self.damping = env, gain, damping

    def _distances(self, goal_cell) -> dict:
        walls = self.env.unwrapped.maze.maze_map
        distance = {tuple(goal_cell): 0}
        queue = collections.deque([tuple(goal_cell)])
        while queue:
            r, c = queue.popleft()
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                cell = (r + dr, c + dc)
                if walls[cell[0]][cell[1]] == 0 and cell not in distance:
                    distance[cell] = distance[(r, c)] + 1
                    queue.append(cell)
        return distance

    def _state(self):
        unwrapped = self.env.unwrapped
        data = unwrapped.point_env.data
        pos, vel = data.qpos[:2].copy(), data.qvel[:2].copy()
        maze = unwrapped.maze
        cell = tuple(maze.cell_xy_to_rowcol(pos))
        goal = unwrapped.goal.copy()
        distance = self._distances(maze.cell_xy_to_rowcol(goal))
        return pos, vel, cell, goal, distance, maze

    def action(self) -> np.ndarray:
        pos, vel, cell, goal, distance, maze = self._state()
        target = goal
        if distance.get(cell, 0) > 0:
            r, c = cell
            neighbours = [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]
            best = min((n for n in neighbours if n in distance), key=distance.get)
            target = maze.cell_rowcol_to_xy(np.array(best))
        return np.clip(self.gain * (target - pos) - self.damping * vel, -1, 1).astype(np.float32)

    def difficulty(self) -> float:
        pos, _, cell, goal, distance, _ = self._state()
        return distance.get(cell, 0) + float(np.linalg.norm(goal - pos))


class ReacherExpert:
    """Jacobian-transpose PD: tau = J^T Kp (target - fingertip) - Kd qdot."""

    def __init__(self, env: gym.Env, gain: float = 0.6, damping: float = 0.2):
        self.env, self.gain, self.damping = env, gain, damping

    def action(self) -> np.ndarray:
        import mujoco

        u = self.env.unwrapped
        model, data = u.model, u.data
        tip = data.body("fingertip").xpos
        error = data.body("target").xpos - tip
        jac = np.zeros((3, model.nv))
        mujoco.mj_jac(model, data, jac, None, tip, model.body("fingertip").id)
        torque = jac[:2, :2].T @ (self.gain * error[:2] / 0.01) - self.damping * data.qvel[:2]
        return np.clip(torque, -1, 1).astype(np.float32)

    def difficulty(self) -> float:
        data = self.env.unwrapped.data
        return float(np.linalg.norm(data.body("target").xpos - data.body("fingertip").xpos))


class LQRExpert:
    """Discrete-time LQR around the upright equilibrium, linearised by MuJoCo's mjd_transitionFD."""

    def __init__(self, env: gym.Env, control_cost: float = 0.1):
        import copy

        import mujoco
        from scipy.linalg import solve_discrete_are

        self.env = env
        # mjd_transitionFD does not support RK4; Euler gives the same linearisation to O(dt).
        model = copy.deepcopy(env.unwrapped.model)
        model.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        n, m = 2 * model.nv, model.nu
        a, b = np.zeros((n, n)), np.zeros((n, m))
        mujoco.mjd_transitionFD(model, data, 1e-6, True, a, b, None, None)
        # the env holds each action for frame_skip physics steps: linearise that map
        skip = env.unwrapped.frame_skip
        b = sum(np.linalg.matrix_power(a, i) @ b for i in range(skip))
        a = np.linalg.matrix_power(a, skip)
        q, r = np.eye(n), control_cost * np.eye(m)
        p = solve_discrete_are(a, b, q, r)
        self.gain = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        self.cost_to_go = p
        self.low, self.high = env.action_space.low, env.action_space.high

    def _x(self) -> np.ndarray:
        data = self.env.unwrapped.data
        return np.concatenate([data.qpos, data.qvel])

    def action(self) -> np.ndarray:
        return np.clip(-self.gain @ self._x(), self.low, self.high).astype(np.float32)

    def difficulty(self) -> float:
        x = self._x()
        return float(x @ self.cost_to_go @ x)


def make_expert(task: Task, env: gym.Env):
    if task.env_id.startswith("PointMaze"):
        return PointMazeExpert(env)
    if task.env_id.startswith("Reacher"):
        return ReacherExpert(env)
    if "Pendulum" in task.env_id:
        return LQRExpert(env)
    raise UserError(f"No scripted expert for {task.env_id}")


def observe(task: Task, obs) -> np.ndarray:
    """The policy's observation: the symbolic grid, or a flat state vector."""
    if task.obs_kind == "grid":
        return obs["image"].astype(np.int64)
    if isinstance(obs, dict):  # PointMaze: position, velocity and the goal
        return np.concatenate([obs["observation"], obs["desired_goal"]]).astype(np.float32)
    return np.asarray(obs, dtype=np.float32)


class Episode:
    """One environment with its oracle: the observation, expert labels and true values."""

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.env = make_env(task.env_id, **task.make_kwargs)
        obs, _ = self.env.reset(seed=seed)
        self.obs, self.done, self.total_return, self.length = obs, False, 0.0, 0
        self.success = False
        if task.domain == "grid":
            self.oracle = GridOracle(self.env)
        else:
            self.oracle = make_expert(task, self.env)

    def policy_obs(self) -> np.ndarray:
        return observe(self.task, self.obs)

    def expert_action(self):
        if self.task.domain == "grid":
            return int(np.argmax(self.q_values()))
        return self.oracle.action()

    def q_values(self) -> np.ndarray:
        u = self.env.unwrapped
        return self.oracle.q_values(u.agent_pos, u.agent_dir)

    def difficulty(self) -> float:
        if self.task.domain == "grid":
            u = self.env.unwrapped
            return self.oracle.difficulty(u.agent_pos, u.agent_dir)
        return self.oracle.difficulty()

    def step(self, action) -> None:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.obs, self.total_return, self.length = (
            obs,
            self.total_return + float(reward),
            (self.length + 1),
        )
        if self.task.domain == "grid":
            self.success = self.success or (terminated and reward > 0)
        elif "success" in info:
            self.success = self.success or bool(info["success"])
        self.done = terminated or truncated or self.length >= self.task.max_eval_steps

    def close(self) -> None:
        self.env.close()


def collect_states(task: Task, n_states: int, seed: int, explore: float = 0.3) -> dict:
    """Expert-labelled states from expert rollouts with epsilon-random actions (so off-path
    states are covered). Returns obs, target (expert action), difficulty and, for grids, Q*."""
    rng = np.random.default_rng(seed)
    obs, targets, difficulty, q_values = [], [], [], []
    episode_seed = seed * 100_000
    while len(obs) < n_states:
        episode = Episode(task, episode_seed)
        episode_seed += 1
        while not episode.done and len(obs) < n_states:
            label = episode.expert_action()
            if task.domain == "grid":
                if not np.isfinite(episode.difficulty()):
                    break
                q_values.append(episode.q_values())
            obs.append(episode.policy_obs())
            targets.append(label)
            difficulty.append(episode.difficulty())
            if rng.random() < explore:
                action = (
                    int(rng.integers(GRID_ACTIONS))
                    if task.domain == "grid"
                    else np.clip(label + rng.normal(0, 0.5, label.shape), -1, 1) * task.action_scale
                    if task.action_kind == "continuous"
                    else label
                )
            else:
                action = label
            episode.step(action)
        episode.close()
    out = {
        "obs": np.stack(obs),
        "target": np.asarray(targets, dtype=np.int64 if task.domain == "grid" else np.float32),
        "difficulty": np.asarray(difficulty, dtype=np.float32),
    }
    if q_values:
        out["q"] = np.stack(q_values)
    return out


# ----------------------------------------------------------------------------- language
def encode_text(text: str) -> np.ndarray:
    return np.array([CHAR_INDEX.get(c, len(CHARS)) for c in text], dtype=np.int64)


def stdlib_corpus() -> str:
    """The pinned standard-library files of this interpreter, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in STDLIB_FILES if not (root / f).is_file()]
    if missing:
        raise UserError(f"The Python standard library under {root} lacks {missing}.")
    return "\n".join((root / f).read_text(encoding="utf-8") for f in STDLIB_FILES)


def read_text_corpus(path: str | None) -> str:
    """Paper-scale language data: a .txt file or a folder of .txt files; a clear error if absent."""
    from papers_data import DatasetNotFoundError

    how = (
        "Give --data.text_path a UTF-8 .txt file or a folder of .txt files (the paper-scale "
        "language corpus)."
    )
    if path is None:
        raise DatasetNotFoundError("aic-text", None, ["*.txt"], how)
    root = Path(path).expanduser()
    files = [root] if root.is_file() else sorted(root.glob("*.txt")) if root.is_dir() else []
    if not files:
        raise DatasetNotFoundError("aic-text", root, ["*.txt"], how, missing=[str(root)])
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


PROGRAM_MAX_DEPTH = 4


def longest_program(max_depth: int = PROGRAM_MAX_DEPTH) -> int:
    """Characters from a program's first statement to its answer: depth + 1 statements of
    four characters (``b=7;``), the query ``?e=`` and the answer digit."""
    return 4 * (max_depth + 1) + 3 + 1


def synthetic_programs(
    n_chars: int, seed: int, max_depth: int = PROGRAM_MAX_DEPTH, noise_len: int = 6
):
    """Pointer-chasing programs and noise segments: text and per-character depth labels.

    A program such as ``b=7;e=b;a=3;?e=7|`` defines a chain of ``depth`` variables (plus a
    distractor) and queries its end; the answer digit needs ``depth`` dereferences. Noise
    segments ``#418093#`` hold uniformly random digits that no amount of compute predicts.
    Labels: depth for answer characters, -1 for noise digits, 0 for everything else.
    """
    rng = random.Random(seed)
    letters = "abcdefgh"
    text, labels = [], []

    def emit(s: str, label: int = 0) -> None:
        text.append(s)
        labels.extend([label] * len(s))

    while sum(map(len, text)) < n_chars:
        if rng.random() < 0.35:
            emit("#")
            for _ in range(noise_len):
                emit(str(rng.randrange(10)), -1)
            emit("#")
            continue
        depth = rng.randint(1, max_depth)
        names = rng.sample(letters, depth + 1)
        chain, distractor = names[:depth], names[depth]
        value = str(rng.randrange(10))
        statements = [f"{chain[0]}={value};"]
        statements += [f"{chain[i]}={chain[i - 1]};" for i in range(1, depth)]
        statements.append(f"{distractor}={rng.randrange(10)};")
        rng.shuffle(statements)
        emit("".join(statements) + f"?{chain[-1]}=")
        emit(value, depth)
        emit("|")
    joined = "".join(text)[:n_chars]
    return joined, np.asarray(labels[:n_chars], dtype=np.int64)


def text_windows(tokens: np.ndarray, context: int, n: int, seed: int, labels=None) -> dict:
    """n random (context window, next character) pairs from a token stream."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - context - 1, size=n)
    index = starts[:, None] + np.arange(context)
    out = {
        "obs": tokens[index],
        "target": tokens[starts + context],
        "difficulty": (
            labels[starts + context].astype(np.float32)
            if labels is not None
            else np.zeros(n, np.float32)
        ),
    }
    return out


def obs_shape(task: Task, context: int = 32) -> tuple[int, ...]:
    """The shape of one policy observation of a task."""
    if task.domain == "language":
        return (context,)
    env = make_env(task.env_id, **task.make_kwargs)
    shape = observe(task, env.reset(seed=0)[0]).shape
    env.close()
    return tuple(shape)
