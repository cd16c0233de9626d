"""Environment (B): PointMaze's shift, the expert on the bin abstraction, the bins, the summary."""

import numpy as np
import pytest
import torch

from seqrejectron.envs import Trajectory
from seqrejectron.experiment import World, WorldConfig
from seqrejectron.pointmaze import (
    ACTIONS,
    BINS,
    COLS,
    DAMPING,
    GAIN,
    GOAL_CELL,
    HAZARDS,
    HORIZON,
    MARGIN,
    MAZE,
    NOISE,
    ROWS,
    START_CELLS,
    WIND,
    PointMaze,
    bin_centre,
    bin_of,
    discretise,
    expert_force_at,
    features_of,
    pointmaze_summary,
)


@pytest.fixture(scope="module")
def mazes():
    return PointMaze(shifted=False), PointMaze(shifted=True)


def test_the_shift_edits_gear_and_wind_and_both_dynamics_are_damped(mazes):
    train, test = mazes
    tm, qm = train.env.point_env.model, test.env.point_env.model
    np.testing.assert_allclose(qm.actuator_gear[:2, 0], GAIN * tm.actuator_gear[:2, 0])
    assert tm.opt.gravity[1] == 0 and qm.opt.gravity[1] == pytest.approx(-WIND)
    np.testing.assert_allclose(tm.dof_damping[:2], DAMPING)
    np.testing.assert_allclose(qm.dof_damping[:2], DAMPING)


def test_the_wind_pushes_towards_minus_y_and_the_gear_weakens_the_push(mazes):
    train, test = mazes
    still = ACTIONS.tolist().index([0.0, 0.0])
    right = ACTIONS.tolist().index([1.0, 0.0])

    def positions(env, action):
        traj = env.rollout(lambda f, o: action, 1)
        return traj.feats  # the bin centres

    p_still, q_still = positions(train, still), positions(test, still)
    assert p_still[0, 1] == q_still[0, 1]  # same seeded start
    assert np.ptp(p_still[:20, 1]) == 0  # no force, no wind: the point stays in its bin
    assert q_still[10, 1] < q_still[0, 1]  # the wind moves it down (-y)
    assert np.ptp(q_still[:20, 0]) == 0  # ... and only down

    def travel_right(env):
        obs, _ = env.env.reset(
            seed=3, options={"goal_cell": np.array(GOAL_CELL), "reset_cell": np.array((1, 1))}
        )
        x0 = obs["observation"][0]
        for _ in range(10):
            obs, *_ = env.env.step(ACTIONS[right])
        return obs["observation"][0] - x0

    # the same pushes travel about GAIN as far under the weaker gear (damping-dominated motion)
    assert 0.5 < travel_right(test) / travel_right(train) < 0.7


def test_bins_round_trip_and_contain_their_positions():
    for fr in range(ROWS):
        for fc in range(COLS):
            assert bin_of(bin_centre(fr, fc)) == (fr, fc)
    rng = np.random.default_rng(0)
    half = np.array([len(MAZE[0]), len(MAZE)]) / 2
    for pos in rng.uniform(-half + 1e-6, half - 1e-6, size=(200, 2)):
        assert np.all(np.abs(bin_centre(*bin_of(pos)) - pos) <= 0.5 / BINS + 1e-9)
    assert bin_of([-3.5 + 1e-9, 2.5 - 1e-9]) == (0, 0)  # top-left corner: row 0, column 0
    np.testing.assert_allclose(features_of((2, 5)), bin_centre(2, 5))  # features: (x, y) in m


def test_the_expert_force_from_a_bin_points_along_the_safe_path():
    def act(row, col, fine_row=BINS // 2, fine_col=BINS // 2):
        return tuple(
            ACTIONS[discretise(expert_force_at((row * BINS + fine_row, col * BINS + fine_col)))]
        )

    assert START_CELLS == [(1, 1), (3, 1)] and GOAL_CELL == (2, 5)
    assert act(1, 1) == (1.0, 0.0) and act(3, 1) == (1.0, 0.0)  # both starts: right, two routes
    assert act(1, 5) == (0.0, -1.0) and act(3, 5) == (0.0, 1.0)  # then into the goal cell
    # drift across the lane: corrected only beyond MARGIN and only towards a hazard
    low = BINS - 1  # the lowest bin of a cell
    assert (low + 0.5) / BINS - 0.5 > MARGIN
    assert act(1, 3, low) == (1.0, 1.0)  # top route above a hazard: right and up
    assert act(1, 1, low) == (1.0, 1.0)  # ... and where the next cell has a hazard below
    assert act(3, 3, low) == (1.0, 0.0)  # bottom route against the wall: no correction
    assert act(1, 3, BINS // 2 + 1) == (1.0, 0.0)  # within MARGIN: no correction either


@pytest.mark.parametrize("shifted", [False, True])
def test_the_expert_solves_the_maze_from_the_bin_abstraction(mazes, shifted):
    env = mazes[shifted]
    runs = [env.rollout(None, s, NOISE) for s in range(8)]
    assert sum(r.cost for r in runs) <= 1  # cost 0 in almost every episode, noise included
    clean = [env.rollout(None, s) for s in range(8)]
    assert all(len(r) < HORIZON for r in clean if r.cost == 0)
    assert np.mean([r.cost for r in clean]) <= 0.125


def test_a_hazard_cell_costs_one_and_ends_the_episode(mazes):
    train, _ = mazes
    hazard = np.asarray(train.maze.cell_rowcol_to_xy(np.array(sorted(HAZARDS)[1])))

    def to_hazard(feats, obs):
        return discretise(2.0 * (hazard - obs["observation"][:2]))

    hit = train.rollout(to_hazard, 0)
    assert hit.cost == 1 and len(hit) < HORIZON
    assert GOAL_CELL not in HAZARDS


def traj(bins, expert, actions, cost):
    return Trajectory(
        feats=np.stack([features_of(b) for b in bins]),
        z=np.zeros(len(bins), dtype=np.int64),
        expert=np.array(expert),
        actions=np.array(actions),
        cost=cost,
    )


def test_the_summary_matches_a_hand_count():
    a, b, c = (4, 4), (4, 5), (5, 5)
    train = [traj([a, b], [1, 1], [1, 1], 0), traj([a], [2], [2], 1)]
    test = [traj([a, c, c], [1, 1, 1], [1, 1, 1], 0)]  # 1 of 3 test states seen in training
    eval_p = [traj([a], [1], [1], 0), traj([a, b], [1, 1], [1, 2], 0)]  # 1 of 2 disagrees
    eval_q = [
        traj([a] * HORIZON, [1] * HORIZON, [1] * HORIZON, 1),  # timeout
        traj([c], [1], [1], 1),  # hazard
        traj([b], [1], [1], 0),
        traj([a], [1], [1], 0),
    ]
    world = World(WorldConfig(), 0, train, test, torch.nn.Identity(), [], [], [], eval_p, eval_q)
    assert pointmaze_summary(world) == {
        "expert_train_cost": 0.5,
        "expert_test_cost": 0.0,
        "bc_train_cost": 0.0,
        "bc_test_cost": 0.5,
        "bc_test_hazard": 0.25,
        "oracle_train_stop": 0.5,
        "test_state_coverage": pytest.approx(1 / 3),
    }
