import numpy as np
import pytest

from seqrejectron.envs import (
    FORWARD,
    Layout,
    ShiftedDynamics,
    ShiftError,
    abstract_state,
    expert_policy,
    make_env,
)


@pytest.fixture(scope="module")
def layouts():
    train = Layout(9, 2, 80, layout_seed=9)
    return train, train.with_shift("wind", 0.3), train.with_shift("ice", 0.5)


def test_the_expert_solves_training_layouts_and_recovers_under_shift(layouts):
    for layout in layouts:
        trajs = [layout.rollout(expert_policy, s) for s in range(40)]
        assert all(t.cost == 0 for t in trajs)
    wind = [layouts[1].rollout(expert_policy, s) for s in range(40)]
    plain = [layouts[0].rollout(expert_policy, s) for s in range(40)]
    assert any(
        len(a) != len(b) for a, b in zip(wind, plain, strict=True)
    )  # the wind pushed someone


def test_coupling_pihat_retraces_the_expert_until_its_first_deviation(layouts):
    wind = layouts[1]
    reference = wind.rollout(expert_policy, 123)
    deviate_at = reference.feats[len(reference) // 2]
    k = next(t for t, f in enumerate(reference.feats) if np.array_equal(f, deviate_at))

    def pihat(feats, z):
        if np.array_equal(feats, deviate_at):
            return (expert_policy(feats, z) + 1) % 3
        return expert_policy(feats, z)

    coupled = wind.rollout(pihat, 123)
    np.testing.assert_array_equal(coupled.feats[: k + 1], reference.feats[: k + 1])
    assert coupled.actions[k] != reference.actions[k]
    assert (coupled.actions[:k] == reference.actions[:k]).all()


def test_wrappers_change_the_transitions():
    moved = {}
    for shift in ("none", "wind", "ice"):
        env = make_env(9, 1, 80, 3, shift, 1.0)
        env.seed_dynamics(0)
        base = env.unwrapped
        base.agent_pos, base.agent_dir = np.array((1, 1)), 0
        env.step(FORWARD)
        moved[shift] = tuple(base.agent_pos)
    assert moved["none"] == (2, 1)
    assert moved["ice"] != moved["none"] or moved["wind"] != moved["none"]
    with pytest.raises(ShiftError, match="unknown shift"):
        ShiftedDynamics(make_env(9, 1, 80, 3, "none", 0.0), "earthquake", 0.1)


def test_the_expert_descends_the_bfs_distance(layouts):
    layout = layouts[0]
    traj = layout.rollout(expert_policy, 5)
    assert traj.cost == 0 and (traj.actions == traj.expert).all()
    # the abstract state reads the distance map: at the goal's neighbour facing it, forward is ok
    goal = tuple(np.argwhere(layout.cells == 3)[0])
    assert abstract_state(layout.dist, (goal[0] - 1, goal[1]), 0) & 4


def test_features_are_coordinates_heading_and_view_on_every_grid():
    """pi-hat's input since issue 59: (x, y) scaled to [0, 1] (no one-hot unit that training
    never sets), heading one-hot, the 3x3 view's codes one-hot; the same width on every grid."""
    from seqrejectron.envs import GOAL, N_FEATURES, WALL, features

    cells = np.zeros((9, 7), dtype=np.int64)
    cells[0, :] = cells[-1, :] = cells[:, 0] = cells[:, -1] = WALL
    cells[7, 5] = GOAL
    f = features(cells, (4, 3), 1)  # facing south
    assert f.shape == (N_FEATURES,) == (42,)
    np.testing.assert_allclose(f[:2], [4 / 8, 3 / 6])
    np.testing.assert_array_equal(f[2:6], [0, 1, 0, 0])
    assert f[6:].reshape(9, 4).sum(axis=1).tolist() == [1] * 9  # one code per view cell
    corner = features(cells, (7, 5), 0).reshape(-1)[6:].reshape(9, 4)  # at the goal, facing east
    assert corner[4].argmax() == GOAL and corner[:3, WALL].all()  # here: goal; ahead: the wall
    np.testing.assert_allclose(features(cells, (0, 0), 0)[:2], [0, 0])  # the grid's corners
    np.testing.assert_allclose(features(cells, (8, 6), 0)[:2], [1, 1])
    small = np.zeros((7, 7), dtype=np.int64)
    assert features(small, (3, 3), 2).shape == f.shape
