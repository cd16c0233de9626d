"""robomimic HDF5: hand-built fixtures in robomimic's own layout, round trips through the writer,
and errors that name what is wrong and what is there."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from papers_worldmodels.errors import DataFormatError
from papers_worldmodels.robomimic import (
    Demo,
    camera_key,
    read_robomimic,
    read_robomimic_env_args,
    write_robomimic,
)

STATE_KEYS = ["robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"]
STATE_WIDTHS = {"robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2}


def hand_built(path, demos=(9, 10, 2), steps=5, size=84):
    """A robomimic-style file written with raw h5py calls, independent of the module's writer:
    84x84 HWC agentview and wrist images, three proprioception keys, byte-string splits."""
    rng = np.random.default_rng(0)
    arrays = {}
    with h5py.File(path, "w") as file:
        data = file.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1})
        for i in demos:
            t = steps + i % 3  # demos of different lengths
            obs = {
                "agentview_image": rng.integers(0, 256, (t, size, size, 3), dtype=np.uint8),
                "robot0_eye_in_hand_image": rng.integers(0, 256, (t, size, size, 3), np.uint8),
                "object": rng.standard_normal((t, 10)),
            }
            obs |= {k: rng.standard_normal((t, w)) for k, w in STATE_WIDTHS.items()}
            actions = rng.standard_normal((t, 7))  # float64, as robomimic stores them
            file[f"data/demo_{i}/actions"] = actions
            for key, value in obs.items():
                file[f"data/demo_{i}/obs/{key}"] = value
            arrays[f"demo_{i}"] = {"actions": actions, **obs}
        file["mask/train"] = np.array([b"demo_10", b"demo_2"])
        file["mask/valid"] = np.array([b"demo_9"])
    return arrays


def test_hand_built_file_reads_in_numeric_order_with_states_concatenated_in_order(tmp_path):
    path = tmp_path / "image.hdf5"
    arrays = hand_built(path)

    demos = read_robomimic(path, "agentview_image", state_keys=STATE_KEYS)
    assert [d.name for d in demos] == ["demo_2", "demo_9", "demo_10"]  # not string order
    for demo in demos:
        source = arrays[demo.name]
        t = len(source["actions"])
        assert demo.frames.dtype == np.uint8 and demo.frames.shape == (t, 84, 84, 3)
        np.testing.assert_array_equal(demo.frames, source["agentview_image"])  # HWC kept exactly
        assert demo.actions.dtype == np.float32 and demo.states.dtype == np.float32
        np.testing.assert_array_equal(demo.actions, source["actions"].astype(np.float32))
        assert demo.states.shape == (t, 9)
        np.testing.assert_array_equal(demo.states[:, :3], source["robot0_eef_pos"].astype("f4"))
        np.testing.assert_array_equal(demo.states[:, 3:7], source["robot0_eef_quat"].astype("f4"))
        np.testing.assert_array_equal(
            demo.states[:, 7:], source["robot0_gripper_qpos"].astype("f4")
        )

    # the caller's order, not the file's (alphabetical) one
    reordered = read_robomimic(path, "agentview_image", state_keys=STATE_KEYS[::-1])
    np.testing.assert_array_equal(reordered[0].states[:, :2], demos[0].states[:, 7:])
    np.testing.assert_array_equal(reordered[0].states[:, 2:6], demos[0].states[:, 3:7])
    # another image key, no state keys: empty states
    wrist = read_robomimic(path, "robot0_eye_in_hand_image")
    np.testing.assert_array_equal(wrist[2].frames, arrays["demo_10"]["robot0_eye_in_hand_image"])
    assert wrist[0].states.shape == (len(wrist[0].frames), 0)
    # a lone key as a string is one key, not its letters
    assert read_robomimic(path, "agentview_image", state_keys="object")[0].states.shape[1] == 10


def test_byte_string_splits_are_decoded(tmp_path):
    path = tmp_path / "image.hdf5"
    hand_built(path)
    with h5py.File(path) as file:
        assert isinstance(file["mask/train"][0], bytes)  # the fixture stores what robomimic does
    train = read_robomimic(path, "agentview_image", filter_key="train")
    assert [d.name for d in train] == ["demo_2", "demo_10"]
    valid = read_robomimic(path, "agentview_image", filter_key="valid")
    assert [d.name for d in valid] == ["demo_9"]
    assert read_robomimic_env_args(path) == {"env_name": "Lift", "type": 1}


def test_rla_wm_camera_path(tmp_path):
    """rla-wm names a camera and reads obs/<camera>_image, its joint positions when present."""
    assert camera_key("agentview") == "agentview_image"
    path = tmp_path / "cams.hdf5"
    images = np.random.default_rng(0).integers(0, 256, (7, 32, 48, 3), dtype=np.uint8)
    with h5py.File(path, "w") as file:
        for i in range(3):
            file[f"data/demo_{i}/actions"] = np.full((7, 7), i, np.float64)
            file[f"data/demo_{i}/obs/robot0_eye_in_hand_image"] = images + i
        file["data/demo_1/obs/robot0_joint_pos"] = np.ones((7, 7))
        file["mask/20_percent"] = np.array([b"demo_2", b"demo_0"])

    read = read_robomimic(
        path,
        camera_key("robot0_eye_in_hand"),
        state_keys=["robot0_joint_pos"],
        optional_states=True,
    )
    np.testing.assert_array_equal(read[2].frames, images + 2)
    assert read[0].states.shape == (7, 0) and read[0].states.dtype == np.float32
    assert read[1].states.shape == (7, 7) and (read[1].states == 1).all()
    assert (read[2].actions == 2).all()
    # without optional_states a missing state key is an error naming what is there
    with pytest.raises(DataFormatError, match="robot0_joint_pos not found in .*demo_0/obs"):
        read_robomimic(path, camera_key("robot0_eye_in_hand"), state_keys=["robot0_joint_pos"])
    chosen = read_robomimic(path, camera_key("robot0_eye_in_hand"), filter_key="20_percent")
    assert [d.name for d in chosen] == ["demo_0", "demo_2"]


def test_optional_states_are_all_or_none(tmp_path):
    path = tmp_path / "image.hdf5"
    hand_built(path, demos=(0,))
    with h5py.File(path, "a") as file:
        del file["data/demo_0/obs/robot0_eef_quat"]
    keys = ["robot0_eef_pos", "robot0_eef_quat"]
    with pytest.raises(DataFormatError, match="robot0_eef_quat not found"):
        read_robomimic(path, "agentview_image", state_keys=keys, optional_states=True)
    none = read_robomimic(path, "agentview_image", state_keys=["absent"], optional_states=True)
    assert none[0].states.shape == (5, 0)


def test_missing_obs_keys_list_the_keys_present(tmp_path):
    path = tmp_path / "image.hdf5"
    hand_built(path, demos=(0,))

    with pytest.raises(DataFormatError) as info:
        read_robomimic(path, camera_key("frontview"))
    message = str(info.value)
    assert "Camera 'frontview' not found" in message and "there is no frontview_image" in message
    assert "Image keys found: agentview_image, robot0_eye_in_hand_image." in message
    assert "Obs keys present: agentview_image, object, robot0_eef_pos" in message
    assert "data/demo_0/obs" in message and str(path) in message and info.value.user_facing

    with pytest.raises(DataFormatError, match="Image key 'agentview' not found.*agentview_image"):
        read_robomimic(path, "agentview")

    with pytest.raises(DataFormatError) as info:
        read_robomimic(path, "agentview_image", state_keys=["robot0_eef_pos", "robot0_joint_pos"])
    message = str(info.value)
    assert "State key robot0_joint_pos not found" in message
    assert "Obs keys present: agentview_image, object, robot0_eef_pos, robot0_eef_quat" in message


def test_channels_first_images_and_length_mismatches_are_named(tmp_path):
    path = tmp_path / "bad.hdf5"
    hand_built(path, demos=(0,), steps=6)
    with h5py.File(path, "a") as file:
        del file["data/demo_0/obs/robot0_gripper_qpos"]
        file["data/demo_0/obs/robot0_gripper_qpos"] = np.zeros((5, 2))
    with pytest.raises(
        DataFormatError, match="obs/robot0_gripper_qpos has 5 steps but obs/agentview_image has 6"
    ):
        read_robomimic(path, "agentview_image", state_keys=STATE_KEYS)

    with h5py.File(path, "a") as file:
        del file["data/demo_0/actions"]
        file["data/demo_0/actions"] = np.zeros((4, 7), np.float32)
    with pytest.raises(DataFormatError, match="actions has 4 steps but obs/agentview_image has 6"):
        read_robomimic(path, "agentview_image")

    with h5py.File(path, "a") as file:
        del file["data/demo_0/obs/agentview_image"]
        file["data/demo_0/obs/agentview_image"] = np.zeros((4, 3, 84, 84), np.uint8)
    with pytest.raises(DataFormatError) as info:
        read_robomimic(path, "agentview_image")
    message = str(info.value)
    assert "[4, 3, 84, 84], channels first" in message and "transpose(0, 2, 3, 1)" in message

    with h5py.File(path, "a") as file:
        del file["data/demo_0/obs/agentview_image"]
        file["data/demo_0/obs/agentview_image"] = np.zeros((4, 84, 84, 3), np.float32)
    with pytest.raises(DataFormatError, match="holds float32 .*expected uint8"):
        read_robomimic(path, "agentview_image")


def test_file_level_errors_are_informative(tmp_path):
    with pytest.raises(DataFormatError, match="Missing robomimic file"):
        read_robomimic(tmp_path / "absent.hdf5", "agentview_image")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(DataFormatError, match="Cannot open .* as HDF5"):
        read_robomimic(tmp_path / "text.hdf5", "agentview_image")
    with h5py.File(tmp_path / "empty.hdf5", "w"):
        pass
    with pytest.raises(DataFormatError, match="no 'data' group"):
        read_robomimic(tmp_path / "empty.hdf5", "agentview_image")
    with h5py.File(tmp_path / "nodemos.hdf5", "w") as file:
        file["data/trajectory_0/actions"] = np.zeros((2, 2))
    with pytest.raises(DataFormatError, match=r"no data/demo_<i> groups \(it holds: trajectory_0"):
        read_robomimic(tmp_path / "nodemos.hdf5", "agentview_image")

    path = tmp_path / "image.hdf5"
    hand_built(path, demos=(0, 1))
    with pytest.raises(
        DataFormatError, match="'test' not found.*Available filter keys: train, val"
    ):
        read_robomimic(path, "agentview_image", filter_key="test")
    with pytest.raises(DataFormatError, match="mask/train .* not in data/: demo_10, demo_2"):
        read_robomimic(path, "agentview_image", filter_key="train")
    with h5py.File(path, "a") as file:
        del file["mask"]
        del file["data/demo_1/obs"]
    with pytest.raises(DataFormatError, match="no mask group"):
        read_robomimic(path, "agentview_image", filter_key="train")
    with pytest.raises(DataFormatError, match=r"demo_1 needs 'actions' and an 'obs' group"):
        read_robomimic(path, "agentview_image")
    assert read_robomimic_env_args(path)["env_name"] == "Lift"


def demo(name, steps=6, state_width=9, seed=0):
    rng = np.random.default_rng(seed)
    return Demo(
        frames=rng.integers(0, 256, (steps, 84, 84, 3), dtype=np.uint8),
        states=rng.standard_normal((steps, state_width)).astype(np.float32),
        actions=rng.standard_normal((steps, 7)).astype(np.float32),
        name=name,
    )


def test_writer_round_trip_splits_states_into_their_keys(tmp_path):
    demos = [demo(f"demo_{i}", steps=4 + i % 3, seed=i) for i in (10, 2, 9)]
    path = write_robomimic(
        tmp_path / "sub" / "out.hdf5",
        demos,
        "agentview_image",
        state_keys=STATE_KEYS,
        state_sizes=[3, 4, 2],
        filter_keys={"train": ["demo_10", "demo_2"], "valid": ["demo_9"]},
        env_args={"env_name": "Lift"},
    )
    with h5py.File(path) as file:
        quat = file["data/demo_2/obs/robot0_eef_quat"][()]
        assert file["data"].attrs["total"] == sum(len(d.frames) for d in demos)
        assert file["mask/valid"][0] == b"demo_9"
    np.testing.assert_array_equal(quat, demos[1].states[:, 3:7])

    read = read_robomimic(path, "agentview_image", state_keys=STATE_KEYS)
    assert [d.name for d in read] == ["demo_2", "demo_9", "demo_10"]
    by_name = {d.name: d for d in demos}
    for got in read:
        for field in ("frames", "states", "actions"):
            np.testing.assert_array_equal(getattr(got, field), getattr(by_name[got.name], field))
    train = read_robomimic(path, "agentview_image", filter_key="train")
    assert [d.name for d in train] == ["demo_2", "demo_10"]
    assert read_robomimic_env_args(path) == {"env_name": "Lift"}

    # one key takes every column; empty states write no state keys
    write_robomimic(
        tmp_path / "one.hdf5",
        [demo("demo_0", state_width=7)],
        "a_image",
        state_keys=["robot0_joint_pos"],
    )
    one = read_robomimic(tmp_path / "one.hdf5", "a_image", state_keys=["robot0_joint_pos"])
    assert one[0].states.shape == (6, 7)
    write_robomimic(
        tmp_path / "none.hdf5",
        [demo("demo_0", state_width=0)],
        "a_image",
        state_keys=["robot0_joint_pos"],
    )
    with h5py.File(tmp_path / "none.hdf5") as file:
        assert sorted(file["data/demo_0/obs"]) == ["a_image"]


def test_writer_errors(tmp_path):
    with pytest.raises(DataFormatError, match="named demo_<i>, got 'episode_0'"):
        write_robomimic(tmp_path / "x.hdf5", [demo("episode_0")], "agentview_image")
    with pytest.raises(DataFormatError, match="9 columns.*summing to 9"):
        write_robomimic(
            tmp_path / "x.hdf5", [demo("demo_0")], "agentview_image", state_keys=STATE_KEYS
        )
    with pytest.raises(DataFormatError, match="9 columns"):
        write_robomimic(
            tmp_path / "x.hdf5",
            [demo("demo_0")],
            "agentview_image",
            state_keys=STATE_KEYS,
            state_sizes=[3, 4, 3],
        )
    assert not (tmp_path / "x.hdf5").exists()  # checked before anything is written
