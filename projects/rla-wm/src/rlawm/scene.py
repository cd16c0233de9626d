"""The miniature's simulator: a MuJoCo push scene rendered offscreen at 64x64.

A round pusher (two slide joints driven by velocity actuators) pushes a box (free joint) on a
table; a fixed goal patch sits on the table. Each episode draws a HIDDEN friction and box mass,
so one start and one action chunk have several outcomes (a light, slippery box slides far, a
heavy, sticky one barely moves): the truth is multimodal, which is what breaks regression.

Rendering uses EGL (``MUJOCO_GL=egl``, set here before mujoco is imported when unset). Shadows
are switched off before the first render: on llvmpipe they cost about 10x the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

FRICTIONS = (0.2, 1.0)
MASSES = (0.1, 0.6)
ACTION_DIM = 2
GOAL_XY = (0.12, 0.12)
GOAL_RADIUS = 0.07
TABLE_HALF = 0.3
SUBSTEPS = 10  # physics steps per action (timestep 0.01 s: one action lasts 0.1 s)
MAX_SPEED = 0.3  # m/s commanded pusher speed at |action| = 1

WALLS = "\n".join(
    f'<geom name="wall_{name}" type="box" pos="{x} {y} 0.02" size="{sx} {sy} 0.02" '
    'rgba="0.3 0.3 0.3 1"/>'
    for name, x, y, sx, sy in (
        ("n", 0, TABLE_HALF, TABLE_HALF, 0.01),
        ("s", 0, -TABLE_HALF, TABLE_HALF, 0.01),
        ("e", TABLE_HALF, 0, 0.01, TABLE_HALF),
        ("w", -TABLE_HALF, 0, 0.01, TABLE_HALF),
    )
)
GOAL = (
    f'<geom name="goal" type="cylinder" pos="{GOAL_XY[0]} {GOAL_XY[1]} 0.001" '
    f'size="{GOAL_RADIUS} 0.001" rgba="0.3 0.6 0.3 1" contype="0" conaffinity="0"/>'
)
SCENE_XML = f"""
<mujoco model="push">
  <option timestep="0.01" gravity="0 0 -9.81"/>
  <visual><quality shadowsize="0"/><global offwidth="256" offheight="256"/></visual>
  <worldbody>
    <light pos="0 0 1.5" dir="0 0 -1" castshadow="false"/>
    <camera name="top" pos="0 0 0.75" xyaxes="1 0 0 0 1 0" fovy="48"/>
    <geom name="table" type="plane" size="{TABLE_HALF} {TABLE_HALF} 0.01" rgba="0.55 0.55 0.5 1"/>
    {GOAL}
    {WALLS}
    <body name="pusher" pos="0 0 0.025">
      <joint name="px" type="slide" axis="1 0 0" damping="0"/>
      <joint name="py" type="slide" axis="0 1 0" damping="0"/>
      <geom name="pusher" type="cylinder" size="0.025 0.02" mass="1" rgba="0.85 0.2 0.2 1"/>
    </body>
    <body name="box" pos="0 0 0.03">
      <freejoint name="box"/>
      <geom name="box" type="box" size="0.04 0.04 0.03" mass="0.3" rgba="0.2 0.3 0.85 1"/>
    </body>
  </worldbody>
  <actuator>
    <velocity name="vx" joint="px" kv="40" ctrlrange="-{MAX_SPEED} {MAX_SPEED}"/>
    <velocity name="vy" joint="py" kv="40" ctrlrange="-{MAX_SPEED} {MAX_SPEED}"/>
  </actuator>
</mujoco>
"""


@dataclass
class Hidden:
    """The per-episode physics the camera cannot see."""

    friction: float
    mass: float


class PushScene:
    """One MuJoCo push scene: ``reset`` sets a start and hidden physics, ``step`` one action.

    Observations are 64x64 RGB frames with a foreground mask (pusher and box pixels, from
    MuJoCo's segmentation rendering); ``qpos`` is [pusher x, y, box x, y].
    """

    def __init__(self, size: int = 64):
        self.model = mujoco.MjModel.from_xml_string(SCENE_XML)
        self.model.vis.quality.shadowsize = 0
        self.model.light_castshadow[:] = 0
        self.data = mujoco.MjData(self.model)
        self.size = size
        self.renderer = mujoco.Renderer(self.model, size, size)
        self.segmenter = mujoco.Renderer(self.model, size, size)
        self.segmenter.enable_segmentation_rendering()
        self.box_geom = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "box")
        self.pusher_geom = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "pusher")
        self.table_geom = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "table")
        self.box_body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, "box")
        self.hidden = Hidden(FRICTIONS[0], MASSES[0])

    def close(self) -> None:
        self.renderer.close()
        self.segmenter.close()

    def set_hidden(self, hidden: Hidden) -> None:
        """Friction of the box (and the table it slides on) and the box's mass."""
        self.hidden = hidden
        self.model.geom_friction[self.box_geom, 0] = hidden.friction
        self.model.geom_friction[self.table_geom, 0] = hidden.friction
        self.model.body_mass[self.box_body] = hidden.mass

    def reset(self, pusher_xy, box_xy, hidden: Hidden) -> None:
        mujoco.mj_resetData(self.model, self.data)
        self.set_hidden(hidden)
        self.data.qpos[0:2] = pusher_xy
        self.data.qpos[2:4] = box_xy
        self.data.qpos[4] = 0.03
        self.data.qpos[5:9] = (1.0, 0.0, 0.0, 0.0)
        mujoco.mj_forward(self.model, self.data)

    def step(self, action) -> None:
        """Apply one action in [-1, 1]^2 (a pusher velocity command) for SUBSTEPS physics steps."""
        self.data.ctrl[:] = np.clip(np.asarray(action, dtype=np.float64), -1, 1) * MAX_SPEED
        mujoco.mj_step(self.model, self.data, nstep=SUBSTEPS)

    def qpos(self) -> np.ndarray:
        """[pusher x, pusher y, box x, box y] (float32)."""
        return np.array([*self.data.qpos[0:2], *self.data.qpos[2:4]], dtype=np.float32)

    def success(self) -> bool:
        """The box centre lies inside the goal patch."""
        box = self.data.qpos[2:4]
        return bool(np.hypot(box[0] - GOAL_XY[0], box[1] - GOAL_XY[1]) < GOAL_RADIUS)

    def render(self) -> tuple[np.ndarray, np.ndarray]:
        """RGB uint8 [H, W, 3] and the foreground mask bool [H, W] (pusher or box pixels)."""
        self.renderer.update_scene(self.data, camera="top")
        rgb = self.renderer.render().copy()
        self.segmenter.update_scene(self.data, camera="top")
        segmentation = self.segmenter.render()[..., 0]  # geom id per pixel (-1 = background)
        mask = (segmentation == self.box_geom) | (segmentation == self.pusher_geom)
        return rgb, mask


def draw_hidden(rng: np.random.Generator) -> Hidden:
    return Hidden(float(rng.choice(FRICTIONS)), float(rng.choice(MASSES)))


def draw_start(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A box away from the goal and a pusher a few centimetres behind it (contact comes soon)."""
    box = rng.uniform(-0.15, 0.05, size=2)
    angle = rng.uniform(0, 2 * np.pi)
    pusher = box + 0.09 * np.array([np.cos(angle), np.sin(angle)])
    return np.clip(pusher, -0.25, 0.25), box


def scripted_action(qpos: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """A noisy push: move behind the box (seen from the goal), then push it toward the goal."""
    pusher, box = qpos[:2], qpos[2:4]
    to_goal = np.asarray(GOAL_XY) - box
    to_goal = to_goal / (np.linalg.norm(to_goal) + 1e-6)
    behind = box - 0.07 * to_goal
    offset = behind - pusher
    # not yet behind the box: go there first
    direction = offset if np.linalg.norm(offset) > 0.03 else to_goal
    action = direction / (np.linalg.norm(direction) + 1e-6)
    return np.clip(action + noise * rng.normal(size=2), -1, 1).astype(np.float32)


def rollout_episode(
    scene: PushScene,
    rng: np.random.Generator,
    length: int,
    *,
    random_share: float = 0.3,
    noise: float = 0.3,
    hidden: Hidden | None = None,
    start: tuple[np.ndarray, np.ndarray] | None = None,
    actions: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One episode: frames uint8 [T+1, H, W, 3], masks [T+1, H, W], actions [T, 2], qpos [T+1, 4].

    Actions come from the noisy scripted pusher, replaced by uniform random moves with
    probability ``random_share`` per step, unless ``actions`` are given (then they are replayed).
    """
    hidden = hidden or draw_hidden(rng)
    pusher, box = start if start is not None else draw_start(rng)
    scene.reset(pusher, box, hidden)
    frames, masks, qpos, taken = [], [], [], []
    for t in range(length + 1):
        rgb, mask = scene.render()
        frames.append(rgb)
        masks.append(mask)
        qpos.append(scene.qpos())
        if t == length:
            break
        if actions is not None:
            action = actions[t]
        elif rng.random() < random_share:
            action = rng.uniform(-1, 1, size=2).astype(np.float32)
        else:
            action = scripted_action(qpos[-1], rng, noise)
        taken.append(np.asarray(action, dtype=np.float32))
        scene.step(action)
    return {
        "frames": np.stack(frames),
        "masks": np.stack(masks),
        "actions": np.stack(taken),
        "qpos": np.stack(qpos),
        "friction": np.float32(hidden.friction),
        "mass": np.float32(hidden.mass),
        "success": np.bool_(scene.success()),
    }
