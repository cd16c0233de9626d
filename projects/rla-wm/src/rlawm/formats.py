"""Real-data formats: RLA-WM trajectory folders (ManiSkill/IWS exports) and robomimic HDF5.

Trajectory folder ``traj_<id>/``: ``<cam>_rgb.mp4``, ``<cam>_foreground_mask.mp4`` (a grey
video, thresholded at 127), ``qpos.npy`` [T, J] (or ``qpos.npz`` key ``qpos``), optional
``target_qpos.npy`` (the actions; else actions = qpos) and ``success.txt`` / ``success.npy``.

robomimic: ``data/demo_<i>/actions`` [T, A], ``data/demo_<i>/obs/<cam>_image`` uint8
[T, H, W, 3], optional ``data/demo_<i>/obs/robot0_joint_pos`` [T, J] and ``mask/<key>`` splits,
read by the shared reader (``papers_worldmodels.robomimic``) into Episodes.

Also the check that ties cached tokens to the encoder; the ViT input-size checks live with the
encoder (``papers_worldmodels.encoder``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import torch
import torch.nn.functional as F

from papers_worldmodels import robomimic
from papers_worldmodels.errors import DataFormatError

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
JOINT_POSITIONS = "robot0_joint_pos"  # the robomimic obs key read into Episode.qpos, if present


@dataclass
class Episode:
    """One episode: RGB frames, foreground masks, actions and joint positions, step-aligned."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    masks: np.ndarray  # bool [T, H, W], True = foreground; all True when the source has none
    actions: np.ndarray  # float32 [T, A]
    qpos: np.ndarray  # float32 [T, J]
    name: str
    success: bool | None = None


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
    numeric order, for ``camera`` (``obs/<camera>_image``); qpos from ``robot0_joint_pos`` when
    a demo has it, else [T, 0]; masks are all True since robomimic stores none."""
    demos = robomimic.read_robomimic(
        path,
        robomimic.camera_key(camera),
        state_keys=[JOINT_POSITIONS],
        filter_key=filter_key,
        optional_states=True,
    )
    return [
        Episode(d.frames, np.ones(d.frames.shape[:3], dtype=bool), d.actions, d.states, d.name)
        for d in demos
    ]


# ---------------------------------------------------------------- cached tokens


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
