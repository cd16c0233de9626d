import json

import h5py
import mujoco
import numpy as np
import pytest

from papers_data import DatasetNotFoundError
from seqrejectron.minari_format import (
    MinariFormatError,
    ShiftSpecError,
    apply_shift,
    check_same_observation_space,
    load_minari,
    read_shift_spec,
)

BALL = """<mujoco><worldbody><body name="ball" pos="0 0 1"><freejoint name="slide"/>
<geom name="g" type="sphere" size="0.1" mass="1"/></body></worldbody>
<actuator><motor name="push" joint="slide" gear="1 0 0 0 0 0"/></actuator></mujoco>"""


def write_minari(root, dataset_id="pointmaze/test-v0", dict_obs=True, bad_episode=False):
    """A Minari-format file with awkward cases: ids 0, 3, 7 (not contiguous), a dict observation,
    one episode truncated and one terminated."""
    folder = root / dataset_id / "data"
    folder.mkdir(parents=True)
    with h5py.File(folder / "main_data.hdf5", "w") as f:
        for episode_id, length, terminated in [(7, 2, False), (0, 4, True), (3, 3, False)]:
            group = f.create_group(f"episode_{episode_id}")
            n_obs = length + 1 - int(bad_episode and episode_id == 3)
            if dict_obs:
                obs = group.create_group("observations")
                obs["observation"] = np.full((n_obs, 4), episode_id, dtype=np.float64)
                obs["desired_goal"] = np.arange(n_obs * 2, dtype=np.float64).reshape(n_obs, 2)
            else:
                group["observations"] = np.zeros((n_obs, 4))
            group["actions"] = np.ones((length, 2), dtype=np.float32)
            group["rewards"] = np.zeros(length)
            group["terminations"] = np.array([False] * (length - 1) + [terminated])
            group["truncations"] = np.array([False] * (length - 1) + [not terminated])
    return root


def test_minari_loader_parses_awkward_episodes(tmp_path):
    episodes = load_minari(write_minari(tmp_path), "pointmaze/test-v0")
    assert [e.id for e in episodes] == [0, 3, 7]
    assert [len(e.actions) for e in episodes] == [4, 3, 2]
    assert [(e.terminated, e.truncated) for e in episodes] == [
        (True, False),
        (False, True),
        (False, True),
    ]
    first = episodes[0]
    assert first.observations.shape == (5, 6)  # desired_goal (2) then observation (4), sorted keys
    np.testing.assert_array_equal(first.observations[:, 2:], 0)
    np.testing.assert_array_equal(first.observations[1, :2], [2, 3])


def test_minari_loader_errors(tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError, match="main_data.hdf5"):
        load_minari(tmp_path, "missing-v0")
    write_minari(tmp_path / "bad", bad_episode=True)
    with pytest.raises(MinariFormatError, match="T\\+1 observations"):
        load_minari(tmp_path / "bad", "pointmaze/test-v0")


def test_test_trajectories_in_another_observation_space_are_rejected(tmp_path):
    train = load_minari(write_minari(tmp_path / "a"), "pointmaze/test-v0")
    test = load_minari(write_minari(tmp_path / "b", dict_obs=False), "pointmaze/test-v0")
    with pytest.raises(MinariFormatError, match="observation space"):
        check_same_observation_space(train, test)
    with pytest.raises(MinariFormatError, match="empty"):
        check_same_observation_space(train, [])


def falling_velocity(model, steps=50, force=1.0):
    data = mujoco.MjData(model)
    for _ in range(steps):
        data.ctrl[:] = force
        mujoco.mj_step(model, data)
    return data.qvel.copy()


def test_a_mass_edit_needs_set_const_and_changes_the_dynamics():
    model = mujoco.MjModel.from_xml_string(BALL)
    before = model.body_invweight0[1, 0]
    velocity = falling_velocity(model)
    apply_shift(
        model, {"edits": [{"element": "body", "name": "ball", "field": "mass", "scale": 2.0}]}
    )
    assert model.body_mass[1] == pytest.approx(2.0)
    assert model.body_invweight0[1, 0] == pytest.approx(before / 2)  # recomputed by mj_setConst
    shifted = falling_velocity(model)
    assert shifted[0] == pytest.approx(velocity[0] / 2, rel=1e-3)  # same push, twice the mass


def test_wind_and_gain_edits_change_the_transitions(tmp_path):
    path = tmp_path / "shift.json"
    path.write_text(
        json.dumps(
            {
                "edits": [
                    {"element": "actuator", "name": "push", "field": "gear", "scale": 0.5},
                    {"element": "opt", "field": "density", "value": 1.2},
                    {"element": "opt", "field": "wind", "value": [0.0, 3.0, 0.0]},
                ]
            }
        )
    )
    model = mujoco.MjModel.from_xml_string(BALL)
    nominal = falling_velocity(model)
    apply_shift(model, read_shift_spec(path))
    assert model.actuator_gear[0, 0] == pytest.approx(0.5)
    shifted = falling_velocity(model)
    assert shifted[0] == pytest.approx(nominal[0] / 2, rel=1e-3) and abs(shifted[1]) > 1e-4


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"element": "body", "name": "ball", "field": "no_such_field", "scale": 2},
            "body_no_such_field",
        ),
        ({"element": "opt", "field": "windd", "value": [0, 0, 0]}, "windd"),
        ({"element": "body", "name": "nobody", "field": "mass", "scale": 2}, "nobody"),
        ({"element": "tendon_x", "field": "mass", "scale": 2}, "element kind"),
        ({"element": "body", "name": "ball", "field": "mass"}, "scale"),
    ],
)
def test_a_shift_spec_naming_what_mujoco_lacks_is_a_clear_error(edit, message):
    model = mujoco.MjModel.from_xml_string(BALL)
    with pytest.raises(ShiftSpecError, match=message):
        apply_shift(model, {"edits": [edit]})


def test_an_unreadable_shift_spec_is_a_clear_error(tmp_path):
    (tmp_path / "s.json").write_text('{"edit": []}')
    with pytest.raises(ShiftSpecError, match="edits"):
        read_shift_spec(tmp_path / "s.json")


def test_environment_a_rejects_an_empty_or_mismatched_unlabelled_set():
    from papers_cli import ConfigError
    from seqrejectron.data import check_same_space
    from seqrejectron.envs import Layout, expert_policy

    small, large = Layout(7, 1, 40, 1), Layout(9, 2, 80, 1)
    train = [small.rollout(expert_policy, s) for s in range(3)]
    with pytest.raises(ConfigError, match="empty"):
        check_same_space(train, [])
    # every grid shares one feature space (coordinates scaled to [0, 1]) ...
    check_same_space(train, [large.rollout(expert_policy, 0)])
    # ... a trajectory of another width (another environment's states) is refused
    other = large.rollout(expert_policy, 0)
    other.feats = other.feats[:, :-4]
    with pytest.raises(ConfigError, match="another observation space"):
        check_same_space(train, [other])
