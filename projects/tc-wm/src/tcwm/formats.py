"""Real-data formats: DINO-WM's PointMaze folders and Minari HDF5 datasets, read as Episodes.

DINO-WM (``datasets/point_maze_dset.py`` in gaoyuezhou/dino_wm): a folder holding
``states.pth`` float [N, Tmax, S] (PointMaze: x, y, vx, vy), ``actions.pth`` float [N, Tmax, A],
``seq_lengths.pth`` [N] and ``obses/episode_<i>.pth``, one uint8 tensor [T, H, W, 3] per
episode (DINO-WM writes ``episode_{i:03d}``). Rows past an episode's seq_length are padding;
DINO-WM reads frames ``[0, seq_length)``, so an episode file may hold more frames, never fewer.

Minari (``minari/dataset/_storages/hdf5_storage.py`` in Farama-Foundation/Minari):
``<dataset_id>/data/main_data.hdf5`` with groups ``episode_<id>`` holding ``observations``
(a dataset for Box spaces, a group of datasets for Dict spaces such as PointMaze's
``observation`` / ``achieved_goal`` / ``desired_goal``), ``actions``, ``rewards``,
``terminations`` and ``truncations``. Observations have T + 1 rows (the reset observation and
one per step) and actions T; the last observation is dropped so that ``states[t]`` is the
state the action ``actions[t]`` was taken in. Minari's PointMaze datasets have no images:
their episodes have ``frames=None`` and the caller must render them.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from papers_worldmodels.errors import DataFormatError as _SharedDataFormatError

DINO_WM_LAYOUT = (
    "a folder holding states.pth (float [N, Tmax, S]), actions.pth (float [N, Tmax, A]), "
    "seq_lengths.pth (integers [N]) and obses/episode_<i>.pth for i = 0..N-1 (one uint8 tensor "
    "[T, H, W, 3] per episode, T >= its seq_length; DINO-WM names them episode_000.pth, ...)"
)
MINARI_FILE = "main_data.hdf5"
MINARI_LAYOUT = (
    f"a Minari dataset folder <dataset_id>/ (or its data/ folder, or the {MINARI_FILE} file) "
    f"whose data/{MINARI_FILE} holds groups episode_<id> with 'observations' (T + 1 rows; a "
    "group of datasets for dict observation spaces) and 'actions' (T rows)"
)
# Frames resized per chunk, so long episodes at full resolution do not need gigabytes of floats.
RESIZE_CHUNK = 64

_EPISODE_FILE_RE = re.compile(r"episode_(\d+)\.pth")
_MINARI_EPISODE_RE = re.compile(r"episode_(\d+)")


# One error type with the shared robomimic reader (papers_worldmodels), user-facing: the CLI
# prints its message as one paragraph and exits 2.
DataFormatError = _SharedDataFormatError


@dataclass(eq=False)
class Episode:
    """One episode, step-aligned: ``frames[t]`` shows ``states[t]``, in which ``actions[t]``
    was taken. ``frames`` is None for datasets without images (the caller renders them)."""

    frames: np.ndarray | None  # uint8 [T, H, W, 3]
    states: np.ndarray  # float32 [T, S]
    actions: np.ndarray  # float32 [T, A]
    name: str

    def __post_init__(self) -> None:
        for field, array in (("states", self.states), ("actions", self.actions)):
            if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 2:
                raise DataFormatError(
                    f"Episode '{self.name}': {field} is {_describe(array)}; expected a float32 "
                    f"numpy array [T, {field[0].upper()}] (convert with .astype(np.float32))."
                )
            if not np.isfinite(array).all():
                raise DataFormatError(
                    f"Episode '{self.name}': {field} contain NaN or infinite values; clean or "
                    "drop this episode."
                )
        steps = len(self.states)
        if steps == 0:
            raise DataFormatError(f"Episode '{self.name}' has no steps (states [0, S]).")
        if len(self.actions) != steps:
            raise DataFormatError(
                f"Episode '{self.name}': states have {steps} steps but actions "
                f"{len(self.actions)}; they must have one row per step."
            )
        if self.frames is None:
            return
        _check_frames(self.frames, f"Episode '{self.name}': frames")
        if len(self.frames) != steps:
            raise DataFormatError(
                f"Episode '{self.name}': {len(self.frames)} frames but {steps} states; they must "
                "have one row per step."
            )

    def __len__(self) -> int:
        return len(self.states)


def _describe(array) -> str:
    if isinstance(array, np.ndarray | torch.Tensor):
        return f"{array.dtype} {list(array.shape)}"
    return type(array).__name__


def _check_frames(frames, where: str) -> None:
    if not isinstance(frames, np.ndarray):
        raise DataFormatError(f"{where} are {_describe(frames)}; expected a uint8 numpy array.")
    if frames.ndim == 4 and frames.shape[1] == 3 and frames.shape[-1] != 3:
        raise DataFormatError(
            f"{where} are {list(frames.shape)}, channels first; expected [T, H, W, 3]. "
            "Transpose them with frames.transpose(0, 2, 3, 1)."
        )
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise DataFormatError(
            f"{where} are {_describe(frames)}; expected uint8 [T, H, W, 3] RGB (0..255)."
        )


# ---------------------------------------------------------------- shared checks


def resize_frames(frames: np.ndarray, size: int) -> np.ndarray:
    """uint8 frames [T, H, W, 3] resized to [T, size, size, 3] (bilinear, antialiased when
    shrinking); frames already that size are returned as they are."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise DataFormatError(f"size must be a positive integer, got {size!r}.")
    _check_frames(frames, "the frames to resize")
    if frames.shape[1:3] == (size, size):
        return frames
    out = []
    for start in range(0, len(frames), RESIZE_CHUNK):
        chunk = torch.from_numpy(frames[start : start + RESIZE_CHUNK]).permute(0, 3, 1, 2)
        chunk = F.interpolate(chunk.float(), (size, size), mode="bilinear", antialias=True)
        out.append(chunk.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))
    return torch.cat(out).numpy()


def check_episode_compatible(
    episode: Episode,
    state_dim: int,
    action_dim: int,
    *,
    state_flag: str = "--data.state_dim",
    action_flag: str = "--data.action_dim",
) -> None:
    """Raise a DataFormatError when the episode's state or action size differs from the
    model's configured ``state_dim`` / ``action_dim``; the message names the flag to change."""
    for what, have, want, flag in (
        ("state", episode.states.shape[1], state_dim, state_flag),
        ("action", episode.actions.shape[1], action_dim, action_flag),
    ):
        if have != want:
            raise DataFormatError(
                f"Episode '{episode.name}' has {what}s of size {have} but the model is "
                f"configured for {what}_dim={want}; set {flag}={have}."
            )


# ---------------------------------------------------------------- DINO-WM folders


def read_dino_wm(
    root: str | Path, *, size: int | None = None, max_episodes: int | None = None
) -> list[Episode]:
    """The episodes of a DINO-WM PointMaze folder, in numeric order of their files
    (``episode_10`` after ``episode_9``, padded or not), trimmed to their seq_lengths.

    ``size`` resizes frames to size x size as each episode is read (all of DINO-WM's 224 x 224
    frames at full size need tens of gigabytes); ``max_episodes`` keeps the first ones only,
    like DINO-WM's ``n_rollout``."""
    root = Path(root)
    if not root.is_dir():
        raise DataFormatError(f"Missing folder {root}. Expected {DINO_WM_LAYOUT}.")
    for name in ("states.pth", "actions.pth", "seq_lengths.pth", "obses"):
        if not (root / name).exists():
            raise DataFormatError(f"Missing {root / name}. Expected {DINO_WM_LAYOUT}.")
    states = _load_pth(root / "states.pth")
    actions = _load_pth(root / "actions.pth")
    lengths = _load_pth(root / "seq_lengths.pth")
    for array, path in ((states, root / "states.pth"), (actions, root / "actions.pth")):
        if array.ndim != 3 or not (array.dtype.is_floating_point or _is_integer(array)):
            raise DataFormatError(
                f"{path} holds {_describe(array)}; expected float [N, Tmax, D] (episodes, "
                f"steps, values). Expected {DINO_WM_LAYOUT}."
            )
    if lengths.ndim != 1 or not _is_integer(lengths):
        raise DataFormatError(
            f"{root / 'seq_lengths.pth'} holds {_describe(lengths)}; expected integers [N], "
            "one length per episode."
        )
    n = len(lengths)
    if len(states) != n or len(actions) != n:
        raise DataFormatError(
            f"{root} holds {len(states)} episodes in states.pth, {len(actions)} in actions.pth "
            f"and {n} in seq_lengths.pth; all three must have one entry per episode."
        )
    files = _episode_files(root / "obses", n)
    stored = min(states.shape[1], actions.shape[1])
    for i, length in enumerate(lengths.tolist()):
        if not 1 <= length <= stored:
            raise DataFormatError(
                f"seq_lengths.pth gives episode {i} a length of {length}, but states.pth / "
                f"actions.pth store {states.shape[1]} / {actions.shape[1]} steps per episode; "
                f"each length must be between 1 and {stored}."
            )
    if max_episodes is not None and (isinstance(max_episodes, bool) or max_episodes < 1):
        raise DataFormatError(f"max_episodes must be a positive integer, got {max_episodes!r}.")
    count = n if max_episodes is None else min(n, max_episodes)
    states, actions = states.float().numpy(), actions.float().numpy()
    episodes = []
    for i in range(count):
        length = int(lengths[i])
        frames = _read_episode_frames(files[i], length)
        if size is not None:
            frames = resize_frames(frames, size)
        episodes.append(
            Episode(
                frames,
                states[i, :length].copy(),
                actions[i, :length].copy(),
                files[i].stem,
            )
        )
    return episodes


def _is_integer(tensor: torch.Tensor) -> bool:
    return (
        not tensor.dtype.is_floating_point
        and not tensor.dtype.is_complex
        and (tensor.dtype != torch.bool)
    )


def _load_pth(path: Path) -> torch.Tensor:
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        detail = f" (it holds {found.group(1)})" if found else ""
        raise DataFormatError(
            f"Cannot load {path} with torch.load(weights_only=True){detail}: it is not a file "
            "written by torch.save, or it holds objects other than tensors, lists and numbers "
            "(e.g. numpy arrays). Re-save it as a tensor: torch.save(torch.as_tensor(x), path)."
        ) from error
    if isinstance(value, list | tuple):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise DataFormatError(
                f"{path} holds a {type(value).__name__} that is not a rectangular array of "
                "numbers; save a tensor."
            ) from error
    if not isinstance(value, torch.Tensor):
        raise DataFormatError(f"{path} holds a {type(value).__name__}; expected a tensor.")
    return value


def _episode_files(obses: Path, n: int) -> list[Path]:
    """``obses/episode_<i>.pth`` for i = 0..n-1, found whether zero-padded or not."""
    if not obses.is_dir():
        raise DataFormatError(f"{obses} is not a folder. Expected {DINO_WM_LAYOUT}.")
    by_index: dict[int, Path] = {}
    for path in obses.iterdir():
        match = _EPISODE_FILE_RE.fullmatch(path.name)
        if not match:
            continue
        index = int(match.group(1))
        if index in by_index:
            raise DataFormatError(
                f"{obses} holds two files for episode {index}: {by_index[index].name} and "
                f"{path.name}; keep one."
            )
        by_index[index] = path
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        listed = ", ".join(f"episode_{i:03d}.pth" for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataFormatError(
            f"{obses} lacks the frames of {len(missing)} of the {n} episodes in states.pth: "
            f"{listed}{more} (found {len(by_index)} episode files). Expected {DINO_WM_LAYOUT}."
        )
    extra = sorted(i for i in by_index if i >= n)
    if extra:
        raise DataFormatError(
            f"{obses} holds {len(by_index)} episode files but states.pth, actions.pth and "
            f"seq_lengths.pth describe {n} episodes (e.g. {by_index[extra[0]].name} has no "
            "states); the episode files and the arrays must match."
        )
    return [by_index[i] for i in range(n)]


def _read_episode_frames(path: Path, length: int) -> np.ndarray:
    frames = _load_pth(path)
    if frames.ndim == 4 and frames.shape[1] == 3 and frames.shape[-1] != 3:
        raise DataFormatError(
            f"{path} holds {list(frames.shape)}, channels first; expected [T, H, W, 3]. "
            "Re-save it with frames.permute(0, 2, 3, 1)."
        )
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
        raise DataFormatError(
            f"{path} holds {_describe(frames)}; expected uint8 [T, H, W, 3] RGB frames."
        )
    if len(frames) < length:
        raise DataFormatError(
            f"{path} holds {len(frames)} frames but seq_lengths.pth gives this episode "
            f"{length} steps; an episode file needs at least one frame per step."
        )
    # Frames past seq_length are padding, as in the states; copy so the padding is freed.
    return frames[:length].numpy().copy() if len(frames) > length else frames.numpy()


def write_dino_wm(root: str | Path, episodes: Sequence[Episode]) -> Path:
    """Write ``episodes`` (all with frames) as a DINO-WM folder that :func:`read_dino_wm`
    reads: states and actions zero-padded to the longest episode, files named by position
    (``obses/episode_000.pth``, ...; the episodes' names are not stored)."""
    root = Path(root)
    if not episodes:
        raise DataFormatError("No episodes to write.")
    for episode in episodes:
        if episode.frames is None:
            raise DataFormatError(
                f"Episode '{episode.name}' has no frames; the DINO-WM layout stores images. "
                "Render them first."
            )
    for field in ("states", "actions"):
        widths = sorted({getattr(e, field).shape[1] for e in episodes})
        if len(widths) > 1:
            raise DataFormatError(
                f"The episodes' {field} have different sizes {widths}; one folder holds one size."
            )
    obses = root / "obses"
    if obses.is_dir() and any(_EPISODE_FILE_RE.fullmatch(p.name) for p in obses.iterdir()):
        raise DataFormatError(
            f"{obses} already holds episode files; write into an empty folder so old episodes "
            "do not mix with the new ones."
        )
    obses.mkdir(parents=True, exist_ok=True)
    longest = max(len(e) for e in episodes)
    states = np.zeros((len(episodes), longest, episodes[0].states.shape[1]), np.float32)
    actions = np.zeros((len(episodes), longest, episodes[0].actions.shape[1]), np.float32)
    for i, episode in enumerate(episodes):
        states[i, : len(episode)] = episode.states
        actions[i, : len(episode)] = episode.actions
        # A copy: torch.save writes a view's whole storage.
        torch.save(torch.from_numpy(episode.frames.copy()), obses / f"episode_{i:03d}.pth")
    torch.save(torch.from_numpy(states), root / "states.pth")
    torch.save(torch.from_numpy(actions), root / "actions.pth")
    torch.save(torch.tensor([len(e) for e in episodes]), root / "seq_lengths.pth")
    return root


# ---------------------------------------------------------------- Minari HDF5


def read_minari(path: str | Path, *, observation_key: str = "observation") -> list[Episode]:
    """The episodes of a Minari HDF5 dataset (the dataset folder, its data/ folder or the
    file), in numeric order; ``frames`` is None (Minari's PointMaze stores no images: render
    them). ``observation_key`` picks the state from dict observations (a path such as
    ``a/b`` for nested dicts); Box observations are used as they are."""
    file_path = _minari_file(Path(path))
    try:
        file = h5py.File(file_path, "r")
    except OSError as error:
        raise DataFormatError(f"Cannot open {file_path} as HDF5 ({error}).") from error
    with file:
        names = sorted(
            (k for k in file if _MINARI_EPISODE_RE.fullmatch(k)),
            key=lambda k: int(_MINARI_EPISODE_RE.fullmatch(k).group(1)),
        )
        if not names:
            found = ", ".join(sorted(file)[:10]) or "nothing"
            raise DataFormatError(
                f"{file_path} has no episode_<id> groups (it holds: {found}). Expected "
                f"{MINARI_LAYOUT}."
            )
        return [_read_minari_episode(file[n], file_path, n, observation_key) for n in names]


def _minari_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataFormatError(f"Missing {path}. Expected {MINARI_LAYOUT}.")
    for folder in (path, path / "data"):
        if (folder / MINARI_FILE).is_file():
            return folder / MINARI_FILE
        metadata = folder / "metadata.json"
        if metadata.is_file():
            try:
                data_format = json.loads(metadata.read_text()).get("data_format", "hdf5")
            except (json.JSONDecodeError, AttributeError):
                data_format = "hdf5"
            if data_format != "hdf5":
                raise DataFormatError(
                    f"{metadata} says this Minari dataset is stored as '{data_format}', not "
                    f"hdf5; this reader takes {MINARI_FILE}. Convert the dataset to hdf5 with "
                    "Minari (e.g. minari.create_dataset_from_buffers(..., data_format='hdf5'))."
                )
    raise DataFormatError(
        f"No {MINARI_FILE} in {path} or {path / 'data'}. Expected {MINARI_LAYOUT}."
    )


def _read_minari_episode(group, file_path: Path, name: str, key: str) -> Episode:
    where = f"{file_path}:{name}"
    if not isinstance(group, h5py.Group) or "observations" not in group or "actions" not in group:
        raise DataFormatError(f"{where} needs 'observations' and 'actions'.")
    observations = group["observations"]
    if isinstance(observations, h5py.Group):
        if key not in observations:
            present = ", ".join(_dataset_paths(observations)) or "none"
            raise DataFormatError(
                f"Observation key '{key}' not found in {where}/observations. Keys present: "
                f"{present}. Choose one of them as the observation key."
            )
        observations = observations[key]
        if isinstance(observations, h5py.Group):
            present = ", ".join(f"{key}/{p}" for p in _dataset_paths(observations))
            raise DataFormatError(
                f"{where}/observations/{key} is a group, not an array; choose one of: {present}."
            )
        obs_where = f"{where}/observations/{key}"
    else:
        obs_where = f"{where}/observations"
    states = _minari_array(observations, obs_where)
    actions_ref = group["actions"]
    if isinstance(actions_ref, h5py.Group):
        raise DataFormatError(
            f"{where}/actions is a group (a dict or tuple action space); this reader takes Box "
            "or Discrete actions."
        )
    actions = _minari_array(actions_ref, f"{where}/actions")
    if len(states) != len(actions) + 1:
        raise DataFormatError(
            f"{obs_where} has {len(states)} rows and {where}/actions {len(actions)}; Minari "
            "stores T + 1 observations (reset and one per step) for T actions."
        )
    # Drop the final observation: states[t] is the state actions[t] was taken in.
    return Episode(None, states[:-1], actions, name)


def _minari_array(dataset: h5py.Dataset, where: str) -> np.ndarray:
    array = dataset[()]
    if not np.issubdtype(array.dtype, np.number) and array.dtype != np.bool_:
        raise DataFormatError(
            f"{where} holds {array.dtype} {list(array.shape)}; expected numbers [T, D]."
        )
    if array.ndim == 1:  # Discrete actions or a scalar observation: one column
        array = array[:, None]
    if array.ndim != 2:
        raise DataFormatError(
            f"{where} holds {array.dtype} {list(array.shape)}; expected a vector per step "
            "[T, D] (image observations are not read here)."
        )
    return array.astype(np.float32)


def _dataset_paths(group: h5py.Group) -> list[str]:
    """The paths of all datasets under ``group`` (nested dicts give ``a/b``)."""
    paths: list[str] = []

    def visit(name: str, item) -> None:
        if isinstance(item, h5py.Dataset):
            paths.append(name)

    group.visititems(visit)
    return sorted(paths)


def write_minari_fixture(
    path: str | Path,
    episodes: Sequence[Episode],
    *,
    observation_key: str | None = "observation",
    final_states: Sequence[np.ndarray] | None = None,
) -> Path:
    """Write ``episodes`` in Minari's HDF5 layout (for tests): ``path`` is a dataset folder
    (``<path>/data/main_data.hdf5`` and ``metadata.json`` are written) or an ``.hdf5`` file.

    With ``observation_key`` the observations are a dict group like PointMaze's (the state
    under that key, plus ``achieved_goal`` = the first two state values and ``desired_goal``
    = zeros, when it is ``observation``); with None a Box dataset. Each episode gets one more
    observation than actions: ``final_states[i]`` (default: its last state repeated). Frames
    are not written (Minari's PointMaze has none). Returns the HDF5 file's path."""
    path = Path(path)
    if final_states is not None and len(final_states) != len(episodes):
        raise DataFormatError(
            f"{len(final_states)} final states for {len(episodes)} episodes; give one each."
        )
    if path.suffix in (".hdf5", ".h5"):
        file_path = path
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        (path / "data").mkdir(parents=True, exist_ok=True)
        file_path = path / "data" / MINARI_FILE
        metadata = {
            "dataset_id": path.name,
            "data_format": "hdf5",
            "total_episodes": len(episodes),
            "total_steps": sum(len(e) for e in episodes),
        }
        (path / "data" / "metadata.json").write_text(json.dumps(metadata))
    with h5py.File(file_path, "w", track_order=True) as file:
        for i, episode in enumerate(episodes):
            final = episode.states[-1] if final_states is None else final_states[i]
            observations = np.concatenate([episode.states, np.asarray(final)[None]]).astype(
                np.float64
            )
            group = file.create_group(f"episode_{i}")
            group.attrs["id"] = i
            group.attrs["total_steps"] = len(episode)
            if observation_key is None:
                group.create_dataset("observations", data=observations)
            else:
                group.create_dataset(f"observations/{observation_key}", data=observations)
                if observation_key == "observation" and observations.shape[1] >= 2:
                    group.create_dataset("observations/achieved_goal", data=observations[:, :2])
                    group.create_dataset(
                        "observations/desired_goal", data=np.zeros((len(observations), 2))
                    )
            group.create_dataset("actions", data=episode.actions)
            group.create_dataset("rewards", data=np.zeros(len(episode)))
            group.create_dataset("terminations", data=np.zeros(len(episode), bool))
            truncations = np.zeros(len(episode), bool)
            truncations[-1] = True
            group.create_dataset("truncations", data=truncations)
    return file_path
