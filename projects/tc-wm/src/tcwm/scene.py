"""The miniature's two environments: MuJoCo scenes rendered offscreen at 64x64 RGB on CPU.

Both take 2-d actions in [-1, 1] (outside values are clipped, as the originals' ``ctrllimited``
motors do) and have a 4-d state; from the same state under the same actions both reproduce the
original gymnasium env's trajectory bit for bit (tested). Frames come from an orthographic top
camera, so a world position maps linearly to a pixel (``Scene.world_to_pixel``). Rendering uses
EGL (``MUJOCO_GL=egl``, set below before mujoco is imported when unset) with shadows off
(``<quality shadowsize="0"/>``, every light ``castshadow`` false; on llvmpipe shadows cost 10x
or more) and coarser spheres and capsules than MuJoCo's default (about 3x faster, invisible at
64 pixels): about 1 ms a frame in the maze, 2-3 ms for the reacher on a busy 2-core machine.

"pointmaze": gymnasium-robotics' PointMaze_UMaze (v3/v4), rebuilt as one MJCF here.
  Taken from gymnasium-robotics 1.4 (``envs/assets/point/point.xml``, ``envs/maze/maze_v4.py``,
  ``point.py``, ``point_maze.py``, ``maps.py``): the U_MAZE map with ``maze_size_scaling`` 1 and
  ``maze_height`` 0.4 (walls are unit box geoms at the same positions); the ball (sphere geom of
  radius 0.1, density 1000, ``margin`` 0.002, ``condim`` 1, friction .5) on two slide joints with
  damping 1, motors with gear 100 and ctrlrange [-1, 1]; timestep 0.01, Euler, 20 solver
  iterations, no gravity; frame_skip 1 and the velocity clip to [-5, 5] before every step
  (``PointEnv._clip_velocity``); the drawn ball is the green site of radius 0.2 (the collision
  sphere is invisible, as there); starts as ``add_xy_position_noise``: a free cell's centre plus
  U(-0.25, 0.25) per coordinate, at rest. Units are the original's (a maze cell is 1 x 1).
  Differs: the floor is one flat colour (the original's checker texture, first colour) and does
  not collide (there it touches the ball only along z, which has no degree of freedom); no red
  target site (goals are
  images); a fixed orthographic top camera over [-2, 2]^2 (the 3 x 3 interior and half of the
  outer walls: 16 pixels per cell) instead of the free camera; mocap distractors (below).
  Success: ||(x, y) - goal (x, y)|| < 0.3, the design note's threshold (gymnasium uses 0.45),
  in the original's units since the scale is kept.

"reacher": gymnasium's Reacher (v5, ``envs/mujoco/assets/reacher.xml``).
  Kept: the arm verbatim (two links of 0.1, hinge joints with armature 1 and damping 1, joint1
  limited to [-3, 3], fingertip 0.11 along the second link), the arena, the motors (gear 200,
  ctrlrange [-1, 1]), timestep 0.01, RK4, frame_skip 2. State = (joint0, joint1 angle,
  their angular velocities); joint0 is unlimited, so its angle is not wrapped.
  Changed: the target body (and its two slide joints) removed, goals are images; thicker
  visual-only copies of the links (radius 0.02) and the fingertip (radius 0.025) with
  density 0, so the arm is visible at 64 pixels without changing masses or inertias (the tests
  compare them with the original's); an orthographic top camera over [-0.32, 0.32]^2 (the whole
  arena) with a brighter headlight (ambient .3, diffuse .6: the ground shows near its own
  colour); starts drawn over the whole joint space (joint0 ~ U(-pi, pi), joint1 ~ U(-2.8, 2.8),
  at rest) rather than gymnasium's U(-0.1, 0.1) around the straight arm, so the random-action
  data cover the workspace. Success: the fingertip within 0.05 of the goal fingertip position
  (chosen [G]: dm_control's reacher-easy target radius; gymnasium's Reacher has no success test).

Task-irrelevant detail [G: the design note's guess, section 4, not the paper's]: a per-episode
``Nuisance`` with strength kappa in [0, 1]: floor and wall (arena) colours moved from their
defaults by kappa * 0.5 * U(-1, 1) per RGB channel, and round(kappa * 2) (half up) distractor
balls of random colour and size moving on circles (random centre, radius, phase and angular
speed) as a function of the time step only. They are mocap bodies whose geoms have
contype = conaffinity = 0 (no physical effect) and sit low in the floor so that they never cover
the agent (walls do cover them). Drawn colours keep an RGB distance of at least 0.3 from the
agent's colours (and walls from the floor), so the state stays readable from every frame.
kappa = 0 gives the default colours and no visible distractor. A goal image is rendered from a
goal state with its own nuisance draw.

Random-action data follow DINO-WM: actions uniform in [-1, 1]^2, each held for ``action_repeat``
env steps (default 5 in the maze, as DINO-WM's frameskip; 1 for the reacher, whose motors are
strong enough that five held steps can spin the arm by radians between frames: at 1, random
actions keep the joints at about 7-12 rad/s rms, 0.15-0.35 rad a frame; the maze ball moves
about 0.07 units, one pixel, a frame).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

# Imported here, before any renderer can exist: importing transformers' model classes after a
# MuJoCo EGL renderer has been created segfaults the process (seen with mujoco 4.0 + llvmpipe).
# Tests and pipelines that import this module are safe whatever they import afterwards.
from transformers import Dinov2Model  # noqa: F401

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

SceneName = Literal["pointmaze", "reacher"]
SCENE_NAMES: tuple[str, ...] = get_args(SceneName)
IMAGE_SIZE = 64
MAX_DISTRACTORS = 2
COLOUR_AMPLITUDE = 0.5  # per-channel colour shift at kappa = 1 [G]
MIN_CONTRAST = 0.3  # least RGB distance of a drawn colour from every agent colour [G]
PATH_SPEED = (0.05, 0.25)  # |angular speed| of a distractor's circle, radians per time step [G]
HIDDEN_Z = -5.0  # where unused distractors wait, under the floor
# Coarser spheres and capsules than MuJoCo's default (28 slices, 16 stacks): invisible at 64
# pixels, about 3x faster on llvmpipe.
LOW_TESSELLATION = 'numslices="12" numstacks="8" numquads="1"'


@dataclass(frozen=True, eq=False)
class Nuisance:
    """One episode's task-irrelevant detail [G]. K = number of visible distractors.

    ``distractor_radius`` is the radius of the disc a distractor shows on the floor.
    """

    scene: SceneName
    kappa: float
    floor_rgb: np.ndarray  # [3]
    wall_rgb: np.ndarray  # [3]
    distractor_rgb: np.ndarray  # [K, 3]
    distractor_radius: np.ndarray  # [K]
    path_centre: np.ndarray  # [K, 2]
    path_radius: np.ndarray  # [K]
    path_phase: np.ndarray  # [K]
    path_speed: np.ndarray  # [K] radians per time step (signed)

    @property
    def n_distractors(self) -> int:
        return len(self.distractor_radius)

    def distractor_xy(self, t: int) -> np.ndarray:
        """Distractor centres at time step t: [K, 2]."""
        angle = self.path_phase + self.path_speed * t
        return self.path_centre + self.path_radius[:, None] * np.stack(
            [np.cos(angle), np.sin(angle)], axis=-1
        )


def check_kappa(kappa: float) -> float:
    kappa = float(kappa)
    if not 0.0 <= kappa <= 1.0:  # also rejects NaN
        raise ValueError(f"kappa (nuisance strength) must lie in [0, 1], got {kappa}")
    return kappa


def n_distractors(kappa: float) -> int:
    """round(kappa * MAX_DISTRACTORS), halves rounded up: 0 at kappa < 0.25, 2 at kappa >= 0.75."""
    return int(np.floor(check_kappa(kappa) * MAX_DISTRACTORS + 0.5))


class Scene:
    """One MuJoCo model, its data and (created on the first render) one 64x64 renderer.

    Subclasses give the MJCF and the task: ``position`` (the 2-d quantity success is measured
    on), ``sample_start`` and the nuisance's ranges.
    """

    name: SceneName
    state_dim = 4
    action_dim = 2
    frame_skip: int  # physics steps per env step
    default_action_repeat: int  # env steps per recorded step in random-action data
    default_success_radius: float
    camera_extent: float  # the orthographic camera sees [-extent/2, extent/2]^2
    floor_geoms: tuple[str, ...]
    agent_rgb: tuple[tuple[float, float, float], ...]  # the agent's drawn colours (in the MJCF)
    wall_geoms: tuple[str, ...]
    # nuisance ranges [G]
    distractor_radius_range: tuple[float, float]  # radius of the disc seen on the floor
    distractor_top: float  # z of a distractor's top: below the agent's silhouette
    floor_z: float
    path_centre_half: float  # circle centres ~ U(-half, half)^2
    path_radius_range: tuple[float, float]

    def __init__(self, success_radius: float | None = None, image_size: int = IMAGE_SIZE):
        self.model = mujoco.MjModel.from_xml_string(self.xml())
        self.model.vis.quality.shadowsize = 0
        self.model.light_castshadow[:] = 0
        self.data = mujoco.MjData(self.model)
        self.image_size = int(image_size)
        if success_radius is None:
            success_radius = self.default_success_radius
        if not success_radius > 0:
            raise ValueError(f"success_radius must be positive, got {success_radius}")
        self.success_radius = float(success_radius)
        self._renderer: mujoco.Renderer | None = None

        def geom(name: str) -> int:
            return mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, name)

        self._floor_ids = [geom(name) for name in self.floor_geoms]
        self._wall_ids = [geom(name) for name in self.wall_geoms]
        self._distractor_geoms = [geom(f"distractor{k}") for k in range(MAX_DISTRACTORS)]
        self._default_rgba = self.model.geom_rgba.copy()
        self.default_floor_rgb = self._default_rgba[self._floor_ids[0], :3].copy()
        self.default_wall_rgb = self._default_rgba[self._wall_ids[0], :3].copy()
        self.set_state(self.sample_start(np.random.default_rng(0)))

    # --- the MJCF -------------------------------------------------------------------------
    def xml(self) -> str:
        raise NotImplementedError

    def distractor_xml(self) -> str:
        """Mocap balls with no physical effect; their sphere radius is set per render."""
        largest = sphere_radius(self.distractor_radius_range[1], self.distractor_top - self.floor_z)
        return "\n".join(
            f'<body name="distractor{k}" mocap="true" pos="0 0 {HIDDEN_Z}">'
            f'<geom name="distractor{k}" type="sphere" size="{largest}" contype="0" '
            f'conaffinity="0" density="0" rgba="1 1 1 0"/></body>'
            for k in range(MAX_DISTRACTORS)
        )

    def camera_xml(self, height: float) -> str:
        return (
            f'<camera name="top" pos="0 0 {height}" xyaxes="1 0 0 0 1 0" projection="orthographic" '
            f'fovy="{self.camera_extent}"/>'
        )

    # --- physics --------------------------------------------------------------------------
    def set_state(self, state) -> None:
        """Reset the simulation to a state (solver warm start included, so a rollout from a
        state depends on the state and the actions only)."""
        state = self._check_state(state)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:2] = state[:2]
        self.data.qvel[:2] = state[2:4]
        mujoco.mj_forward(self.model, self.data)

    def get_state(self) -> np.ndarray:
        """[4] float64: the two joint positions, then their velocities."""
        return np.concatenate([self.data.qpos[:2], self.data.qvel[:2]])

    def step(self, action, action_repeat: int = 1) -> np.ndarray:
        """Apply one action for ``action_repeat`` env steps (frame_skip physics steps each);
        returns the new state."""
        action = self.check_action(action)
        for _ in range(check_repeat(action_repeat)):
            self._before_env_step()
            self.data.ctrl[:] = action
            mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)
        return self.get_state()

    def _before_env_step(self) -> None:
        """A hook for what the original env does before each step."""

    def check_action(self, action) -> np.ndarray:
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.action_dim,):
            raise ValueError(
                f"{self.name}: an action has shape ({self.action_dim},), got {action.shape}"
            )
        if not np.all(np.isfinite(action)):
            raise ValueError(f"{self.name}: the action is not finite: {action}")
        return np.clip(action, -1.0, 1.0)

    def _check_state(self, state) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        if state.shape != (self.state_dim,):
            raise ValueError(
                f"{self.name}: a state has shape ({self.state_dim},), got {state.shape}"
            )
        if not np.all(np.isfinite(state)):
            raise ValueError(f"{self.name}: the state is not finite: {state}")
        return state

    # --- the task -------------------------------------------------------------------------
    def position(self, state) -> np.ndarray:
        """The 2-d quantity success is measured on: [..., S] -> [..., 2]."""
        raise NotImplementedError

    def distance(self, state, goal_state) -> np.ndarray:
        """||position(state) - position(goal_state)||, batched over leading dimensions."""
        return np.linalg.norm(self.position(state) - self.position(goal_state), axis=-1)

    def success(self, state, goal_state) -> bool:
        """The position lies strictly within ``success_radius`` of the goal's position."""
        return bool(self.distance(state, goal_state) < self.success_radius)

    def sample_start(self, rng: np.random.Generator) -> np.ndarray:
        """A start state [4] from the data distribution."""
        raise NotImplementedError

    # --- rendering ------------------------------------------------------------------------
    @property
    def renderer(self) -> mujoco.Renderer:
        if self._renderer is None:  # created once: it costs far more than a frame
            self._renderer = mujoco.Renderer(self.model, self.image_size, self.image_size)
        return self._renderer

    def render(
        self, nuisance: Nuisance | None = None, t: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The current state seen from the top camera with the nuisance at time step t:
        uint8 [H, W, 3] (written into ``out`` when given). ``None``: the kappa = 0 look."""
        self.apply_nuisance(nuisance, t)
        mujoco.mj_kinematics(self.model, self.data)  # positions only: the dynamics are untouched
        mujoco.mj_camlight(self.model, self.data)
        self.renderer.update_scene(self.data, camera="top")
        return self.renderer.render(out=out)

    def apply_nuisance(self, nuisance: Nuisance | None, t: int) -> None:
        rgba = self.model.geom_rgba
        rgba[:] = self._default_rgba
        self.data.mocap_pos[:] = (0.0, 0.0, HIDDEN_Z)
        if nuisance is None:
            return
        if nuisance.scene != self.name:
            raise ValueError(f"a nuisance drawn for {nuisance.scene!r} cannot render {self.name!r}")
        rgba[self._floor_ids, :3] = nuisance.floor_rgb
        rgba[self._wall_ids, :3] = nuisance.wall_rgb
        cap = self.distractor_top - self.floor_z
        for k, (xy, disc) in enumerate(
            zip(nuisance.distractor_xy(t), nuisance.distractor_radius, strict=True)
        ):
            geom_id = self._distractor_geoms[k]
            radius = sphere_radius(disc, cap)
            self.model.geom_size[geom_id, 0] = radius
            rgba[geom_id] = (*nuisance.distractor_rgb[k], 1.0)
            self.data.mocap_pos[k] = (xy[0], xy[1], self.distractor_top - radius)

    def world_to_pixel(self, xy) -> np.ndarray:
        """(row, column) of world (x, y) in a frame ([..., 2] -> [..., 2], float)."""
        xy = np.asarray(xy, dtype=np.float64)
        scale = self.image_size / self.camera_extent
        return np.stack(
            [self.image_size / 2 - xy[..., 1] * scale, self.image_size / 2 + xy[..., 0] * scale],
            axis=-1,
        )

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> Scene:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sphere_radius(disc_radius: float, cap_height: float) -> float:
    """The radius of a sphere whose cap of height ``cap_height`` shows a disc of ``disc_radius``."""
    return (disc_radius**2 + cap_height**2) / (2 * cap_height)


def check_repeat(action_repeat: int) -> int:
    if int(action_repeat) != action_repeat or action_repeat < 1:
        raise ValueError(f"action_repeat must be a positive integer, got {action_repeat}")
    return int(action_repeat)


# --- PointMaze ------------------------------------------------------------------------------
U_MAZE = (  # gymnasium_robotics.envs.maze.maps.U_MAZE: 1 = wall, 0 = free
    (1, 1, 1, 1, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 0, 1),
    (1, 0, 0, 0, 1),
    (1, 1, 1, 1, 1),
)
MAZE_HEIGHT = 0.4  # PointMaze's maze_height (maze_size_scaling = 1)
BALL_RADIUS = 0.1
MAX_BALL_SPEED = 5.0  # PointEnv._clip_velocity
START_NOISE = 0.25  # MazeEnv.position_noise_range


def cell_xy(row: int, col: int) -> tuple[float, float]:
    """Maze.cell_rowcol_to_xy with maze_size_scaling 1."""
    rows, cols = len(U_MAZE), len(U_MAZE[0])
    return (col + 0.5) - cols / 2, rows / 2 - (row + 0.5)


WALL_CELLS = tuple((i, j) for i, row in enumerate(U_MAZE) for j, cell in enumerate(row) if cell)
FREE_CELLS = tuple((i, j) for i, row in enumerate(U_MAZE) for j, cell in enumerate(row) if not cell)


class PointMazeScene(Scene):
    name = "pointmaze"
    frame_skip = 1
    default_action_repeat = 5
    default_success_radius = 0.3
    camera_extent = 4.0
    floor_geoms = ("floor",)
    agent_rgb = ((0.3, 0.6, 0.3),)
    wall_geoms = tuple(f"block_{i}_{j}" for i, j in WALL_CELLS)
    distractor_radius_range = (0.15, 0.3)
    distractor_top = -0.02  # the agent's drawn sphere is centred at z = 0
    floor_z = -0.1
    path_centre_half = 1.2
    path_radius_range = (0.3, 1.2)

    def xml(self) -> str:
        half = MAZE_HEIGHT / 2
        walls = "\n".join(
            f'<geom name="block_{i}_{j}" type="box" pos="{x} {y} {half}" '
            f'size="0.5 0.5 {half}" contype="1" conaffinity="1" rgba="0.7 0.5 0.3 1"/>'
            for i, j in WALL_CELLS
            for x, y in [cell_xy(i, j)]
        )
        return f"""
<mujoco model="tcwm_pointmaze">
  <compiler inertiafromgeom="true" angle="radian"/>
  <option timestep="0.01" gravity="0 0 0" iterations="20" integrator="Euler"/>
  <default>
    <joint damping="1" limited="false"/>
    <geom friction=".5 .1 .1" density="1000" margin="0.002" condim="1" contype="2"
          conaffinity="1"/>
  </default>
  <visual>
    <headlight ambient=".4 .4 .4" diffuse=".8 .8 .8" specular="0.1 0.1 0.1"/>
    <map znear=".01"/>
    <quality shadowsize="0" {LOW_TESSELLATION}/>
  </visual>
  <worldbody>
    {self.camera_xml(height=3.0)}
    <geom name="floor" type="plane" size="2.5 2.5 0.25" pos="0 0 {self.floor_z}" contype="0"
          conaffinity="0" rgba="0.2 0.3 0.4 1"/>
    {walls}
    <body name="particle" pos="0 0 0">
      <geom name="particle_geom" type="sphere" size="{BALL_RADIUS}" rgba="0 0 1 0" contype="1"/>
      <site name="particle_site" pos="0 0 0" size="0.2" rgba="0.3 0.6 0.3 1"/>
      <joint name="ball_x" type="slide" pos="0 0 0" axis="1 0 0"/>
      <joint name="ball_y" type="slide" pos="0 0 0" axis="0 1 0"/>
    </body>
    {self.distractor_xml()}
  </worldbody>
  <actuator>
    <motor name="motor_x" joint="ball_x" ctrlrange="-1.0 1.0" ctrllimited="true" gear="100"/>
    <motor name="motor_y" joint="ball_y" ctrlrange="-1.0 1.0" ctrllimited="true" gear="100"/>
  </actuator>
</mujoco>
"""

    def _before_env_step(self) -> None:
        np.clip(self.data.qvel, -MAX_BALL_SPEED, MAX_BALL_SPEED, out=self.data.qvel)

    def position(self, state) -> np.ndarray:
        return np.asarray(state, dtype=np.float64)[..., :2]

    def sample_start(self, rng: np.random.Generator) -> np.ndarray:
        row, col = FREE_CELLS[rng.integers(len(FREE_CELLS))]
        xy = np.asarray(cell_xy(row, col)) + rng.uniform(-START_NOISE, START_NOISE, size=2)
        return np.array([xy[0], xy[1], 0.0, 0.0])


# --- Reacher --------------------------------------------------------------------------------
LINK = 0.1  # reacher.xml: each link is 0.1 long
FINGERTIP = 0.11  # the fingertip body sits 0.11 along the second link
JOINT1_START = 2.8  # inside joint1's range [-3, 3]


class ReacherScene(Scene):
    name = "reacher"
    frame_skip = 2
    default_action_repeat = 1
    default_success_radius = 0.05
    camera_extent = 0.64
    floor_geoms = ("ground",)
    agent_rgb = ((0.0, 0.4, 0.6), (0.0, 0.8, 0.6))
    wall_geoms = ("sideS", "sideE", "sideN", "sideW")
    distractor_radius_range = (0.02, 0.04)
    distractor_top = 0.008  # the arm's drawn links are capsules centred at z = 0.01
    floor_z = 0.0
    path_centre_half = 0.15
    path_radius_range = (0.03, 0.15)

    def xml(self) -> str:
        visual = 'contype="0" conaffinity="0" density="0"'
        return f"""
<mujoco model="tcwm_reacher">
  <compiler angle="radian" inertiafromgeom="true"/>
  <default>
    <joint armature="1" damping="1" limited="true"/>
    <geom contype="0" friction="1 0.1 0.1" rgba="0.7 0.7 0 1"/>
  </default>
  <option gravity="0 0 -9.81" integrator="RK4" timestep="0.01"/>
  <visual>
    <headlight ambient=".3 .3 .3" diffuse=".6 .6 .6" specular="0.1 0.1 0.1"/>
    <quality shadowsize="0" {LOW_TESSELLATION}/>
  </visual>
  <worldbody>
    {self.camera_xml(height=1.0)}
    <geom conaffinity="0" contype="0" name="ground" pos="0 0 0" rgba="0.9 0.9 0.9 1"
          size="1 1 10" type="plane"/>
    <geom conaffinity="0" fromto="-.3 -.3 .01 .3 -.3 .01" name="sideS" rgba="0.9 0.4 0.6 1"
          size=".02" type="capsule"/>
    <geom conaffinity="0" fromto=" .3 -.3 .01 .3  .3 .01" name="sideE" rgba="0.9 0.4 0.6 1"
          size=".02" type="capsule"/>
    <geom conaffinity="0" fromto="-.3  .3 .01 .3  .3 .01" name="sideN" rgba="0.9 0.4 0.6 1"
          size=".02" type="capsule"/>
    <geom conaffinity="0" fromto="-.3 -.3 .01 -.3 .3 .01" name="sideW" rgba="0.9 0.4 0.6 1"
          size=".02" type="capsule"/>
    <geom conaffinity="0" contype="0" fromto="0 0 0 0 0 0.02" name="root" rgba="0.9 0.4 0.6 1"
          size=".011" type="cylinder"/>
    <body name="body0" pos="0 0 .01">
      <geom fromto="0 0 0 0.1 0 0" name="link0" rgba="0.0 0.4 0.6 1" size=".01" type="capsule"/>
      <geom fromto="0 0 0 0.1 0 0" name="link0_visual" rgba="0.0 0.4 0.6 1" size=".02"
            type="capsule" {visual}/>
      <joint axis="0 0 1" limited="false" name="joint0" pos="0 0 0" type="hinge"/>
      <body name="body1" pos="0.1 0 0">
        <joint axis="0 0 1" limited="true" name="joint1" pos="0 0 0" range="-3.0 3.0"
               type="hinge"/>
        <geom fromto="0 0 0 0.1 0 0" name="link1" rgba="0.0 0.4 0.6 1" size=".01"
              type="capsule"/>
        <geom fromto="0 0 0 0.1 0 0" name="link1_visual" rgba="0.0 0.4 0.6 1" size=".02"
              type="capsule" {visual}/>
        <body name="fingertip" pos="0.11 0 0">
          <geom contype="0" name="fingertip" pos="0 0 0" rgba="0.0 0.8 0.6 1" size=".01"
                type="sphere"/>
          <geom name="fingertip_visual" pos="0 0 0" rgba="0.0 0.8 0.6 1" size=".025"
                type="sphere" {visual}/>
        </body>
      </body>
    </body>
    {self.distractor_xml()}
  </worldbody>
  <actuator>
    <motor ctrllimited="true" ctrlrange="-1.0 1.0" gear="200.0" joint="joint0"/>
    <motor ctrllimited="true" ctrlrange="-1.0 1.0" gear="200.0" joint="joint1"/>
  </actuator>
</mujoco>
"""

    def position(self, state) -> np.ndarray:
        """The fingertip's (x, y) by forward kinematics (the arm's base is the origin)."""
        state = np.asarray(state, dtype=np.float64)
        first, both = state[..., 0], state[..., 0] + state[..., 1]
        return np.stack(
            [
                LINK * np.cos(first) + FINGERTIP * np.cos(both),
                LINK * np.sin(first) + FINGERTIP * np.sin(both),
            ],
            axis=-1,
        )

    def sample_start(self, rng: np.random.Generator) -> np.ndarray:
        angles = rng.uniform((-np.pi, -JOINT1_START), (np.pi, JOINT1_START))
        return np.array([angles[0], angles[1], 0.0, 0.0])


SCENES: dict[str, type[Scene]] = {"pointmaze": PointMazeScene, "reacher": ReacherScene}


def make_scene(
    name: SceneName, success_radius: float | None = None, image_size: int = IMAGE_SIZE
) -> Scene:
    """A fresh scene; ``success_radius`` None keeps the scene's default (0.3 maze, 0.05 reacher).

    Close it (or use it as a context manager) to free its renderer."""
    if name not in SCENES:
        raise ValueError(f"unknown scene {name!r}; choose one of {SCENE_NAMES}")
    return SCENES[name](success_radius=success_radius, image_size=image_size)


def draw_nuisance(rng: np.random.Generator, kappa: float, scene: Scene) -> Nuisance:
    """One episode's nuisance [G].

    Colours are redrawn while they lie within ``MIN_CONTRAST`` (RGB distance) of one of the
    agent's colours (and walls of the floor's), so the agent and the walls stay visible and no
    distractor can pass for the agent. Colours, distractor colours and paths come from separate
    child generators and all ``MAX_DISTRACTORS`` are drawn whatever kappa is: one generator
    state gives the same paths at every strength (and the same colour shifts unless a redraw
    was needed).
    """
    kappa = check_kappa(kappa)
    colour_rng, distractor_rng, path_rng = rng.spawn(3)
    agent = np.asarray(scene.agent_rgb)

    def contrasting(draw, avoid: np.ndarray) -> np.ndarray:
        for _ in range(1000):
            colour = draw()
            if np.linalg.norm(avoid - colour, axis=-1).min() >= MIN_CONTRAST:
                return colour
        raise RuntimeError(f"no colour {MIN_CONTRAST} away from {avoid} in 1000 draws")

    def shifted(default: np.ndarray):
        return lambda: np.clip(
            default + kappa * COLOUR_AMPLITUDE * colour_rng.uniform(-1, 1, size=3), 0, 1
        )

    floor_rgb = contrasting(shifted(scene.default_floor_rgb), agent)
    wall_rgb = contrasting(shifted(scene.default_wall_rgb), np.vstack([agent, floor_rgb]))
    k = MAX_DISTRACTORS
    rgb = np.stack(
        [contrasting(lambda: distractor_rng.uniform(0, 1, size=3), agent) for _ in range(k)]
    )
    disc = path_rng.uniform(*scene.distractor_radius_range, size=k)
    centre = path_rng.uniform(-scene.path_centre_half, scene.path_centre_half, size=(k, 2))
    radius = path_rng.uniform(*scene.path_radius_range, size=k)
    phase = path_rng.uniform(0, 2 * np.pi, size=k)
    speed = path_rng.uniform(*PATH_SPEED, size=k) * path_rng.choice((-1.0, 1.0), size=k)
    shown = n_distractors(kappa)
    return Nuisance(
        scene=scene.name,
        kappa=kappa,
        floor_rgb=floor_rgb,
        wall_rgb=wall_rgb,
        distractor_rgb=rgb[:shown],
        distractor_radius=disc[:shown],
        path_centre=centre[:shown],
        path_radius=radius[:shown],
        path_phase=phase[:shown],
        path_speed=speed[:shown],
    )


def rollout(scene: Scene, start_state, actions, action_repeat: int = 1) -> np.ndarray:
    """Execute actions [T, 2] from a start state: states [T + 1, 4] float64, start included."""
    actions = np.asarray(actions)
    if actions.ndim != 2:
        raise ValueError(f"actions have shape [T, {scene.action_dim}], got {actions.shape}")
    scene.set_state(start_state)
    states = [scene.get_state()]
    for action in actions:
        states.append(scene.step(action, action_repeat))
    return np.stack(states)


def _streams(seed: int, n: int) -> list[np.random.SeedSequence]:
    """One independent seed sequence per episode; episode i does not depend on n."""
    return np.random.SeedSequence(seed).spawn(n)


def random_episodes(
    name: SceneName,
    n_episodes: int,
    length: int,
    kappa: float,
    seed: int,
    action_repeat: int | None = None,
) -> dict[str, np.ndarray]:
    """Random-action episodes (DINO-WM style), one nuisance draw per episode.

    frames uint8 [N, T, 64, 64, 3], states float32 [N, T, 4], actions float32 [N, T, 2]:
    action t is held for ``action_repeat`` env steps after frame t, so it leads from state t
    to state t + 1 (the last action, drawn as in DINO-WM's layout, has no frame after it).
    Also floor_rgb / wall_rgb float32 [N, 3], distractor_xy float32 [N, T, K, 2] and
    action_repeat. Physics and nuisance draw from separate streams: the same seed gives the
    same states and actions at every kappa.
    """
    kappa = check_kappa(kappa)
    if n_episodes < 1 or length < 1:
        raise ValueError(f"need n_episodes >= 1 and length >= 1, got {n_episodes}, {length}")
    with make_scene(name) as scene:
        repeat = check_repeat(action_repeat or scene.default_action_repeat)
        size = scene.image_size
        shown = n_distractors(kappa)
        out = {
            "frames": np.empty((n_episodes, length, size, size, 3), np.uint8),
            "states": np.empty((n_episodes, length, scene.state_dim), np.float32),
            "actions": np.empty((n_episodes, length, scene.action_dim), np.float32),
            "floor_rgb": np.empty((n_episodes, 3), np.float32),
            "wall_rgb": np.empty((n_episodes, 3), np.float32),
            "distractor_xy": np.empty((n_episodes, length, shown, 2), np.float32),
            "action_repeat": np.array(repeat),
        }
        for n, stream in enumerate(_streams(seed, n_episodes)):
            physics_stream, nuisance_stream = stream.spawn(2)
            rng = np.random.default_rng(physics_stream)
            nuisance = draw_nuisance(np.random.default_rng(nuisance_stream), kappa, scene)
            out["floor_rgb"][n], out["wall_rgb"][n] = nuisance.floor_rgb, nuisance.wall_rgb
            actions = rng.uniform(-1, 1, size=(length, scene.action_dim)).astype(np.float32)
            out["actions"][n] = actions
            scene.set_state(scene.sample_start(rng))
            for t in range(length):
                if t > 0:
                    scene.step(actions[t - 1], repeat)
                out["states"][n, t] = scene.get_state()
                out["distractor_xy"][n, t] = nuisance.distractor_xy(t)
                scene.render(nuisance, t, out=out["frames"][n, t])
    return out
