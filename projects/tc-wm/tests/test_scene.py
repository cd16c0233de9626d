"""The miniature's scenes: physics as the originals, nuisance only in pixels, seeded data.

Pixels are compared only within one process (same Mesa); across machines only states are
compared exactly.
"""

import gymnasium
import numpy as np
import pytest

from tcwm.scene import (
    BALL_RADIUS,
    FREE_CELLS,
    IMAGE_SIZE,
    SCENE_NAMES,
    WALL_CELLS,
    cell_xy,
    draw_nuisance,
    make_scene,
    n_distractors,
    random_episodes,
    rollout,
)


@pytest.fixture(scope="module")
def scenes():
    built = {name: make_scene(name) for name in SCENE_NAMES}
    yield built
    for scene in built.values():
        scene.close()


def wall_distance(xy: np.ndarray) -> np.ndarray:
    """Distance in the plane from points [T, 2] to the nearest wall box of the U-maze."""
    distance = np.full(len(xy), np.inf)
    for i, j in WALL_CELLS:
        cx, cy = cell_xy(i, j)
        dx = np.maximum(np.abs(xy[:, 0] - cx) - 0.5, 0)
        dy = np.maximum(np.abs(xy[:, 1] - cy) - 0.5, 0)
        distance = np.minimum(distance, np.hypot(dx, dy))
    return distance


def render_rollout(scene, start, actions, nuisance):
    scene.set_state(start)
    frames, states = [scene.render(nuisance, 0)], [scene.get_state()]
    for t, action in enumerate(actions, start=1):
        states.append(scene.step(action, scene.default_action_repeat))
        frames.append(scene.render(nuisance, t))
    return np.stack(frames), np.stack(states)


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_nuisance_changes_pixels_but_not_states(scenes, name):
    scene = scenes[name]
    rng = np.random.default_rng(0)
    start = scene.sample_start(rng)
    actions = rng.uniform(-1, 1, size=(8, 2))
    one = draw_nuisance(np.random.default_rng(1), 1.0, scene)
    other = draw_nuisance(np.random.default_rng(2), 1.0, scene)
    frames_one, states_one = render_rollout(scene, start, actions, one)
    frames_other, states_other = render_rollout(scene, start, actions, other)
    assert frames_one.shape == (9, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert frames_one.dtype == np.uint8
    np.testing.assert_array_equal(states_one, states_other)
    # rendering leaves the dynamics alone: the same trajectory without any frame
    np.testing.assert_array_equal(
        states_one, rollout(scene, start, actions, scene.default_action_repeat)
    )
    changed = np.abs(frames_one.astype(int) - frames_other).max(axis=-1) > 30  # [T, H, W]
    assert changed.mean() > 0.3  # the floor's colour differs almost everywhere
    # at kappa = 0 every draw renders the same frames
    calm_one = draw_nuisance(np.random.default_rng(1), 0.0, scene)
    calm_other = draw_nuisance(np.random.default_rng(2), 0.0, scene)
    np.testing.assert_array_equal(
        render_rollout(scene, start, actions, calm_one)[0],
        render_rollout(scene, start, actions, calm_other)[0],
    )
    np.testing.assert_array_equal(scene.render(calm_one, 3), scene.render(None, 3))


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_distractors_move_with_time_alone(scenes, name):
    """Same state, kappa = 1, colours fixed: frames at two time steps differ only where the
    distractors were, and by the distractors' own motion."""
    scene = scenes[name]
    scene.set_state(scene.sample_start(np.random.default_rng(3)))
    nuisance = draw_nuisance(np.random.default_rng(4), 1.0, scene)
    assert nuisance.n_distractors == 2
    moved = np.abs(scene.render(nuisance, 0).astype(int) - scene.render(nuisance, 5)).max(-1) > 0
    assert moved.any()
    rows, cols = np.nonzero(moved)
    centres = np.concatenate(
        [scene.world_to_pixel(nuisance.distractor_xy(t)) for t in (0, 5)]
    )  # [4, 2]
    reach = scene.distractor_radius_range[1] * IMAGE_SIZE / scene.camera_extent + 2
    near = np.hypot(rows[:, None] - centres[:, 0], cols[:, None] - centres[:, 1]).min(1)
    assert near.max() <= reach


def test_the_number_of_distractors_and_the_colours_follow_kappa(scenes):
    assert [n_distractors(k) for k in (0.0, 0.2, 0.25, 0.5, 0.7, 0.75, 1.0)] == [
        0,
        0,
        1,
        1,
        1,
        2,
        2,
    ]
    scene = scenes["pointmaze"]
    calm = draw_nuisance(np.random.default_rng(0), 0.0, scene)
    np.testing.assert_array_equal(calm.floor_rgb, scene.default_floor_rgb)
    np.testing.assert_array_equal(calm.wall_rgb, scene.default_wall_rgb)
    assert calm.n_distractors == 0
    half = draw_nuisance(np.random.default_rng(0), 0.5, scene)
    full = draw_nuisance(np.random.default_rng(0), 1.0, scene)
    # one generator state: the same paths at every strength, colour shifts scale with kappa
    np.testing.assert_array_equal(half.path_centre[0], full.path_centre[0])
    half_shift = np.abs(half.floor_rgb - scene.default_floor_rgb).max()
    full_shift = np.abs(full.floor_rgb - scene.default_floor_rgb).max()
    assert 0 < half_shift <= 0.25 + 1e-12 < full_shift <= 0.5 + 1e-12


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_drawn_colours_keep_the_agent_visible(scenes, name):
    scene = scenes[name]
    rng = np.random.default_rng(5)
    for _ in range(50):
        nuisance = draw_nuisance(rng, 1.0, scene)
        colours = np.concatenate([[nuisance.floor_rgb, nuisance.wall_rgb], nuisance.distractor_rgb])
        gaps = np.linalg.norm(colours[:, None] - np.asarray(scene.agent_rgb), axis=-1)
        assert gaps.min() >= 0.3
        assert np.linalg.norm(nuisance.floor_rgb - nuisance.wall_rgb) >= 0.3


def test_the_ball_is_drawn_where_it_is(scenes):
    scene = scenes["pointmaze"]
    places = {"a": (-1.0, 1.0), "b": (1.0, -1.0)}
    frames = {}
    for key, xy in places.items():
        scene.set_state([*xy, 0.0, 0.0])
        frames[key] = scene.render(None, 0).astype(int)
    changed = np.abs(frames["a"] - frames["b"]).max(-1) > 20
    rows, cols = np.nonzero(changed)
    pixels = scene.world_to_pixel(np.array(list(places.values())))  # [2, 2]
    near = np.hypot(rows[:, None] - pixels[:, 0], cols[:, None] - pixels[:, 1])
    assert near.min(1).max() <= 0.2 * 16 + 1.5  # every change lies on one of the two balls
    assert (near < 2).any(0).all()  # and both balls changed pixels
    row, col = np.round(pixels[0]).astype(int)
    green = frames["a"][row, col]
    assert green[1] > green[0] + 40 and green[1] > green[2] + 40


def test_the_fingertip_is_drawn_where_it_is(scenes):
    scene = scenes["reacher"]
    for state in ([0.3, 1.0, 0, 0], [2.5, -2.0, 0, 0]):
        scene.set_state(state)
        frame = scene.render(None, 0).astype(int)
        row, col = np.round(scene.world_to_pixel(scene.position(np.array(state)))).astype(int)
        tip = frame[row, col]  # fingertip (0, 0.8, 0.6): green over blue, no red
        assert tip[1] > 120 and tip[1] > tip[2] > tip[0] + 40


def test_the_fingertip_position_is_mujocos(scenes):
    import mujoco

    scene = scenes["reacher"]
    body = mujoco.mj_name2id(scene.model, mujoco.mjtObj.mjOBJ_BODY, "fingertip")
    rng = np.random.default_rng(6)
    for _ in range(5):
        state = scene.sample_start(rng)
        scene.set_state(state)
        np.testing.assert_allclose(scene.position(state), scene.data.xpos[body, :2], atol=1e-12)


def test_actions_push_the_state_their_way(scenes):
    maze = scenes["pointmaze"]
    centre = cell_xy(*FREE_CELLS[1])  # the middle of the top corridor
    for action, axis, sign in (((1, 0), 0, 1), ((0, -1), 1, -1), ((-1, 0), 0, -1)):
        end = rollout(maze, [*centre, 0, 0], [action] * 2, action_repeat=5)[-1]
        assert sign * (end[axis] - centre[axis]) > 0.05
        assert sign * end[2 + axis] > 0.5
        assert abs(end[1 - axis] - centre[1 - axis]) < 1e-9
    arm = scenes["reacher"]
    for action, joint in (((1, 0), 0), ((0, 1), 1)):
        end = rollout(arm, [0.0, 0.0, 0.0, 0.0], [action] * 3)[-1]
        assert end[joint] > 0.01 and end[2 + joint] > 0.5


def test_the_ball_never_passes_through_walls(scenes):
    scene = scenes["pointmaze"]
    rng = np.random.default_rng(7)
    for _ in range(3):
        states = rollout(scene, scene.sample_start(rng), rng.uniform(-1, 1, (200, 2)), 5)
        # soft contacts let the ball in by a centimetre or two, never through
        assert wall_distance(states[:, :2]).min() > BALL_RADIUS - 0.03
        assert np.abs(states[:, :2]).max() < 1.5
        assert np.abs(states[:, 2:]).max() <= 5.0 + 1.0  # clipped before each step


def test_starts_lie_in_free_cells(scenes):
    scene = scenes["pointmaze"]
    rng = np.random.default_rng(8)
    starts = np.stack([scene.sample_start(rng) for _ in range(200)])
    assert wall_distance(starts[:, :2]).min() >= 0.25 - 1e-9
    np.testing.assert_array_equal(starts[:, 2:], 0)
    assert np.ptp(starts[:, 0]) > 2 and np.ptp(starts[:, 1]) > 2  # the whole U


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_physics_matches_the_original_env(scenes, name):
    """Same state, same actions: the trajectory of gymnasium's env, bit for bit here (1e-9
    allowed); masses, inertias, gears and damping as there."""
    scene = scenes[name]
    if name == "reacher":
        env = gymnasium.make("Reacher-v5").unwrapped
        sim = env
    else:
        gymnasium_robotics = pytest.importorskip("gymnasium_robotics")
        gymnasium.register_envs(gymnasium_robotics)
        env = gymnasium.make("PointMaze_UMaze-v3", continuing_task=True).unwrapped
        sim = env.point_env
    env.reset(seed=0)
    rng = np.random.default_rng(9)
    start = scene.sample_start(rng)
    start[2:] = (7.0, -6.0) if name == "pointmaze" else rng.normal(size=2)  # maze: over the clip
    actions = rng.uniform(-1, 1, size=(60, 2))
    ours = rollout(scene, start, actions, action_repeat=5)
    extra = sim.model.nq - 2  # reacher: the target's two slide joints
    sim.set_state(np.r_[start[:2], sim.data.qpos[2:]], np.r_[start[2:], np.zeros(extra)])
    theirs = [start]
    for action in actions:
        for _ in range(5):
            env.step(action)
        theirs.append(np.r_[sim.data.qpos[:2], sim.data.qvel[:2]])
    env.close()
    np.testing.assert_allclose(ours, np.stack(theirs), rtol=0, atol=1e-9)
    if name == "pointmaze":  # the walls were hit
        assert wall_distance(ours[:, :2]).min() < BALL_RADIUS + 0.01
    else:  # joint1 reached its limit
        assert np.abs(ours[:, 1]).max() > 2.9
    n_bodies = sim.model.nbody - (1 if name == "reacher" else 0)  # reacher: its target body
    np.testing.assert_array_equal(scene.model.body_mass[:n_bodies], sim.model.body_mass[:n_bodies])
    np.testing.assert_array_equal(
        scene.model.body_inertia[:n_bodies], sim.model.body_inertia[:n_bodies]
    )
    np.testing.assert_array_equal(scene.model.actuator_gear, sim.model.actuator_gear)
    np.testing.assert_array_equal(scene.model.dof_damping[:2], sim.model.dof_damping[:2])
    np.testing.assert_array_equal(scene.model.dof_armature[:2], sim.model.dof_armature[:2])
    assert scene.model.opt.timestep * scene.frame_skip == pytest.approx(sim.dt)


def test_success_threshold_by_value(scenes):
    maze = scenes["pointmaze"]
    goal = np.array([0.5, 1.0, 0.0, 0.0])
    assert maze.success([0.79, 1.0, 3.0, -3.0], goal)  # velocities do not count
    assert not maze.success([0.81, 1.0, 0.0, 0.0], goal)
    assert not maze.success([0.5, 1.3, 0.0, 0.0], goal)  # strict: the radius itself misses
    arm = scenes["reacher"]
    goal = np.array([0.4, 1.2, 0.0, 0.0])
    reach = np.hypot(0.1 + 0.11 * np.cos(1.2), 0.11 * np.sin(1.2))  # |fingertip| at joint1 = 1.2
    for distance, expected in ((0.049, True), (0.051, False)):
        turn = 2 * np.arcsin(distance / (2 * reach))  # a chord of this length
        state = goal + [turn, 0, 0, 0]
        assert arm.distance(state, goal) == pytest.approx(distance)
        assert arm.success(state, goal) is expected
    with make_scene("reacher", success_radius=0.06) as loose:
        assert loose.success(goal + [2 * np.arcsin(0.055 / (2 * reach)), 0, 0, 0], goal)


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_random_episodes_are_seeded_and_shaped(name):
    episodes = random_episodes(name, n_episodes=2, length=6, kappa=1.0, seed=3)
    again = random_episodes(name, n_episodes=2, length=6, kappa=1.0, seed=3)
    calm = random_episodes(name, n_episodes=2, length=6, kappa=0.0, seed=3)
    other = random_episodes(name, n_episodes=1, length=6, kappa=1.0, seed=4)
    assert episodes["frames"].shape == (2, 6, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert episodes["frames"].dtype == np.uint8
    assert episodes["states"].shape == (2, 6, 4) and episodes["states"].dtype == np.float32
    assert episodes["actions"].shape == (2, 6, 2) and episodes["actions"].dtype == np.float32
    assert episodes["distractor_xy"].shape == (2, 6, 2, 2)
    assert calm["distractor_xy"].shape == (2, 6, 0, 2)
    assert np.abs(episodes["actions"]).max() <= 1
    for key in ("states", "actions", "floor_rgb", "distractor_xy"):
        np.testing.assert_array_equal(episodes[key], again[key])
    np.testing.assert_array_equal(episodes["frames"], again["frames"])  # same process
    # the nuisance has its own stream: kappa changes pixels, never states or actions
    np.testing.assert_array_equal(episodes["states"], calm["states"])
    np.testing.assert_array_equal(episodes["actions"], calm["actions"])
    assert not np.array_equal(episodes["frames"], calm["frames"])
    assert not np.array_equal(episodes["states"][0], other["states"][0])
    # episode 0 does not depend on how many episodes were asked for
    one = random_episodes(name, n_episodes=1, length=6, kappa=1.0, seed=3)
    np.testing.assert_array_equal(one["states"][0], episodes["states"][0])
    # the recorded transitions replay: state t+1 = state t after action t
    with make_scene(name) as scene:
        replay = rollout(
            scene,
            episodes["states"][0, 0],
            episodes["actions"][0, :-1],
            int(episodes["action_repeat"]),
        )
    np.testing.assert_allclose(replay, episodes["states"][0], atol=1e-5)


def test_bad_input_is_a_clear_error(scenes):
    with pytest.raises(ValueError, match="unknown scene 'cartpole'"):
        make_scene("cartpole")
    maze = scenes["pointmaze"]
    with pytest.raises(ValueError, match=r"action has shape \(2,\)"):
        maze.step([1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="not finite"):
        maze.step([np.nan, 0.0])
    with pytest.raises(ValueError, match=r"state has shape \(4,\)"):
        maze.set_state([0.0, 0.0])
    with pytest.raises(ValueError, match="action_repeat"):
        maze.step([0.0, 0.0], action_repeat=0)
    for kappa in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="kappa"):
            draw_nuisance(np.random.default_rng(0), kappa, maze)
    with pytest.raises(ValueError, match="kappa"):
        random_episodes("reacher", 1, 2, kappa=2.0, seed=0)
    with pytest.raises(ValueError, match="cannot render"):
        maze.render(draw_nuisance(np.random.default_rng(0), 1.0, scenes["reacher"]), 0)
    with pytest.raises(ValueError, match="success_radius"):
        make_scene("reacher", success_radius=0.0)
