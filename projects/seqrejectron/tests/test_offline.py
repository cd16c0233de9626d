"""The real-data path: Minari datasets written in their on-disk format by rolling a controller
in gymnasium-robotics' PointMaze, read, trained on and deployed through `train`."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from papers_cli import ConfigError
from papers_cli.testing import run_train_test, user_error_message
from seqrejectron.cli import train
from seqrejectron.offline import (
    UNKNOWN,
    discretise_actions,
    flatten_observation,
    grid_action,
    load_offline_problem,
    make_env,
)

PROJECT = Path(__file__).resolve().parents[1]

ENV_ID = "PointMaze_UMaze-v3"
SHIFT = {
    "edits": [
        {"element": "opt", "field": "gravity", "value": [0.0, -2.0, 0.0]},
        {"element": "actuator", "name": "motor_x", "field": "gear", "scale": 0.6},
    ]
}


def write_dataset(root, dataset_id, specs, episode_ids, horizon=40):
    """Roll a goal-seeking proportional controller in PointMaze (with ``specs`` applied) and
    write the episodes as Minari does: T+1 dict observations, T actions, flags, given ids."""
    env = make_env(ENV_ID, horizon, specs)
    folder = root / dataset_id / "data"
    folder.mkdir(parents=True)
    with h5py.File(folder / "main_data.hdf5", "w") as f:
        for episode_id in episode_ids:
            obs, _ = env.reset(seed=episode_id)
            observations, actions, rewards, terms, truncs = [obs], [], [], [], []
            for _ in range(horizon):
                action = np.clip(3 * (obs["desired_goal"] - obs["achieved_goal"]), -1, 1)
                obs, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
                observations.append(obs)
                actions.append(action)
                rewards.append(reward)
                terms.append(terminated)
                truncs.append(truncated)
                if terminated or truncated:
                    break
            group = f.create_group(f"episode_{episode_id}")
            obs_group = group.create_group("observations")
            for key in observations[0]:
                obs_group[key] = np.stack([o[key] for o in observations])
            group["actions"] = np.array(actions, dtype=np.float32)
            group["rewards"] = np.array(rewards)
            group["terminations"] = np.array(terms)
            group["truncations"] = np.array(truncs)
    return root


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari")
    write_dataset(root, "pointmaze/train-v0", [], [0, 2, 5, 9, 11, 14])  # ids not contiguous
    write_dataset(root, "pointmaze/shifted-v0", [SHIFT], [100, 101, 103, 104])
    (root / "shift.json").write_text(json.dumps(SHIFT))
    return root


def offline_args(root, tmp_path):
    return [
        f"--config={PROJECT / 'configs' / 'minari.yaml'}",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=16",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.check_val_every_n_epoch=1",
        f"--trainer.default_root_dir={tmp_path}",
        f"--data.data_root={root}",
        "--data.train_dataset_id=pointmaze/train-v0",
        "--data.test_dataset_id=pointmaze/shifted-v0",
        f"--data.shift_spec={root / 'shift.json'}",
        "--data.n_train=6",
        "--data.n_test=4",
        "--data.n_eval=2",
        "--data.eval_horizon=30",
        "--data.steps_per_epoch=4",
        "--model.hidden=16",
        "--model.bc_steps=8",
        "--model.validator_steps=4",
    ]


def test_continuous_actions_round_to_the_grid_and_back():
    high = np.array([1.0, 2.0])
    actions = np.array([[0.9, -2.0], [0.2, 0.5], [-0.5, 0.7], [0.0, 0.0]])
    index = discretise_actions(actions, high)
    assert index.tolist() == [2 * 3 + 0, 1 * 3 + 1, 0 * 3 + 2, 4]
    assert np.allclose(grid_action(index[0], high), [1.0, -2.0])
    assert np.allclose(grid_action(index[2], high), [-1.0, 2.0])
    assert discretise_actions(np.array([2, 0, 1]), None).tolist() == [2, 0, 1]
    assert flatten_observation({"b": np.ones(2), "a": np.zeros(1)}).tolist() == [0, 1, 1]


def test_the_problem_reads_both_datasets_and_shifts_the_test_dynamics(minari_root):
    problem = load_offline_problem(
        minari_root,
        "pointmaze/train-v0",
        "pointmaze/shifted-v0",
        ENV_ID,
        minari_root / "shift.json",
        n_train=6,
        n_test=4,
        horizon=30,
    )
    assert (problem.in_features, problem.n_actions) == (8, 9)
    assert len(problem.train) == 6 and len(problem.test) == 4
    feats = np.concatenate([t.feats for t in problem.train])
    assert np.allclose(feats.mean(0), 0, atol=1e-4)  # standardised on the train states
    labels = np.concatenate([t.expert for t in problem.train])
    assert labels.min() >= 0 and labels.max() < 9 and len(set(labels.tolist())) > 1
    assert all((t.expert == UNKNOWN).all() for t in problem.test)  # test actions never read
    # the same seed and actions give other transitions in the test dynamics
    still = 4  # grid index of (0, 0): no force, so only the push moves the point in Q
    ends = []
    for dynamics in (problem.train_env, problem.test_env):
        obs, _ = dynamics.env.reset(seed=3)
        for _ in range(10):
            obs, *_ = dynamics.env.step(grid_action(still, dynamics.high))
        ends.append(obs["observation"][:2])
    assert np.linalg.norm(ends[0] - ends[1]) > 0.01
    trajectory = problem.test_env.rollout(lambda f, obs: still, 3)
    assert len(trajectory) == 30 and trajectory.cost == 1  # standing still never reaches the goal


def test_train_and_test_run_on_minari_data(minari_root, tmp_path):
    args = offline_args(minari_root, tmp_path)
    cli = train([*args, "--trainer.enable_checkpointing=true"])
    assert cli.model.pihat[-1].out_features == 9
    checkpoint = cli.trainer.checkpoint_callback.best_model_path
    stdout = run_train_test(PROJECT, args, checkpoint)
    for name in ("test/train_stop", "test/test_cost", "test/test_executed"):
        assert name in stdout


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--data.env_id=NoSuchMaze-v9", "unknown environment id"),
        ("--data.train_dataset_id=missing-v0", "missing-v0"),
        ("--data.in_features=6", "--data.in_features=8"),
        ("--data.n_test=50", "fewer than the 50"),
        ("--data.shift_spec=/nonexistent.json", "cannot read the shift spec"),
    ],
)
def test_bad_offline_input_is_a_clear_error(minari_root, tmp_path, flag, message, capsys):
    args = [*offline_args(minari_root, tmp_path), flag]
    assert message in user_error_message(train, args, capsys)


def test_observations_of_another_environment_are_rejected(minari_root):
    with pytest.raises(ConfigError, match="do not match"):
        load_offline_problem(
            minari_root,
            "pointmaze/train-v0",
            "pointmaze/shifted-v0",
            "InvertedPendulum-v5",
            minari_root / "shift.json",
            n_train=6,
            n_test=4,
        )
