"""The real-data formats, read from fixtures written here in the formats' own layouts."""

import json

import h5py
import numpy as np
import pytest
import torch

from tcwm import data
from tcwm.formats import (
    DataFormatError,
    Episode,
    check_episode_compatible,
    read_dino_wm,
    read_minari,
    resize_frames,
    write_dino_wm,
    write_minari_fixture,
)


def make_episode(steps, *, size=8, state_dim=4, action_dim=2, seed=0, frames=True, name="ep"):
    rng = np.random.default_rng(seed)
    return Episode(
        rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8) if frames else None,
        rng.normal(size=(steps, state_dim)).astype(np.float32),
        rng.uniform(-1, 1, (steps, action_dim)).astype(np.float32),
        name,
    )


def assert_same(read, written):
    assert read.name == written.name
    np.testing.assert_array_equal(read.states, written.states)
    np.testing.assert_array_equal(read.actions, written.actions)
    assert read.states.dtype == read.actions.dtype == np.float32
    if written.frames is None:
        assert read.frames is None
    else:
        np.testing.assert_array_equal(read.frames, written.frames)


def save_dino_wm(root, frames, states, actions, lengths, names=None):
    """A DINO-WM folder written tensor by tensor, as DINO-WM's data have it."""
    (root / "obses").mkdir(parents=True)
    for i, episode_frames in enumerate(frames):
        name = names[i] if names else f"episode_{i:03d}.pth"
        torch.save(torch.as_tensor(episode_frames), root / "obses" / name)
    torch.save(torch.as_tensor(states), root / "states.pth")
    torch.save(torch.as_tensor(actions), root / "actions.pth")
    torch.save(torch.as_tensor(lengths), root / "seq_lengths.pth")
    return root


def valid_dino_wm(root, lengths=(3, 2), tmax=4):
    n = len(lengths)
    frames = [np.zeros((tmax, 4, 4, 3), np.uint8) for _ in range(n)]
    states = np.zeros((n, tmax, 4), np.float32)
    actions = np.zeros((n, tmax, 2), np.float32)
    return save_dino_wm(root, frames, states, actions, list(lengths))


# ---------------------------------------------------------------- Episode and helpers


def test_data_module_raises_the_formats_error():
    assert data.DataFormatError is DataFormatError
    assert issubclass(DataFormatError, ValueError) and DataFormatError.user_facing


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"states": np.zeros((3, 4))}, r"states is float64 \[3, 4\]; expected a float32"),
        ({"actions": np.zeros(3, np.float32)}, r"actions is float32 \[3\]; expected a float32"),
        ({"actions": np.zeros((2, 2), np.float32)}, "states have 3 steps but actions 2"),
        ({"states": np.full((3, 4), np.nan, np.float32)}, "NaN or infinite"),
        ({"frames": np.zeros((3, 8, 8, 3), np.float32)}, r"expected uint8 \[T, H, W, 3\]"),
        ({"frames": np.zeros((3, 3, 8, 8), np.uint8)}, "channels first"),
        ({"frames": np.zeros((2, 8, 8, 3), np.uint8)}, "2 frames but 3 states"),
        (
            {
                "frames": np.zeros((0, 8, 8, 3), np.uint8),
                "states": np.zeros((0, 4), np.float32),
                "actions": np.zeros((0, 2), np.float32),
            },
            "has no steps",
        ),
    ],
)
def test_episode_rejects_bad_arrays(change, message):
    fields = vars(make_episode(3)) | change
    with pytest.raises(DataFormatError, match=message):
        Episode(**fields)


def test_resize_frames_shrinks_and_enlarges():
    frames = np.zeros((2, 224, 224, 3), np.uint8)
    frames[..., 0], frames[..., 1], frames[..., 2] = 10, 128, 250
    small = resize_frames(frames, 64)
    assert small.shape == (2, 64, 64, 3) and small.dtype == np.uint8
    np.testing.assert_array_equal(small, np.broadcast_to([10, 128, 250], small.shape))
    # A ramp keeps its range and mean through the resize.
    ramp = np.broadcast_to(np.arange(84, dtype=np.uint8)[None, None, :, None] * 3, (1, 84, 84, 3))
    large = resize_frames(np.ascontiguousarray(ramp), 224)
    assert large.shape == (1, 224, 224, 3)
    assert abs(large.mean() - ramp.mean()) < 1.0
    assert np.all(np.diff(large[0, 0, :, 0].astype(int)) >= 0)  # still increasing
    assert resize_frames(small, 64) is small  # already that size: no copy


def test_resize_frames_antialiases_when_shrinking():
    # A one-pixel checkerboard shrunk 224 -> 64 averages to flat grey; plain bilinear sampling
    # would alias it into stripes between ~96 and ~159.
    board = (np.indices((224, 224)).sum(0) % 2 * 255).astype(np.uint8)
    small = resize_frames(np.repeat(board[None, ..., None], 3, axis=-1), 64)
    assert small.min() >= 126 and small.max() <= 129


@pytest.mark.parametrize("size", [0, -3, 2.5, True, None])
def test_resize_frames_rejects_bad_sizes(size):
    with pytest.raises(DataFormatError, match="size must be a positive integer"):
        resize_frames(np.zeros((1, 4, 4, 3), np.uint8), size)


def test_resize_frames_rejects_bad_frames():
    with pytest.raises(DataFormatError, match="channels first"):
        resize_frames(np.zeros((1, 3, 4, 4), np.uint8), 8)


def test_check_episode_compatible_names_both_sizes_and_the_flag():
    episode = make_episode(3, state_dim=4, action_dim=2)
    check_episode_compatible(episode, 4, 2)  # matching sizes pass
    with pytest.raises(DataFormatError, match=r"size 4 .*state_dim=7; set --data.state_dim=4"):
        check_episode_compatible(episode, 7, 2)
    with pytest.raises(DataFormatError, match=r"size 2 .*action_dim=3; set --data.action_dim=2"):
        check_episode_compatible(episode, 4, 3)
    with pytest.raises(DataFormatError, match="set --model.action_dim=2"):
        check_episode_compatible(episode, 4, 3, action_flag="--model.action_dim")


# ---------------------------------------------------------------- DINO-WM


def test_dino_wm_round_trip(tmp_path):
    episodes = [make_episode(5, seed=1, name="episode_000"), make_episode(3, seed=2)]
    episodes[1].name = "episode_001"
    assert write_dino_wm(tmp_path / "maze", episodes) == tmp_path / "maze"
    assert sorted(p.name for p in (tmp_path / "maze" / "obses").iterdir()) == [
        "episode_000.pth",
        "episode_001.pth",
    ]
    read = read_dino_wm(tmp_path / "maze")
    assert len(read) == 2
    for got, want in zip(read, episodes, strict=True):
        assert_same(got, want)
    assert torch.load(tmp_path / "maze" / "states.pth", weights_only=True).shape == (2, 5, 4)
    assert len(read_dino_wm(tmp_path / "maze", max_episodes=1)) == 1


def test_dino_wm_trims_padding_past_seq_lengths(tmp_path):
    rng = np.random.default_rng(0)
    states = rng.normal(size=(2, 6, 4)).astype(np.float32)
    actions = rng.normal(size=(2, 6, 2)).astype(np.float32)
    states[0, 4:] = np.nan  # padding, whatever it holds, is never read
    actions[0, 4:] = 1e9
    frames = [
        rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8),  # longer than its seq_length
        rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8),
    ]
    save_dino_wm(tmp_path, frames, states, actions, torch.tensor([4, 6]))
    first, second = read_dino_wm(tmp_path)
    assert len(first) == 4 and len(second) == 6
    np.testing.assert_array_equal(first.states, states[0, :4])
    np.testing.assert_array_equal(first.actions, actions[0, :4])
    np.testing.assert_array_equal(first.frames, frames[0][:4])
    np.testing.assert_array_equal(second.frames, frames[1])


def test_dino_wm_orders_episode_files_numerically(tmp_path):
    n = 11
    frames = [np.full((2, 4, 4, 3), i, np.uint8) for i in range(n)]
    states = np.arange(n, dtype=np.float32)[:, None, None] * np.ones((1, 2, 4), np.float32)
    actions = np.zeros((n, 2, 2), np.float32)
    names = [f"episode_{i}.pth" for i in range(n)]  # not zero-padded: "10" sorts before "9"
    save_dino_wm(tmp_path, frames, states, actions, [2] * n, names=names)
    episodes = read_dino_wm(tmp_path)
    assert [e.name for e in episodes] == [f"episode_{i}" for i in range(n)]
    for i, episode in enumerate(episodes):
        assert episode.frames[0, 0, 0, 0] == i and episode.states[0, 0] == i


def test_dino_wm_resizes_224_frames_to_64(tmp_path):
    frames = np.zeros((3, 224, 224, 3), np.uint8)
    frames[:, :112] = 200  # top half bright
    save_dino_wm(tmp_path, [frames], np.zeros((1, 3, 4)), np.zeros((1, 3, 2)), [3])
    (episode,) = read_dino_wm(tmp_path, size=64)
    assert episode.frames.shape == (3, 64, 64, 3) and episode.frames.dtype == np.uint8
    assert (episode.frames[:, :30] == 200).all() and (episode.frames[:, 34:] == 0).all()


def test_dino_wm_resizes_84_frames_up_to_a_patch_14_encoder(tmp_path):
    frames = np.full((2, 84, 84, 3), 77, np.uint8)
    save_dino_wm(tmp_path, [frames], np.zeros((1, 2, 4)), np.zeros((1, 2, 2)), [2])
    (episode,) = read_dino_wm(tmp_path, size=224)  # 16 x 16 patches of 14, not DINOv2's 518
    assert episode.frames.shape == (2, 224, 224, 3) and 224 % 14 == 0
    assert (episode.frames == 77).all()


def remove(path):
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()


@pytest.mark.parametrize("name", ["states.pth", "actions.pth", "seq_lengths.pth", "obses"])
def test_dino_wm_missing_file_names_it_and_the_layout(tmp_path, name):
    remove(valid_dino_wm(tmp_path) / name)
    with pytest.raises(DataFormatError, match=f"Missing .*{name}. Expected a folder holding"):
        read_dino_wm(tmp_path)


def test_dino_wm_missing_folder(tmp_path):
    with pytest.raises(DataFormatError, match="Missing folder .*nowhere. Expected"):
        read_dino_wm(tmp_path / "nowhere")


def test_dino_wm_episode_count_mismatch(tmp_path):
    valid_dino_wm(tmp_path)
    torch.save(torch.zeros(3, 4, 2), tmp_path / "actions.pth")
    with pytest.raises(DataFormatError, match="2 episodes in states.pth, 3 in actions.pth"):
        read_dino_wm(tmp_path)


def test_dino_wm_missing_episode_file(tmp_path):
    (valid_dino_wm(tmp_path) / "obses" / "episode_001.pth").unlink()
    with pytest.raises(DataFormatError, match=r"lacks the frames of 1 of the 2 .*episode_001.pth"):
        read_dino_wm(tmp_path)


def test_dino_wm_extra_episode_file(tmp_path):
    valid_dino_wm(tmp_path)
    torch.save(torch.zeros(4, 4, 4, 3, dtype=torch.uint8), tmp_path / "obses" / "episode_2.pth")
    with pytest.raises(DataFormatError, match="holds 3 episode files but .* describe 2"):
        read_dino_wm(tmp_path)


def test_dino_wm_duplicate_episode_file(tmp_path):
    valid_dino_wm(tmp_path)
    torch.save(torch.zeros(4, 4, 4, 3, dtype=torch.uint8), tmp_path / "obses" / "episode_1.pth")
    with pytest.raises(DataFormatError, match="two files for episode 1"):
        read_dino_wm(tmp_path)


@pytest.mark.parametrize(("lengths", "bad"), [([3, 9], 9), ([0, 2], 0)])
def test_dino_wm_seq_length_outside_the_stored_steps(tmp_path, lengths, bad):
    valid_dino_wm(tmp_path)
    torch.save(torch.tensor(lengths), tmp_path / "seq_lengths.pth")
    with pytest.raises(DataFormatError, match=f"length of {bad}, but .* store 4 / 4 steps"):
        read_dino_wm(tmp_path)


def test_dino_wm_episode_file_shorter_than_its_seq_length(tmp_path):
    valid_dino_wm(tmp_path)
    torch.save(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), tmp_path / "obses" / "episode_000.pth")
    with pytest.raises(DataFormatError, match="holds 2 frames but seq_lengths.pth gives .* 3"):
        read_dino_wm(tmp_path)


@pytest.mark.parametrize(
    ("file", "value", "message"),
    [
        ("states.pth", torch.zeros(2, 4), r"states.pth holds torch.float32 \[2, 4\]; expected"),
        ("actions.pth", torch.zeros(2, 4, 2, dtype=torch.bool), "expected float"),
        ("seq_lengths.pth", torch.tensor([3.0, 2.0]), "expected integers"),
        ("seq_lengths.pth", torch.tensor([[3, 2]]), "expected integers"),
        ("obses/episode_000.pth", torch.zeros(4, 3, 4, 4, dtype=torch.uint8), "channels first"),
        ("obses/episode_000.pth", torch.zeros(4, 4, 4, 3), "expected uint8"),
        ("obses/episode_000.pth", torch.zeros(4, 4, 4, dtype=torch.uint8), "expected uint8"),
        ("states.pth", np.zeros((2, 4, 4)), "it holds numpy.*Re-save it as a tensor"),
        ("states.pth", {"states": torch.zeros(2, 4, 4)}, "holds a dict; expected a tensor"),
    ],
)
def test_dino_wm_wrong_contents(tmp_path, file, value, message):
    valid_dino_wm(tmp_path)
    torch.save(value, tmp_path / file)
    with pytest.raises(DataFormatError, match=message):
        read_dino_wm(tmp_path)


def test_dino_wm_file_that_is_not_torch(tmp_path):
    (valid_dino_wm(tmp_path) / "states.pth").write_bytes(b"not a torch file")
    with pytest.raises(DataFormatError, match="Cannot load .*states.pth with torch.load"):
        read_dino_wm(tmp_path)


def test_dino_wm_seq_lengths_as_a_list(tmp_path):
    valid_dino_wm(tmp_path)
    torch.save([3, 2], tmp_path / "seq_lengths.pth")
    assert [len(e) for e in read_dino_wm(tmp_path)] == [3, 2]


def test_dino_wm_bad_max_episodes(tmp_path):
    with pytest.raises(DataFormatError, match="max_episodes must be a positive integer"):
        read_dino_wm(valid_dino_wm(tmp_path), max_episodes=0)


def test_write_dino_wm_refuses_episodes_without_frames_and_old_files(tmp_path):
    with pytest.raises(DataFormatError, match="has no frames; the DINO-WM layout stores images"):
        write_dino_wm(tmp_path / "a", [make_episode(2, frames=False)])
    with pytest.raises(DataFormatError, match=r"states have different sizes \[3, 4\]"):
        write_dino_wm(tmp_path / "b", [make_episode(2), make_episode(2, state_dim=3)])
    write_dino_wm(tmp_path / "c", [make_episode(2)])
    with pytest.raises(DataFormatError, match="already holds episode files"):
        write_dino_wm(tmp_path / "c", [make_episode(2)])


# ---------------------------------------------------------------- Minari


def minari_episodes(n=2):
    return [make_episode(4 + i, seed=i, frames=False, name=f"episode_{i}") for i in range(n)]


def test_minari_round_trip_from_the_folder_the_data_folder_or_the_file(tmp_path):
    episodes = minari_episodes()
    folder = tmp_path / "pointmaze-umaze-v2"
    file = write_minari_fixture(folder, episodes)
    assert file == folder / "data" / "main_data.hdf5"
    assert json.loads((folder / "data" / "metadata.json").read_text())["data_format"] == "hdf5"
    for path in (folder, folder / "data", file):
        read = read_minari(path)
        assert len(read) == 2
        for got, want in zip(read, episodes, strict=True):
            assert_same(got, want)  # no images: frames is None


def test_minari_drops_the_last_of_the_t_plus_1_observations(tmp_path):
    steps = 5
    observations = np.arange((steps + 1) * 4, dtype=np.float64).reshape(steps + 1, 4)
    with h5py.File(tmp_path / "main_data.hdf5", "w") as file:
        file["episode_0/observations/observation"] = observations
        file["episode_0/observations/achieved_goal"] = observations[:, :2]
        file["episode_0/observations/desired_goal"] = np.ones((steps + 1, 2))
        file["episode_0/actions"] = np.full((steps, 2), 0.5, np.float32)
        file["episode_0/rewards"] = np.zeros(steps)
        file["episode_0/terminations"] = np.zeros(steps, bool)
        file["episode_0/truncations"] = np.zeros(steps, bool)
    (episode,) = read_minari(tmp_path)
    assert episode.frames is None and len(episode) == steps
    np.testing.assert_array_equal(episode.states, observations[:steps])  # o_0 .. o_{T-1}
    np.testing.assert_array_equal(episode.actions, np.full((steps, 2), 0.5))


def test_minari_fixture_writes_the_final_observation(tmp_path):
    episode = make_episode(3, frames=False, name="episode_0")
    final = np.full(4, 42.0)
    file = write_minari_fixture(tmp_path / "d.hdf5", [episode], final_states=[final])
    with h5py.File(file) as stored:
        observations = stored["episode_0/observations/observation"][()]
        assert observations.shape == (4, 4) and stored["episode_0/actions"].shape == (3, 2)
        np.testing.assert_array_equal(observations[-1], final)
        assert stored["episode_0/truncations"][-1]
    assert_same(read_minari(file)[0], episode)


def test_minari_dict_observations_with_a_chosen_key(tmp_path):
    episodes = minari_episodes()
    write_minari_fixture(tmp_path / "d", episodes)
    read = read_minari(tmp_path / "d", observation_key="achieved_goal")
    assert read[0].states.shape == (4, 2)
    np.testing.assert_array_equal(read[0].states, episodes[0].states[:, :2])


def test_minari_box_observations(tmp_path):
    episodes = minari_episodes()
    write_minari_fixture(tmp_path / "d", episodes, observation_key=None)
    for got, want in zip(read_minari(tmp_path / "d"), episodes, strict=True):
        assert_same(got, want)


def test_minari_orders_episodes_numerically(tmp_path):
    episodes = [make_episode(2, seed=i, frames=False, name=f"episode_{i}") for i in range(11)]
    write_minari_fixture(tmp_path / "d", episodes)
    read = read_minari(tmp_path / "d")
    assert [e.name for e in read] == [f"episode_{i}" for i in range(11)]
    np.testing.assert_array_equal(read[10].states, episodes[10].states)


def test_minari_discrete_actions_become_a_column(tmp_path):
    with h5py.File(tmp_path / "main_data.hdf5", "w") as file:
        file["episode_0/observations"] = np.zeros((4, 3))
        file["episode_0/actions"] = np.array([0, 2, 1])
    (episode,) = read_minari(tmp_path)
    np.testing.assert_array_equal(episode.actions, [[0], [2], [1]])


def test_minari_missing_key_lists_the_keys_present(tmp_path):
    write_minari_fixture(tmp_path / "d", minari_episodes())
    present = "achieved_goal, desired_goal, observation"
    with pytest.raises(DataFormatError, match=f"Observation key 'qpos' not found .*: {present}"):
        read_minari(tmp_path / "d", observation_key="qpos")


def test_minari_key_that_is_a_group_lists_its_arrays(tmp_path):
    with h5py.File(tmp_path / "main_data.hdf5", "w") as file:
        file["episode_0/observations/robot/qpos"] = np.zeros((3, 2))
        file["episode_0/actions"] = np.zeros((2, 1))
    with pytest.raises(DataFormatError, match="a group, not an array; choose one of: robot/qpos"):
        read_minari(tmp_path, observation_key="robot")
    assert read_minari(tmp_path, observation_key="robot/qpos")[0].states.shape == (2, 2)


def write_episode_0(path, **datasets):
    with h5py.File(path, "w") as file:
        for name, value in datasets.items():
            file[f"episode_0/{name}"] = value


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        (
            {"observations": np.zeros((3, 4)), "actions": np.zeros((3, 2))},
            r"has 3 rows and .*actions 3; Minari stores T \+ 1 observations",
        ),
        ({"observations": np.zeros((3, 4))}, "needs 'observations' and 'actions'"),
        (
            {"observations": np.zeros((3, 8, 8, 3), np.uint8), "actions": np.zeros((2, 2))},
            r"expected a vector per step \[T, D\]",
        ),
        (
            {"observations": np.zeros((3, 4)), "actions/a": np.zeros((2, 2))},
            "actions is a group",
        ),
        (
            {"observations": np.array([b"a", b"b", b"c"]), "actions": np.zeros((2, 2))},
            r"expected numbers \[T, D\]",
        ),
    ],
)
def test_minari_bad_episodes(tmp_path, datasets, message):
    write_episode_0(tmp_path / "main_data.hdf5", **datasets)
    with pytest.raises(DataFormatError, match=message):
        read_minari(tmp_path)


def test_minari_bad_locations(tmp_path):
    with pytest.raises(DataFormatError, match="Missing .*nowhere. Expected a Minari dataset"):
        read_minari(tmp_path / "nowhere")
    with pytest.raises(DataFormatError, match="No main_data.hdf5 in .* or .*data"):
        read_minari(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "metadata.json").write_text(json.dumps({"data_format": "arrow"}))
    with pytest.raises(DataFormatError, match="stored as 'arrow', not hdf5"):
        read_minari(tmp_path)
    (tmp_path / "junk.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(DataFormatError, match="Cannot open .*junk.hdf5 as HDF5"):
        read_minari(tmp_path / "junk.hdf5")
    with h5py.File(tmp_path / "empty.hdf5", "w") as file:
        file["data/demo_0/actions"] = np.zeros((2, 2))  # a robomimic file, say
    with pytest.raises(DataFormatError, match=r"no episode_<id> groups \(it holds: data\)"):
        read_minari(tmp_path / "empty.hdf5")


def test_minari_fixture_needs_one_final_state_per_episode(tmp_path):
    with pytest.raises(DataFormatError, match="1 final states for 2 episodes"):
        write_minari_fixture(tmp_path / "d", minari_episodes(), final_states=[np.zeros(4)])
