"""Real-data formats: RLA-WM trajectory folders (ManiSkill/IWS exports) and robomimic HDF5.

Trajectory folder ``traj_<id>/``: ``<cam>_rgb.mp4``, ``<cam>_foreground_mask.mp4`` (a grey
video, thresholded at 127), ``qpos.npy`` [T, J] (or ``qpos.npz`` key ``qpos``), optional
``target_qpos.npy`` (the actions; else actions = qpos) and ``success.txt`` / ``success.npy``.

robomimic: ``data/demo_<i>/actions`` [T, A], ``data/demo_<i>/obs/<cam>_image`` uint8
[T, H, W, 3], optional ``data/demo_<i>/obs/robot0_joint_pos`` [T, J] and ``mask/<key>`` splits.

Also the checks that tie data to the encoder: cached token shapes and ViT input sizes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import h5py
import numpy as np
import torch
import torch.nn.functional as F

RGB_SUFFIX = "_rgb.mp4"
MASK_SUFFIX = "_foreground_mask.mp4"
TRAJECTORY_LAYOUT = (
    "traj_<id>/ folders, each holding <cam>_rgb.mp4, <cam>_foreground_mask.mp4 and qpos.npy "
    "(optional target_qpos.npy, success.txt)"
)
# Lossy codecs leave values like 3 or 250 where 0/255 were written; the midpoint separates them.
MASK_THRESHOLD = 127
MPEG4_BIT_RATE = 4_000_000
# Frames resized per chunk, so long episodes at full resolution do not need gigabytes of floats.
RESIZE_CHUNK = 64

_TRAJ_RE = re.compile(r"traj_(\d+)")
_DEMO_RE = re.compile(r"demo_(\d+)")


@dataclass
class Episode:
    """One episode: RGB frames, foreground masks, actions and joint positions, step-aligned."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    masks: np.ndarray  # bool [T, H, W], True = foreground; all True when the source has none
    actions: np.ndarray  # float32 [T, A]
    qpos: np.ndarray  # float32 [T, J]
    name: str
    success: bool | None = None


class DataFormatError(ValueError):
    """The data do not have the layout, shapes or values this project reads; the message
    names the file, what was expected and how to fix it."""

    user_facing = True


# ---------------------------------------------------------------- trajectory folders


def list_trajectories(root: str | Path) -> list[Path]:
    """The ``traj_<id>`` folders under ``root``, sorted by their numeric id."""
    root = Path(root)
    found = (
        [p for p in root.iterdir() if p.is_dir() and _TRAJ_RE.fullmatch(p.name)]
        if root.is_dir()
        else []
    )
    if not found:
        raise DataFormatError(
            f"No trajectory folders found in {root}. Expected {TRAJECTORY_LAYOUT}; point the "
            "data root at the folder that contains the traj_<id> folders."
        )
    # String order would put traj_10 before traj_9.
    return sorted(found, key=lambda p: int(_TRAJ_RE.fullmatch(p.name).group(1)))


def trajectory_cameras(path: str | Path) -> list[str]:
    """The cameras of a trajectory folder, from its ``<cam>_rgb.mp4`` names."""
    return sorted(p.name[: -len(RGB_SUFFIX)] for p in Path(path).glob(f"*{RGB_SUFFIX}"))


def read_trajectory_dir(path: str | Path, camera: str, *, size: int | None = None) -> Episode:
    """Read one ``traj_<id>`` folder for ``camera``; ``size`` resizes frames and masks to
    size x size (frames antialiased, masks nearest)."""
    path = Path(path)
    if not path.is_dir():
        raise DataFormatError(f"{path} is not a folder. Expected {TRAJECTORY_LAYOUT}.")
    cameras = trajectory_cameras(path)
    if camera not in cameras:
        found = ", ".join(cameras) if cameras else f"none (no *{RGB_SUFFIX} files)"
        raise DataFormatError(
            f"Camera '{camera}' not found in {path}: there is no {camera}{RGB_SUFFIX}. "
            f"Cameras found: {found}. Choose one of them."
        )
    rgb_path = path / f"{camera}{RGB_SUFFIX}"
    mask_path = path / f"{camera}{MASK_SUFFIX}"
    if not mask_path.is_file():
        raise DataFormatError(
            f"Missing {mask_path}: every camera needs a foreground-mask video next to its rgb "
            f"video. Expected {TRAJECTORY_LAYOUT}; export the masks with the trajectory."
        )
    frames = decode_video(rgb_path)
    grey = decode_video(mask_path).astype(np.uint16).sum(axis=-1) / 3
    masks = grey > MASK_THRESHOLD
    if len(masks) != len(frames):
        raise DataFormatError(
            f"{mask_path} has {len(masks)} frames but {rgb_path.name} has {len(frames)}; "
            "the mask and rgb videos must have one frame per step. Re-export the trajectory."
        )
    if masks.shape[1:] != frames.shape[1:3]:
        raise DataFormatError(
            f"{mask_path} is {masks.shape[2]}x{masks.shape[1]} pixels but {rgb_path.name} is "
            f"{frames.shape[2]}x{frames.shape[1]}; the mask must match the rgb video. "
            "Re-export the trajectory at one resolution."
        )
    qpos, qpos_name = _read_qpos(path)
    _check_steps(qpos, qpos_name, len(frames), rgb_path)
    actions = qpos
    if (path / "target_qpos.npy").is_file():
        actions = _as_2d_float(np.load(path / "target_qpos.npy"), path / "target_qpos.npy")
        _check_steps(actions, path / "target_qpos.npy", len(frames), rgb_path)
    if size is not None:
        frames, masks = resize(frames, masks, size)
    return Episode(frames, masks, actions, qpos, path.name, _read_success(path))


def decode_video(path: Path) -> np.ndarray:
    """All frames of the first video stream of ``path`` as uint8 RGB [T, H, W, 3]."""
    if not path.is_file():
        raise DataFormatError(f"Missing video {path}. Expected {TRAJECTORY_LAYOUT}.")
    try:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError) as error:
        # IndexError: the file opened but holds no video stream.
        raise DataFormatError(
            f"Cannot decode {path} as a video ({error}); re-export it as an mp4 (e.g. H.264)."
        ) from error
    if not frames:
        raise DataFormatError(f"{path} holds no frames; re-export the trajectory.")
    return np.stack(frames)


def resize(frames: np.ndarray, masks: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Frames (bilinear, antialiased) and masks (nearest) resized to size x size."""
    if not isinstance(size, int) or size <= 0:
        raise DataFormatError(f"size must be a positive integer, got {size!r}.")
    out_frames, out_masks = [], []
    for start in range(0, len(frames), RESIZE_CHUNK):
        chunk = torch.from_numpy(frames[start : start + RESIZE_CHUNK]).permute(0, 3, 1, 2)
        chunk = F.interpolate(chunk.float(), (size, size), mode="bilinear", antialias=True)
        out_frames.append(chunk.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))
        mask = torch.from_numpy(masks[start : start + RESIZE_CHUNK])[:, None].float()
        out_masks.append(F.interpolate(mask, (size, size), mode="nearest")[:, 0] > 0.5)
    return torch.cat(out_frames).numpy(), torch.cat(out_masks).numpy()


def _read_qpos(path: Path) -> tuple[np.ndarray, Path]:
    npy, npz = path / "qpos.npy", path / "qpos.npz"
    if npy.is_file():
        return _as_2d_float(np.load(npy), npy), npy
    if npz.is_file():
        with np.load(npz) as archive:
            if "qpos" not in archive:
                raise DataFormatError(
                    f"{npz} has no array 'qpos' (it holds: {', '.join(archive.files)}); save "
                    "the joint positions under the key 'qpos'."
                )
            return _as_2d_float(archive["qpos"], npz), npz
    raise DataFormatError(
        f"Missing joint positions in {path}: expected qpos.npy (or qpos.npz with key 'qpos') "
        "holding float [T, J], one row per video frame."
    )


def _as_2d_float(array: np.ndarray, source: Path) -> np.ndarray:
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise DataFormatError(
            f"{source} holds {array.dtype} {list(array.shape)}; expected numbers of shape "
            "[T, J], one row per step."
        )
    return array.astype(np.float32)


def _check_steps(array: np.ndarray, source: Path, n_frames: int, video: Path) -> None:
    if len(array) != n_frames:
        raise DataFormatError(
            f"{source} has {len(array)} steps but {video} has {n_frames} frames; they must "
            "have one row per frame. Re-export the trajectory (or trim both to one length)."
        )


def _read_success(path: Path) -> bool | None:
    txt, npy = path / "success.txt", path / "success.npy"
    if txt.is_file():
        word = txt.read_text().strip().lower()
        if word in ("1", "true", "yes", "success"):
            return True
        if word in ("0", "false", "no", "failure"):
            return False
        raise DataFormatError(f"{txt} holds {word!r}; write 1/true or 0/false.")
    if npy.is_file():
        # A per-step array (ManiSkill's success flags) counts once any step succeeded.
        return bool(np.asarray(np.load(npy)).any())
    return None


def write_trajectory_dir(path: str | Path, episode: Episode, camera: str, fps: int = 10) -> Path:
    """Write ``episode`` as a trajectory folder that :func:`read_trajectory_dir` reads."""
    path = Path(path)
    t, h, w, _ = episode.frames.shape
    if h % 2 or w % 2:
        raise DataFormatError(
            f"Frames are {w}x{h}; yuv420p mp4 needs an even width and height. Crop or resize."
        )
    path.mkdir(parents=True, exist_ok=True)
    _encode_video(path / f"{camera}{RGB_SUFFIX}", episode.frames, fps)
    grey = np.repeat(episode.masks[..., None].astype(np.uint8) * 255, 3, axis=-1)
    _encode_video(path / f"{camera}{MASK_SUFFIX}", grey, fps)
    np.save(path / "qpos.npy", episode.qpos.astype(np.float32))
    if not np.array_equal(episode.actions, episode.qpos):
        np.save(path / "target_qpos.npy", episode.actions.astype(np.float32))
    if episode.success is not None:
        (path / "success.txt").write_text(f"{int(episode.success)}\n")
    return path


def _encode_video(path: Path, frames: np.ndarray, fps: int) -> None:
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if codec == "mpeg4":
            # Its default bit rate is low enough to flip mask pixels across the threshold.
            stream.bit_rate = MPEG4_BIT_RATE
        for array in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())  # flush the frames the encoder still holds


# ---------------------------------------------------------------- robomimic HDF5


def read_robomimic(
    path: str | Path, camera: str, *, filter_key: str | None = None
) -> list[Episode]:
    """The demos of a robomimic HDF5 file (those of ``mask/<filter_key>`` when given), in
    numeric order; masks are all True since robomimic stores none."""
    path = Path(path)
    with _open_hdf5(path) as file:
        data = _data_group(file, path)
        names = sorted(
            (k for k in data if _DEMO_RE.fullmatch(k)),
            key=lambda k: int(_DEMO_RE.fullmatch(k).group(1)),
        )
        if not names:
            raise DataFormatError(f"{path} has no data/demo_<i> groups; is it a robomimic file?")
        if filter_key is not None:
            chosen = set(_filter_names(file, path, filter_key))
            missing = sorted(chosen - set(names))
            if missing:
                raise DataFormatError(
                    f"mask/{filter_key} in {path} names demos that are not in data/: "
                    f"{', '.join(missing)}. Regenerate the filter keys for this file."
                )
            names = [n for n in names if n in chosen]
        return [_read_demo(data[name], path, name, camera) for name in names]


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
        raise DataFormatError(
            f"{path} has no 'data' group; a robomimic file holds data/demo_<i>/actions and "
            "data/demo_<i>/obs/<camera>_image."
        )
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


def _read_demo(demo: h5py.Group, path: Path, name: str, camera: str) -> Episode:
    where = f"{path}:data/{name}"
    obs = demo.get("obs")
    if obs is None or "actions" not in demo:
        raise DataFormatError(f"{where} needs 'actions' and an 'obs' group.")
    key = f"{camera}_image"
    if key not in obs:
        found = sorted(k for k in obs if k.endswith("_image"))
        listed = ", ".join(found) if found else "none"
        raise DataFormatError(
            f"Camera '{camera}' not found in {where}/obs: there is no {key}. Image keys "
            f"found: {listed}. Pass the camera name without the '_image' suffix."
        )
    images = obs[key][()]
    if images.ndim == 4 and images.shape[1] == 3 and images.shape[-1] != 3:
        raise DataFormatError(
            f"{where}/obs/{key} is {list(images.shape)}, channels first; expected "
            "[T, H, W, 3]. Transpose it with images.transpose(0, 2, 3, 1)."
        )
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise DataFormatError(
            f"{where}/obs/{key} holds {images.dtype} {list(images.shape)}; expected uint8 "
            "[T, H, W, 3] RGB."
        )
    actions = _as_2d_float(demo["actions"][()], Path(f"{where}/actions"))
    if len(actions) != len(images):
        raise DataFormatError(
            f"{where}/actions has {len(actions)} steps but obs/{key} has {len(images)} "
            "frames; they must have one row per frame."
        )
    if "robot0_joint_pos" in obs:
        qpos = _as_2d_float(obs["robot0_joint_pos"][()], Path(f"{where}/obs/robot0_joint_pos"))
        if len(qpos) != len(images):
            raise DataFormatError(
                f"{where}/obs/robot0_joint_pos has {len(qpos)} steps but obs/{key} has "
                f"{len(images)} frames; they must have one row per frame."
            )
    else:
        qpos = np.zeros((len(images), 0), np.float32)
    masks = np.ones(images.shape[:3], dtype=bool)
    return Episode(images, masks, actions, qpos, name)


def write_robomimic(
    path: str | Path,
    episodes: Sequence[Episode],
    camera: str,
    filter_keys: dict[str, list[str]] | None = None,
    *,
    env_args: dict | None = None,
) -> Path:
    """Write ``episodes`` (named ``demo_<i>``) as a robomimic HDF5 file; masks are dropped
    since the format has none, and an empty qpos writes no joint positions."""
    path = Path(path)
    for episode in episodes:
        if not _DEMO_RE.fullmatch(episode.name):
            raise DataFormatError(f"robomimic demos are named demo_<i>, got '{episode.name}'.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as file:
        data = file.create_group("data")
        data.attrs["total"] = sum(len(e.frames) for e in episodes)
        if env_args is not None:
            data.attrs["env_args"] = json.dumps(env_args)
        for episode in episodes:
            demo = data.create_group(episode.name)
            demo.attrs["num_samples"] = len(episode.frames)
            demo.create_dataset("actions", data=episode.actions)
            demo.create_dataset(f"obs/{camera}_image", data=episode.frames)
            if episode.qpos.shape[1]:
                demo.create_dataset("obs/robot0_joint_pos", data=episode.qpos)
        for key, names in (filter_keys or {}).items():
            file.create_dataset(f"mask/{key}", data=np.array(names, dtype="S"))
    return path


# ---------------------------------------------------------------- encoder checks


def check_tokens(tokens, expected_tokens: int, expected_dim: int, source: str | Path) -> None:
    """Cached encoder tokens must be float [N, L, C] with L == expected_tokens and
    C == expected_dim; ``tokens`` is a tensor or an array."""
    shape, dtype = tuple(tokens.shape), tokens.dtype
    floating = (
        dtype.is_floating_point
        if isinstance(tokens, torch.Tensor)
        else (np.issubdtype(dtype, np.floating))
    )
    if floating and len(shape) == 3 and shape[1:] == (expected_tokens, expected_dim):
        return
    raise DataFormatError(
        f"Cached encoder tokens in {source} are {dtype} {list(shape)}; expected float "
        f"[N, {expected_tokens}, {expected_dim}] (N clips, {expected_tokens} tokens of "
        f"{expected_dim} channels). Delete {source} so it is rebuilt, or fix the encoder "
        "settings (image size, patch size, model) to match the cache."
    )


def check_image_size(image_size: int, patch_size: int) -> None:
    """A ViT input size must be a positive multiple of the patch size."""
    if not isinstance(patch_size, int) or patch_size <= 0:
        raise DataFormatError(f"The patch size must be a positive integer, got {patch_size!r}.")
    if not isinstance(image_size, int) or image_size <= 0:
        raise DataFormatError(f"The image size must be a positive integer, got {image_size!r}.")
    if image_size % patch_size == 0:
        return
    lower = image_size // patch_size * patch_size
    options = [n for n in (lower, lower + patch_size) if n > 0]
    raise DataFormatError(
        f"Image size {image_size} is not a multiple of the encoder's patch size {patch_size} "
        f"(DINOv2: 14, DINOv3: 16); use {' or '.join(map(str, options))}."
    )


def encoder_input_size(config, *, size: int | None = None) -> int:
    """The square size frames are resized to for an encoder ``config`` (anything with
    ``image_size`` and ``patch_size``): ``size`` when given, else the config's own."""
    try:
        image_size, patch_size = config.image_size, config.patch_size
    except AttributeError as error:
        raise DataFormatError(
            f"The encoder config {type(config).__name__} has no image_size/patch_size; "
            "expected a ViT config such as Dinov2Config or DINOv3ViTConfig."
        ) from error
    image_size, patch_size = _square(image_size, "image_size"), _square(patch_size, "patch_size")
    chosen = image_size if size is None else size
    check_image_size(chosen, patch_size)
    return chosen


def _square(value, what: str) -> int:
    # transformers configs give sizes as an int or an (h, w) pair.
    if isinstance(value, Sequence):
        if len(value) != 2 or value[0] != value[1]:
            raise DataFormatError(f"The encoder's {what} {value} is not square; expected one size.")
        value = value[0]
    return int(value)
