"""The synthetic-embedding world: a known injective map of state and nuisance."""

import numpy as np
import pytest
import torch

from tcwm.synthetic import (
    EMBED_DIM,
    NUISANCE_DIM,
    STATE_DIM,
    SyntheticWorld,
    embedding_map,
    phi,
)


def test_phi_is_injective_locally_its_jacobian_has_full_column_rank():
    rng = np.random.default_rng(0)
    for _ in range(5):
        point = torch.tensor(rng.normal(size=STATE_DIM + NUISANCE_DIM), dtype=torch.float32)

        def f(x):
            h = x
            layers = embedding_map()
            for i, (weight, bias) in enumerate(layers):
                h = h @ weight.T + bias
                if i < len(layers) - 1:
                    h = torch.nn.functional.leaky_relu(h, 0.2)
            return h

        jacobian = torch.autograd.functional.jacobian(f, point)
        assert jacobian.shape == (EMBED_DIM, STATE_DIM + NUISANCE_DIM)
        assert torch.linalg.matrix_rank(jacobian) == STATE_DIM + NUISANCE_DIM
    s, c = rng.normal(size=(2, STATE_DIM)), rng.normal(size=(2, NUISANCE_DIM))
    np.testing.assert_allclose(
        phi(s, c)[0],
        f(torch.tensor(np.r_[s[0], c[0]], dtype=torch.float32)).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_the_nuisance_is_zero_at_strength_zero_and_independent_of_the_state():
    world = SyntheticWorld()
    rng = np.random.default_rng(0)
    quiet = world.draw_nuisance(rng, 0.0)
    assert not quiet.at(7).any()
    loud = world.draw_nuisance(rng, 1.0)
    world.set_state(np.array([0.5, -0.5], np.float32))
    first = world.observe(loud, 3)
    world.step(np.array([1.0, 1.0], np.float32))
    assert not np.allclose(world.observe(loud, 3), first)  # the state moved the embedding
    world.set_state(np.array([0.5, -0.5], np.float32))
    np.testing.assert_array_equal(world.observe(loud, 3), first)
    assert not np.allclose(world.observe(loud, 4), first)  # the nuisance moved it alone


def test_actions_move_the_point_and_walls_stop_it():
    world = SyntheticWorld()
    world.set_state(np.zeros(2, np.float32))
    state = world.step(np.array([1.0, -1.0], np.float32))
    assert state[0] > 0 > state[1]
    for _ in range(100):
        state = world.step(np.array([1.0, 1.0], np.float32))
    assert state[0] == 1.0 and state[1] == 1.0


def test_bad_input_is_a_clear_error():
    world = SyntheticWorld()
    with pytest.raises(ValueError, match="action of shape"):
        world.step(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="kappa"):
        world.draw_nuisance(np.random.default_rng(0), 1.5)


def test_success_is_measured_on_the_position():
    world = SyntheticWorld()
    goal = np.array([0.5, 0.5], np.float32)
    assert world.success(np.array([0.55, 0.5], np.float32), goal)
    assert not world.success(np.array([0.65, 0.5], np.float32), goal)


def test_start_goal_pairs_are_seeded_unsolved_and_see_two_nuisances():
    """The planner's pairs (tcwm.evaluate, the path `reproduce` runs): no goal within the
    success radius of its start, the same pairs for the same seed, and the goal image under a
    nuisance draw other than the start's."""
    from tcwm.evaluate import start_goal_pairs

    world = SyntheticWorld()
    pairs = start_goal_pairs(world, n_pairs=8, kappa=1.0, goal_offset=15, seed=3)
    again = start_goal_pairs(world, n_pairs=8, kappa=1.0, goal_offset=15, seed=3)
    assert len(pairs) == 8
    for (start, goal, nuisance, goal_nuisance), other in zip(pairs, again, strict=True):
        assert not world.success(start, goal)
        np.testing.assert_array_equal(goal, other[1])
        assert not np.allclose(nuisance.at(0), goal_nuisance.at(0))
