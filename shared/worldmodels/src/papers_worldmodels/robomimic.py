"""robomimic HDF5: demos of camera frames, low-dimensional states and actions, read and written.

robomimic's layout: ``data/demo_<i>/actions`` float [T, A]; ``data/demo_<i>/obs/<key>``, one
array per observation: camera images as ``<camera>_image`` uint8 [T, H, W, 3] (channels last),
proprioception such as ``robot0_eef_pos`` [T, 3], ``robot0_eef_quat`` [T, 4],
``robot0_gripper_qpos`` [T, 2] or ``robot0_joint_pos`` [T, 7]; ``mask/<filter_key>`` the demo
names of a split (``train``, ``valid``, ``20_percent``, ...) as byte strings; and the JSON
attribute ``data.attrs["env_args"]``.

The caller chooses the image key and the state keys; a demo's state is its state keys' arrays
side by side, in the order given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from papers_worldmodels.errors import DataFormatError

IMAGE_SUFFIX = "_image"  # robomimic stores camera <name> as obs/<name>_image
LAYOUT = "data/demo_<i>/actions [T, A] and data/demo_<i>/obs/<camera>_image uint8 [T, H, W, 3]"

_DEMO_RE = re.compile(r"demo_(\d+)")


@dataclass
class Demo:
    """One robomimic demo, step-aligned: row t of every array is step t."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    states: np.ndarray  # float32 [T, S]: the state keys' arrays side by side; S = 0 without any
    actions: np.ndarray  # float32 [T, A]
    name: str  # demo_<i>


def camera_key(camera: str) -> str:
    """The obs key of a camera's images: ``agentview`` -> ``agentview_image``."""
    return f"{camera}{IMAGE_SUFFIX}"


# ---------------------------------------------------------------- reading


def read_robomimic(
    path: str | Path,
    image_key: str,
    *,
    state_keys: Sequence[str] = (),
    filter_key: str | None = None,
    optional_states: bool = False,
) -> list[Demo]:
    """The demos of a robomimic HDF5 file (those named by ``mask/<filter_key>`` when given), in
    numeric order (demo_10 after demo_9).

    Frames come from ``obs/<image_key>``, states from ``obs/<key>`` for each of ``state_keys``,
    concatenated in that order. A demo that lacks a state key is an error, except with
    ``optional_states`` for a demo that has none of them: its states are then [T, 0].
    """
    path = Path(path)
    if isinstance(state_keys, str):  # a lone key would be read letter by letter
        state_keys = [state_keys]
    with _open_hdf5(path) as file:
        data = _data_group(file, path)
        names = sorted(
            (k for k in data if _DEMO_RE.fullmatch(k)),
            key=lambda k: int(_DEMO_RE.fullmatch(k).group(1)),
        )
        if not names:
            raise DataFormatError(
                f"{path} has no data/demo_<i> groups (it holds: {_listed(data)}); a robomimic "
                f"file holds {LAYOUT}."
            )
        if filter_key is not None:
            chosen = set(_filter_names(file, path, filter_key))
            missing = sorted(chosen - set(names))
            if missing:
                raise DataFormatError(
                    f"mask/{filter_key} in {path} names demos that are not in data/: "
                    f"{', '.join(missing)}. Regenerate the filter keys for this file."
                )
            names = [n for n in names if n in chosen]
        return [
            _read_demo(data[name], path, name, image_key, list(state_keys), optional_states)
            for name in names
        ]


def read_robomimic_env_args(path: str | Path) -> dict:
    """The ``env_args`` JSON attribute of the ``data`` group; empty when absent."""
    path = Path(path)
    with _open_hdf5(path) as file:
        raw = _data_group(file, path).attrs.get("env_args")
    if raw is None:
        return {}
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise DataFormatError(f"data.attrs['env_args'] in {path} is not JSON: {error}.") from error


def _open_hdf5(path: Path) -> h5py.File:
    if not path.is_file():
        raise DataFormatError(f"Missing robomimic file {path}; pass the path of the .hdf5 file.")
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise DataFormatError(f"Cannot open {path} as HDF5 ({error}).") from error


def _data_group(file: h5py.File, path: Path) -> h5py.Group:
    if "data" not in file:
        raise DataFormatError(f"{path} has no 'data' group; a robomimic file holds {LAYOUT}.")
    return file["data"]


def _filter_names(file: h5py.File, path: Path, filter_key: str) -> list[str]:
    available = sorted(file["mask"]) if "mask" in file else []
    if filter_key not in available:
        listed = ", ".join(available) if available else "none (the file has no mask group)"
        raise DataFormatError(
            f"Filter key '{filter_key}' not found in {path}. Available filter keys: {listed}."
        )
    # robomimic stores the demo names as byte strings (b"demo_0").
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in file["mask"][filter_key]]


def _read_demo(
    demo: h5py.Group,
    path: Path,
    name: str,
    image_key: str,
    state_keys: list[str],
    optional_states: bool,
) -> Demo:
    where = f"{path}:data/{name}"
    obs = demo.get("obs")
    if obs is None or "actions" not in demo:
        raise DataFormatError(
            f"{where} needs 'actions' and an 'obs' group (it holds: {_listed(demo)})."
        )
    if image_key not in obs:
        raise DataFormatError(_missing_image_message(obs, where, image_key))
    images = obs[image_key][()]
    if images.ndim == 4 and images.shape[1] == 3 and images.shape[-1] != 3:
        raise DataFormatError(
            f"{where}/obs/{image_key} is {list(images.shape)}, channels first; expected "
            "[T, H, W, 3]. Transpose it with images.transpose(0, 2, 3, 1)."
        )
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise DataFormatError(
            f"{where}/obs/{image_key} holds {images.dtype} {list(images.shape)}; expected uint8 "
            "[T, H, W, 3] RGB."
        )
    actions = _as_2d_float(demo["actions"][()], f"{where}/actions")
    _check_steps(actions, f"{where}/actions", image_key, len(images))
    present = [key for key in state_keys if key in obs]
    if optional_states and not present:
        return Demo(images, np.zeros((len(images), 0), np.float32), actions, name)
    missing = [key for key in state_keys if key not in obs]
    if missing:
        raise DataFormatError(
            f"State key{'s' if len(missing) > 1 else ''} {', '.join(missing)} not found in "
            f"{where}/obs. Obs keys present: {_listed(obs)}. Choose the state keys from these."
        )
    states = []
    for key in state_keys:
        state = _as_2d_float(obs[key][()], f"{where}/obs/{key}")
        _check_steps(state, f"{where}/obs/{key}", image_key, len(images))
        states.append(state)
    states = np.concatenate(states, axis=1) if states else np.zeros((len(images), 0), np.float32)
    return Demo(images, states, actions, name)


def _missing_image_message(obs: h5py.Group, where: str, image_key: str) -> str:
    images = sorted(k for k in obs if k.endswith(IMAGE_SUFFIX))
    if image_key.endswith(IMAGE_SUFFIX):
        camera = image_key[: -len(IMAGE_SUFFIX)]
        what = f"Camera '{camera}' not found in {where}/obs: there is no {image_key}."
    else:
        what = f"Image key '{image_key}' not found in {where}/obs."
    return (
        f"{what} Image keys found: {', '.join(images) if images else 'none'}. Obs keys present: "
        f"{_listed(obs)}. robomimic stores camera <name> as obs/<name>{IMAGE_SUFFIX} (a camera "
        f"name is given without the '{IMAGE_SUFFIX}' suffix)."
    )


def _listed(group: h5py.Group) -> str:
    keys = sorted(group)
    return ", ".join(keys) if keys else "nothing"


def _as_2d_float(array: np.ndarray, source: str) -> np.ndarray:
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise DataFormatError(
            f"{source} holds {array.dtype} {list(array.shape)}; expected numbers of shape "
            "[T, D], one row per step."
        )
    return array.astype(np.float32)


def _check_steps(array: np.ndarray, source: str, image_key: str, n_frames: int) -> None:
    if len(array) != n_frames:
        raise DataFormatError(
            f"{source} has {len(array)} steps but obs/{image_key} has {n_frames} frames; they "
            "must have one row per frame."
        )


# ---------------------------------------------------------------- writing


def write_robomimic(
    path: str | Path,
    demos: Sequence[Demo],
    image_key: str,
    *,
    state_keys: Sequence[str] = (),
    state_sizes: Sequence[int] | None = None,
    filter_keys: dict[str, list[str]] | None = None,
    env_args: dict | None = None,
) -> Path:
    """Write ``demos`` (named ``demo_<i>``) as a robomimic HDF5 file that
    :func:`read_robomimic` reads back with the same keys.

    A demo's states [T, S] are split into ``state_keys`` by ``state_sizes`` (the columns of each
    key; not needed for a single key, which gets all S); a demo with S = 0 writes no states.
    ``filter_keys`` maps a split name to its demo names (``mask/<split>``, byte strings).
    """
    path = Path(path)
    if isinstance(state_keys, str):
        state_keys = [state_keys]
    for demo in demos:
        if not _DEMO_RE.fullmatch(demo.name):
            raise DataFormatError(f"robomimic demos are named demo_<i>, got '{demo.name}'.")
        if demo.states.shape[1]:
            _split_states(demo, state_keys, state_sizes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as file:
        data = file.create_group("data")
        data.attrs["total"] = sum(len(d.frames) for d in demos)
        if env_args is not None:
            data.attrs["env_args"] = json.dumps(env_args)
        for demo in demos:
            group = data.create_group(demo.name)
            group.attrs["num_samples"] = len(demo.frames)
            group.create_dataset("actions", data=demo.actions)
            group.create_dataset(f"obs/{image_key}", data=demo.frames)
            if demo.states.shape[1]:
                for key, part in _split_states(demo, state_keys, state_sizes).items():
                    group.create_dataset(f"obs/{key}", data=part)
        for key, names in (filter_keys or {}).items():
            file.create_dataset(f"mask/{key}", data=np.array(names, dtype="S"))
    return path


def _split_states(
    demo: Demo, state_keys: Sequence[str], state_sizes: Sequence[int] | None
) -> dict[str, np.ndarray]:
    width = demo.states.shape[1]
    if state_sizes is None and len(state_keys) == 1:
        state_sizes = [width]
    if state_sizes is None or len(state_sizes) != len(state_keys) or sum(state_sizes) != width:
        raise DataFormatError(
            f"{demo.name} has states of {width} columns, which state_keys "
            f"{list(state_keys)} and state_sizes {state_sizes} do not split: give one size per "
            f"key, summing to {width} (a single key needs no sizes)."
        )
    bounds = np.cumsum([0, *state_sizes])
    return {
        key: demo.states[:, start:stop]
        for key, start, stop in zip(state_keys, bounds[:-1], bounds[1:], strict=True)
    }
