"""The MuJoCo push scene: hidden physics make one start and action chunk multimodal."""

from __future__ import annotations

import numpy as np
import pytest

from rlawm.scene import FRICTIONS, MASSES, Hidden, PushScene, draw_start, rollout_episode


@pytest.fixture(scope="module")
def scene():
    scene = PushScene()
    yield scene
    scene.close()


def test_episode_shapes_masks_and_determinism(scene):
    first = rollout_episode(scene, np.random.default_rng(3), 8)
    again = rollout_episode(scene, np.random.default_rng(3), 8)
    assert first["frames"].shape == (9, 64, 64, 3) and first["frames"].dtype == np.uint8
    assert first["masks"].shape == (9, 64, 64) and first["actions"].shape == (8, 2)
    assert first["qpos"].shape == (9, 4)
    assert 0.005 < first["masks"].mean() < 0.2  # the pusher and the box, not the table
    assert np.array_equal(first["frames"], again["frames"])
    assert np.array_equal(first["actions"], again["actions"])


def test_hidden_friction_and_mass_change_the_outcome_of_identical_actions(scene):
    start = (np.array([-0.12, -0.12]), np.array([-0.05, -0.05]))
    push = np.tile(np.array([[1.0, 1.0]], dtype=np.float32), (12, 1))  # straight into the box
    finals = {}
    for friction in FRICTIONS:
        for mass in MASSES:
            episode = rollout_episode(
                scene,
                np.random.default_rng(0),
                12,
                start=start,
                hidden=Hidden(friction, mass),
                actions=push,
            )
            assert np.array_equal(episode["actions"], push)
            finals[friction, mass] = episode["qpos"][-1, 2:]  # the box
    light_slippery = finals[FRICTIONS[0], MASSES[0]]
    heavy_sticky = finals[FRICTIONS[1], MASSES[1]]
    assert np.linalg.norm(light_slippery - heavy_sticky) > 0.02  # metres: several pixels apart
    assert np.linalg.norm(light_slippery - start[1]) > np.linalg.norm(heavy_sticky - start[1])


def test_a_static_scene_renders_identical_frames(scene):
    start = draw_start(np.random.default_rng(1))
    still = np.zeros((3, 2), dtype=np.float32)
    episode = rollout_episode(
        scene, np.random.default_rng(0), 3, start=start, hidden=Hidden(1.0, 0.6), actions=still
    )
    assert np.abs(episode["frames"][-1].astype(int) - episode["frames"][0]).max() <= 1
