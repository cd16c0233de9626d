"""Real-data formats: round trips through the writers, hand-built fixtures, and the errors.

The robomimic reader's own cases (numeric demo order, byte-string splits, channels-first images,
missing keys) are tested with it, in shared/worldmodels/tests; here, rla-wm's use of it."""

from __future__ import annotations

import av
import h5py
import numpy as np
import pytest
import torch

from rlawm.formats import (
    DataFormatError,
    Episode,
    check_tokens,
    decode_video,
    list_trajectories,
    read_robomimic,
    read_trajectory_dir,
    write_trajectory_dir,
)


def smooth_episode(name, steps=8, size=32, joints=7, seed=0):
    """Moving gradients (mp4-friendly) and a moving disc mask with sharp edges."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size] / size
    frames = np.stack(
        [
            np.stack([xx * 200 + 4 * t, yy * 150 + 40, (xx + yy) * 80 + 10 * t], axis=-1)
            for t in range(steps)
        ]
    ).astype(np.uint8)
    masks = np.stack([(xx - 0.25 - 0.05 * t) ** 2 + (yy - 0.5) ** 2 < 0.04 for t in range(steps)])
    qpos = rng.standard_normal((steps, joints)).astype(np.float32)
    return Episode(frames, masks, qpos, qpos, name)


def encode_by_hand(path, frames, codec="mpeg4"):
    """A video written with raw PyAV calls, independent of the module's writer."""
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=5)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.bit_rate = 1_000_000  # mpeg4's default is so low that mask edges cross 127
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def grey_video(masks):
    return np.repeat(masks[..., None].astype(np.uint8) * 255, 3, axis=-1)


# ---------------------------------------------------------------- trajectory folders


def test_trajectory_round_trip_recovers_frames_masks_and_qpos(tmp_path):
    episode = smooth_episode("traj_3")
    episode.success = True
    folder = write_trajectory_dir(tmp_path / "traj_3", episode, "base_camera")
    assert not (folder / "target_qpos.npy").exists()  # actions == qpos needs no second file

    raw_mask = decode_video(folder / "base_camera_foreground_mask.mp4")
    assert not np.isin(raw_mask, [0, 255]).all()  # the compression noise is really there

    read = read_trajectory_dir(folder, "base_camera")
    assert read.frames.dtype == np.uint8 and read.frames.shape == episode.frames.shape
    assert np.abs(read.frames.astype(float) - episode.frames).mean() < 12
    assert read.masks.dtype == bool
    np.testing.assert_array_equal(read.masks, episode.masks)
    np.testing.assert_array_equal(read.qpos, episode.qpos)
    np.testing.assert_array_equal(read.actions, episode.qpos)
    assert read.name == "traj_3" and read.success is True


def test_trajectory_built_by_hand_with_npz_targets_and_resize(tmp_path):
    episode = smooth_episode("traj_0", steps=6, size=48, joints=3)
    folder = tmp_path / "traj_0"
    folder.mkdir()
    encode_by_hand(folder / "hand_rgb.mp4", episode.frames)
    encode_by_hand(folder / "hand_foreground_mask.mp4", grey_video(episode.masks))
    np.savez(folder / "qpos.npz", qpos=episode.qpos.astype(np.float64))
    target = episode.qpos + 1
    np.save(folder / "target_qpos.npy", target)
    np.save(folder / "success.npy", np.array([0, 0, 1, 0, 0, 0], dtype=bool))

    read = read_trajectory_dir(folder, "hand")
    assert np.abs(read.frames.astype(float) - episode.frames).mean() < 12
    np.testing.assert_array_equal(read.masks, episode.masks)
    assert read.qpos.dtype == np.float32 and read.actions.dtype == np.float32
    np.testing.assert_allclose(read.actions, target)
    assert read.success is True

    small = read_trajectory_dir(folder, "hand", size=16)
    assert small.frames.shape == (6, 16, 16, 3) and small.frames.dtype == np.uint8
    assert small.masks.shape == (6, 16, 16) and small.masks.dtype == bool
    # 48 -> 16 nearest keeps pixels 0, 3, 6, ... of the full-size mask.
    np.testing.assert_array_equal(small.masks, episode.masks[:, ::3, ::3])


def test_list_trajectories_sorts_numerically(tmp_path):
    for i in (10, 9, 2, 1):
        (tmp_path / f"traj_{i}").mkdir()
    (tmp_path / "traj_notes").mkdir()
    (tmp_path / "traj_5").write_text("a file, not a folder")
    assert [p.name for p in list_trajectories(tmp_path)] == [
        "traj_1",
        "traj_2",
        "traj_9",
        "traj_10",
    ]


def test_list_trajectories_without_any_names_the_layout(tmp_path):
    with pytest.raises(DataFormatError, match="traj_<id>") as info:
        list_trajectories(tmp_path)
    assert str(tmp_path) in str(info.value) and "qpos.npy" in str(info.value)
    assert info.value.user_facing


def test_trajectory_errors_are_informative(tmp_path):
    episode = smooth_episode("traj_0", steps=6)
    folder = write_trajectory_dir(tmp_path / "traj_0", episode, "front")
    (folder / "wrist_rgb.mp4").write_bytes((folder / "front_rgb.mp4").read_bytes())

    with pytest.raises(DataFormatError, match="Cameras found: front, wrist"):
        read_trajectory_dir(folder, "side")
    with pytest.raises(DataFormatError, match="wrist_foreground_mask.mp4"):
        read_trajectory_dir(folder, "wrist")

    np.save(folder / "qpos.npy", np.zeros((5, 7), np.float32))
    with pytest.raises(DataFormatError, match="has 5 steps but .* has 6 frames"):
        read_trajectory_dir(folder, "front")
    (folder / "qpos.npy").unlink()
    with pytest.raises(DataFormatError, match="qpos.npy"):
        read_trajectory_dir(folder, "front")
    np.savez(folder / "qpos.npz", joints=episode.qpos)
    with pytest.raises(DataFormatError, match="no array 'qpos'.*joints"):
        read_trajectory_dir(folder, "front")


def test_mask_and_rgb_videos_must_agree(tmp_path):
    episode = smooth_episode("traj_0", steps=6)
    folder = write_trajectory_dir(tmp_path / "traj_0", episode, "cam")
    mask = folder / "cam_foreground_mask.mp4"

    encode_by_hand(mask, grey_video(episode.masks[:4]))
    with pytest.raises(DataFormatError, match="has 4 frames but cam_rgb.mp4 has 6"):
        read_trajectory_dir(folder, "cam")
    encode_by_hand(mask, grey_video(episode.masks[:, :16]))
    with pytest.raises(DataFormatError, match="32x16 pixels but cam_rgb.mp4 is 32x32"):
        read_trajectory_dir(folder, "cam")


def test_writer_rejects_odd_sizes(tmp_path):
    episode = smooth_episode("traj_0", steps=6, size=32)
    episode.frames, episode.masks = episode.frames[:, :31], episode.masks[:, :31]
    with pytest.raises(DataFormatError, match="even width and height"):
        write_trajectory_dir(tmp_path / "traj_0", episode, "cam")


# ---------------------------------------------------------------- robomimic HDF5


def test_robomimic_reads_into_episodes_by_camera_with_joint_positions_when_present(tmp_path):
    path = tmp_path / "image.hdf5"
    images = np.random.default_rng(0).integers(0, 256, (7, 32, 48, 3), dtype=np.uint8)
    joints = np.arange(7 * 7, dtype=np.float64).reshape(7, 7)
    with h5py.File(path, "w") as file:
        for i in (10, 2, 9):
            file[f"data/demo_{i}/actions"] = np.full((7, 7), i, np.float64)
            file[f"data/demo_{i}/obs/agentview_image"] = images + i
            file[f"data/demo_{i}/obs/wrist_image"] = images
        file["data/demo_9/obs/robot0_joint_pos"] = joints
        file["mask/valid"] = np.array([b"demo_9"])

    episodes = read_robomimic(path, "agentview")
    assert [e.name for e in episodes] == ["demo_2", "demo_9", "demo_10"]
    first, with_joints = episodes[0], episodes[1]
    assert isinstance(first, Episode) and first.success is None
    np.testing.assert_array_equal(first.frames, images + 2)
    assert first.masks.shape == (7, 32, 48) and first.masks.dtype == bool and first.masks.all()
    assert first.actions.dtype == np.float32 and (first.actions == 2).all()
    assert first.qpos.shape == (7, 0) and first.qpos.dtype == np.float32
    np.testing.assert_array_equal(with_joints.qpos, joints.astype(np.float32))
    assert [e.name for e in read_robomimic(path, "agentview", filter_key="valid")] == ["demo_9"]

    with pytest.raises(DataFormatError) as info:
        read_robomimic(path, "frontview")
    message = str(info.value)
    assert "Camera 'frontview' not found" in message and "there is no frontview_image" in message
    assert "Image keys found: agentview_image, wrist_image" in message
    assert "without the '_image' suffix" in message and info.value.user_facing


# ---------------------------------------------------------------- cached tokens


def test_check_tokens():
    check_tokens(torch.zeros(2, 256, 384), 256, 384, "cache.pt")
    check_tokens(np.zeros((2, 256, 384), np.float16), 256, 384, "cache.pt")
    with pytest.raises(DataFormatError) as info:
        check_tokens(torch.zeros(2, 196, 384), 256, 384, "runs/tokens.pt")
    message = str(info.value)
    assert "[2, 196, 384]" in message and "[N, 256, 384]" in message
    assert "Delete runs/tokens.pt" in message and "encoder settings" in message
    with pytest.raises(DataFormatError, match="int64"):
        check_tokens(torch.zeros(2, 256, 384, dtype=torch.long), 256, 384, "cache.pt")
    with pytest.raises(DataFormatError, match=r"\[256, 384\]"):
        check_tokens(torch.zeros(256, 384), 256, 384, "cache.pt")
