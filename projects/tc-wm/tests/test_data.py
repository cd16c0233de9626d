"""The DataModule: windows, splits, pooling, seeds, bad input."""

import numpy as np
import pytest
import torch

from papers_cli import ConfigError
from tcwm.data import DataFormatError, TcwmDataModule, Windows, check_goal_tokens
from tcwm.pipeline import pool_tokens


def synthetic(**kwargs):
    data = TcwmDataModule(**{"n_episodes": 20, "episode_length": 10, "seed": 0, **kwargs})
    data.setup()
    return data


def test_windows_hold_consecutive_steps_of_one_episode():
    data = synthetic(history=2)
    item = data.train_set[5]
    assert item["tokens"].shape == (3, 1, 384) and item["actions"].shape == (3, 2)
    episode, start = data.train_set.index[5]
    torch.testing.assert_close(item["states"], data.arrays["states"][episode, start : start + 3])
    assert len(data.train_set) == len(data.episodes["train"]) * (10 - 3 + 1)


def test_splits_are_disjoint_episodes_and_seeded():
    data = synthetic()
    train, val, test = (set(data.episodes[k]) for k in ("train", "val", "test"))
    assert not (train & val or train & test or val & test)
    assert len(train | val | test) == 20
    again = synthetic()
    for key in ("train", "val", "test"):
        np.testing.assert_array_equal(again.episodes[key], data.episodes[key])


def test_the_seed_changes_the_episodes():
    first, other = synthetic(), synthetic(seed=1)
    assert not torch.equal(first.arrays["states"], other.arrays["states"])


def test_the_aligned_state_is_the_position_or_the_whole_state():
    data = synthetic(align_on="position")
    torch.testing.assert_close(data.arrays["aligned"], data.arrays["states"][..., :2])
    assert synthetic().align_dim == 2  # the synthetic state is the position


def test_actions_lead_from_each_state_to_the_next():
    from tcwm.synthetic import SyntheticWorld

    data = synthetic()
    world = SyntheticWorld()
    world.set_state(data.arrays["states"][0, 0].numpy())
    np.testing.assert_allclose(
        world.step(data.arrays["actions"][0, 0].numpy()),
        data.arrays["states"][0, 1].numpy(),
        rtol=1e-6,
    )


def test_pool_tokens_averages_square_blocks():
    tokens = torch.arange(16, dtype=torch.float32).reshape(1, 16, 1)  # a 4x4 grid, one channel
    pooled = pool_tokens(tokens, 2)
    torch.testing.assert_close(pooled[0, :, 0], torch.tensor([2.5, 4.5, 10.5, 12.5]))
    torch.testing.assert_close(pool_tokens(tokens, 4), tokens)
    with pytest.raises(ConfigError, match="token_grid"):
        pool_tokens(tokens, 3)
    with pytest.raises(DataFormatError, match="square"):
        pool_tokens(torch.zeros(1, 6, 1), 2)


def test_bad_configs_are_clear_errors():
    with pytest.raises(ConfigError, match="kappa"):
        TcwmDataModule(kappa=1.5)
    with pytest.raises(ConfigError, match="val_fraction"):
        TcwmDataModule(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ConfigError, match="shorter than a window"):
        synthetic(episode_length=2, history=2)
    with pytest.raises(ConfigError, match="data.root"):
        TcwmDataModule(source="dino_wm", seed=0).setup()


def test_a_goal_shaped_unlike_the_frames_is_a_clear_error():
    check_goal_tokens(torch.zeros(16, 128), (5, 16, 128))
    with pytest.raises(DataFormatError, match="goal"):
        check_goal_tokens(torch.zeros(64, 128), (5, 16, 128))


def test_windows_refuse_episodes_shorter_than_a_window():
    arrays = {"tokens": torch.zeros(2, 3, 1, 4)}
    with pytest.raises(ConfigError, match="shorter"):
        Windows(arrays, np.arange(2), 4)
