"""Frames to frozen embeddings: the rendered miniature and the real datasets.

The frozen "foundation" encoder is ``papers_worldmodels.encoder``: a local DINOv2 folder
(``encoder_checkpoint``, paper scale) or the stand-in, a tiny ``Dinov2Model`` self-supervised by
masked-patch prediction on frames of episodes that no model trains or plans on, then frozen. The
stand-in is not DINO and has no semantic features; its embeddings carry the distractors and
colours of the frames because nothing tells it they are irrelevant (the distractors manufacture
what real foundation features have in excess: task-irrelevant detail).

The stand-in belongs to the world, not to a run: it is pretrained once per scene (fixed seed
``ENCODER_SEED``, frames at full distractor strength) and cached, so every model of every seed
sees the same embedding space, as with a real frozen foundation model.
"""

from __future__ import annotations

from pathlib import Path

# The transformers model classes must be imported before a MuJoCo EGL renderer exists
# (papers_worldmodels.encoder's note: the reverse order segfaults on llvmpipe).
from papers_worldmodels.encoder import (  # isort: skip
    build_encoder,
    encode_frames,
    freeze,
    pretrain,
    tiny_config,
)

import numpy as np
import torch
import torch.nn.functional as F

from papers_cli import ConfigError
from papers_data import cache_dir, cached_generate, config_hash
from tcwm.formats import DataFormatError, Episode, read_dino_wm, read_minari, write_dino_wm
from tcwm.scene import Nuisance, draw_nuisance, make_scene, random_episodes

ENCODER_SEED = 0
PRETRAIN_EPISODES = 40  # separate episodes (seed ENCODER_SEED + 10_000) for the stand-in


class RenderedWorld:
    """A scene with the synthetic world's interface: one ``step`` is one dataset step (the
    scene's action repeat), ``observe`` is the frame's frozen tokens."""

    def __init__(self, name: str, encoder, token_grid: int) -> None:
        self.scene = make_scene(name)
        self.name, self.encoder, self.token_grid = name, encoder, token_grid
        self.state_dim, self.action_dim = self.scene.state_dim, self.scene.action_dim
        self.repeat = self.scene.default_action_repeat

    def set_state(self, state) -> None:
        self.scene.set_state(state)

    def get_state(self) -> np.ndarray:
        return self.scene.get_state().astype(np.float32)

    def step(self, action) -> np.ndarray:
        return self.scene.step(np.asarray(action, np.float64), self.repeat)

    def observe(self, nuisance: Nuisance, t: int) -> np.ndarray:
        frame = torch.from_numpy(self.scene.render(nuisance, t).copy())[None]
        return encode(self.encoder, frame, self.token_grid)[0].numpy()

    def position(self, state):
        return self.scene.position(state)

    def success(self, state, goal) -> bool:
        return self.scene.success(state, goal)

    def sample_start(self, rng):
        return self.scene.sample_start(rng)

    def draw_nuisance(self, rng, kappa: float) -> Nuisance:
        return draw_nuisance(rng, kappa, self.scene)

    def close(self) -> None:
        self.scene.close()


def encode(encoder, frames: torch.Tensor, token_grid: int) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> pooled frozen tokens float32 [N, token_grid^2, C]."""
    size = encoder.config.image_size
    if frames.shape[1] != size or frames.shape[2] != size:
        raise DataFormatError(
            f"frames of {frames.shape[1]}x{frames.shape[2]} do not match the encoder's "
            f"{size}x{size} input: set --data.image_size or resize the frames"
        )
    return pool_tokens(encode_frames(encoder, frames, None), token_grid)


def pool_tokens(tokens: torch.Tensor, grid: int) -> torch.Tensor:
    """Average-pool square token grids [..., L, C] to [..., grid^2, C] (L a square >= grid^2)."""
    side = int(round(tokens.shape[-2] ** 0.5))
    if side * side != tokens.shape[-2]:
        raise DataFormatError(f"{tokens.shape[-2]} patch tokens do not form a square grid")
    if side == grid or tokens.shape[-2] == 1:
        return tokens
    if side % grid:
        raise ConfigError(f"token_grid={grid} does not divide the encoder's {side}x{side} grid")
    lead = tokens.shape[:-2]
    x = tokens.reshape(-1, side, side, tokens.shape[-1]).permute(0, 3, 1, 2)
    x = F.avg_pool2d(x, side // grid).permute(0, 2, 3, 1)
    return x.reshape(*lead, grid * grid, tokens.shape[-1])


def standin_encoder(scene: str, steps: int):
    """The stand-in encoder of a scene, pretrained once (cached by scene and steps), frozen."""
    config = {"scene": scene, "steps": steps, "seed": ENCODER_SEED, "episodes": PRETRAIN_EPISODES}
    torch.manual_seed(ENCODER_SEED)
    encoder = build_encoder(tiny_config())

    def generate() -> dict[str, np.ndarray]:
        frames = random_episodes(scene, PRETRAIN_EPISODES, 25, 1.0, ENCODER_SEED + 10_000)
        frames = torch.from_numpy(frames["frames"].reshape(-1, *frames["frames"].shape[2:]))
        losses = pretrain(encoder, frames, None, steps, seed=ENCODER_SEED) if steps else []
        state = {k: v.detach().numpy() for k, v in encoder.state_dict().items()}
        return {**state, "__losses__": np.asarray(losses, np.float32)}

    arrays = cached_generate("tc-wm-encoder", config, generate)
    arrays.pop("__losses__")
    encoder.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    return freeze(encoder)


def load_encoder(h):
    """The frozen encoder of a data config: a local checkpoint, or the scene's stand-in."""
    if h.encoder_checkpoint is not None:
        return freeze(build_encoder(pretrained=Path(h.encoder_checkpoint)))
    scene = "pointmaze" if h.source in ("dino_wm", "minari") else h.source
    if scene not in ("pointmaze", "reacher"):
        raise ConfigError(
            f"data.source={h.source!r} needs --data.encoder_checkpoint: a local DINOv2 folder "
            "(save_pretrained of e.g. facebook/dinov2-small); the stand-in encoder is trained "
            "on the miniature's scenes only"
        )
    return standin_encoder(scene, h.encoder_steps)


def load_visual_arrays(h, seed: int) -> dict[str, np.ndarray]:
    """Frozen tokens, states, positions and actions of a visual source (see ``tcwm.data``)."""
    check_root(h)
    encoder = load_encoder(h)
    config = {
        "source": h.source,
        "root": h.root,
        "n": h.n_episodes,
        "T": h.episode_length,
        "kappa": h.kappa,
        "seed": seed if h.root is None else None,
        "encoder": h.encoder_checkpoint or h.encoder_steps,
        "grid": h.token_grid,
        "image_key": h.image_key,
        "state_keys": h.state_variables,
    }

    def generate() -> dict[str, np.ndarray]:
        episodes, position = read_episodes(h, seed, encoder.config.image_size)
        frames = torch.from_numpy(np.stack([e.frames for e in episodes]))
        n, t = frames.shape[:2]
        tokens = encode(encoder, frames.flatten(0, 1), h.token_grid)
        states = np.stack([e.states for e in episodes])
        return {
            "tokens": tokens.reshape(n, t, *tokens.shape[1:]).numpy(),
            "states": states,
            "positions": position(states).astype(np.float32),
            "actions": np.stack([e.actions for e in episodes]),
            "nuisance": np.zeros((n, t, 0), np.float32),
        }

    return cached_generate("tc-wm", config, generate)


def check_root(h) -> None:
    """Rendered sources take no root; real ones need one (checked before any encoder work)."""
    if h.source in ("pointmaze", "reacher") and h.root is not None:
        raise ConfigError(f"data.source={h.source!r} renders its data: drop --data.root")
    if h.source not in ("pointmaze", "reacher") and h.root is None:
        raise ConfigError(f"data.source={h.source!r} reads real data: pass --data.root")


def read_episodes(h, seed: int, image_size: int):
    """Equal-length episodes with frames (and the position map) of a visual source."""
    if h.source in ("pointmaze", "reacher"):
        data = random_episodes(h.source, h.n_episodes, h.episode_length, h.kappa, seed)
        # The miniature is written in DINO-WM's layout and read back by the same loader as the
        # real data, so the loader is on the default path.
        folder = Path(cache_dir()) / "tc-wm-dino-wm" / config_hash({"h": dict(h), "seed": seed})
        if not (folder / "states.pth").is_file():
            write_dino_wm(
                folder,
                [
                    Episode(f, s, a, f"episode_{i}")
                    for i, (f, s, a) in enumerate(
                        zip(data["frames"], data["states"], data["actions"], strict=True)
                    )
                ],
            )
        episodes = read_dino_wm(folder, size=image_size)
        scene = make_scene(h.source)
        return episodes, scene.position
    if h.source == "dino_wm":
        episodes = read_dino_wm(h.root, size=image_size)
        return chunk(episodes, h.episode_length), lambda s: s[..., :2]
    if h.source == "robomimic":
        from papers_worldmodels.robomimic import read_robomimic

        keys = h.state_variables or ["robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"]
        demos = read_robomimic(h.root, h.image_key, state_keys=keys)
        episodes = [
            Episode(_resize(d.frames, image_size), d.states, d.actions, d.name) for d in demos
        ]
        return chunk(episodes, h.episode_length), lambda s: s[..., :3]  # end-effector position
    if h.source == "minari":
        return render_minari(h, seed, image_size)
    raise ConfigError(f"unknown data.source {h.source!r}")


def render_minari(h, seed: int, image_size: int):
    """Minari PointMaze episodes hold no images: their states are rendered by the miniature's
    PointMaze scene (the same point agent; the maze walls are the U-maze's, which matches
    pointmaze-umaze datasets only) under a per-episode nuisance of strength ``kappa``."""
    rng = np.random.default_rng(seed)
    episodes = []
    with make_scene("pointmaze") as scene:
        for episode in chunk(read_minari(h.root), h.episode_length):
            nuisance = draw_nuisance(rng, h.kappa, scene)
            frames = []
            for t, state in enumerate(episode.states):
                scene.set_state(state.astype(np.float64))
                frames.append(scene.render(nuisance, t).copy())
            episodes.append(
                Episode(
                    _resize(np.stack(frames), image_size),
                    episode.states,
                    episode.actions,
                    episode.name,
                )
            )
        return episodes, scene.position


def chunk(episodes: list[Episode], length: int) -> list[Episode]:
    """Cut episodes into pieces of ``length`` steps (the rest of each dropped)."""
    pieces = [
        Episode(
            None if e.frames is None else e.frames[s : s + length],
            e.states[s : s + length],
            e.actions[s : s + length],
            f"{e.name}[{s}:{s + length}]",
        )
        for e in episodes
        for s in range(0, len(e) - length + 1, length)
    ]
    if not pieces:
        raise DataFormatError(
            f"no episode holds data.episode_length={length} steps: lower --data.episode_length"
        )
    return pieces


def _resize(frames: np.ndarray, size: int) -> np.ndarray:
    from tcwm.formats import resize_frames

    return frames if frames.shape[1] == size else resize_frames(frames, size)
