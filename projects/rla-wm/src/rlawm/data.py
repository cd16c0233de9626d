"""Data: frozen-encoder tokens of episodes, training pairs (x_t, x_{t+h}, chunk) and test groups.

``PushWorldDataModule`` builds one ``World`` in ``setup``:

- ``source="push"`` (the embedded default): MuJoCo push episodes rendered at 64x64 with hidden
  per-episode friction and mass; a tiny ``Dinov2Model`` self-supervised on frames of separate
  episodes, then frozen; the tokens of every frame, standardised per channel with the training
  statistics. Evaluation groups share one start and one action sequence of ``chunks`` chunks,
  replayed under all four hidden (friction, mass) settings: their true outcomes are several.
  Expert demonstrations (the scripted pusher, little noise) feed the two robot-learning uses.
- ``source="trajectories"`` / ``"robomimic"`` (paper scale): episodes read by ``rlawm.formats``
  from ``data_dir``, encoded by the pretrained encoder at ``encoder_path``; each held-out
  episode is a group of one outcome (real data have one outcome per start).

The tokens are cached (``token_cache``) with the encoder that made them; a cache whose token
shape does not match the encoder settings is a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, NotEmptyStr, PositiveInt
from torch.utils.data import DataLoader, IterableDataset

from papers_cli.hparams import init_arguments

# before any MuJoCo renderer exists (see papers_worldmodels.encoder)
from papers_worldmodels import encoder as vit
from rlawm.formats import (
    DataFormatError,
    Episode,
    check_tokens,
    list_trajectories,
    read_robomimic,
    read_trajectory_dir,
    resize,
)
from rlawm.scene import FRICTIONS, MASSES, Hidden, PushScene, draw_start, rollout_episode

Source = Literal["push", "trajectories", "robomimic"]


@dataclass
class Groups:
    """Evaluation groups: G starts, M outcomes each (hidden settings), K chunks of h actions.

    tokens [G, M, K+1, L, C] at the chunk boundaries (index 0 = the shared start), actions
    [G, K, h, A], frames uint8 [G, M, K+1, H, W, 3] and masks bool [G, M, K+1, H, W].
    """

    tokens: torch.Tensor
    actions: torch.Tensor
    frames: torch.Tensor
    masks: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass
class World:
    """Everything the experiments read. Tokens are standardised (``token_mean``/``token_std``)."""

    train_tokens: torch.Tensor  # [E, T+1, L, C]
    train_actions: torch.Tensor  # [E, T, A]
    train_frames: torch.Tensor  # uint8 [E, T+1, H, W, 3]
    train_masks: torch.Tensor  # bool [E, T+1, H, W]
    demo_tokens: torch.Tensor  # [D, T_d+1, L, C] expert demonstrations (videos)
    demo_actions: torch.Tensor  # [D, T_d, A]
    demo_frames: torch.Tensor  # uint8 [D, T_d+1, H, W, 3]
    demo_masks: torch.Tensor  # bool [D, T_d+1, H, W]
    val: Groups
    test: Groups
    token_mean: torch.Tensor  # [C]
    token_std: torch.Tensor  # [C]
    encoder_pretrain_loss: tuple[float, float]  # first and last masked-patch loss

    def standardise(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens - self.token_mean) / self.token_std


class StepBatches(IterableDataset):
    """An endless stream of training batches; batch s is drawn by a generator seeded with
    (seed, s), so a run resumed at step s sees exactly the batches an uninterrupted run sees.
    ``start_step`` (a number, or a callable read at each new iteration: the trainer's global
    step) says where a stream starts; read per iteration, an epoch cut short by
    ``limit_train_batches`` goes on with the next batches instead of repeating its first."""

    def __init__(self, x_t, x_next, chunks, batch_size: int, seed: int, start_step):
        self.x_t, self.x_next, self.chunks = x_t, x_next, chunks
        self.batch_size, self.seed, self.start_step = batch_size, seed, start_step

    def __iter__(self):
        step = self.start_step() if callable(self.start_step) else self.start_step
        while True:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            index = torch.randint(len(self.x_t), (self.batch_size,), generator=generator)
            yield {
                "x_t": self.x_t[index],
                "x_next": self.x_next[index],
                "chunk": self.chunks[index],
            }
            step += 1


class PushWorldDataModule(L.LightningDataModule):
    """Frozen tokens, training pairs and evaluation groups (see the module docstring)."""

    def __init__(
        self,
        source: Source = "push",
        data_dir: Path | None = None,
        camera: NotEmptyStr = "top",
        encoder_path: Path | None = None,
        token_cache: Path | None = None,
        num_episodes: PositiveInt = 96,
        episode_length: PositiveInt = 24,
        horizon: PositiveInt = 4,
        chunks: PositiveInt = 3,
        num_demos: PositiveInt = 48,
        val_groups: PositiveInt = 8,
        test_groups: PositiveInt = 16,
        image_size: PositiveInt = 64,
        patch_size: PositiveInt = 16,
        encoder_width: PositiveInt = 32,
        encoder_layers: PositiveInt = 2,
        encoder_episodes: PositiveInt = 16,
        encoder_steps: NonNegativeInt = 150,
        batch_size: PositiveInt = 64,
        seed: NonNegativeInt = 0,
    ):
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        if source != "push" and data_dir is None:
            raise DataFormatError(
                f"data.source={source} reads real episodes: set --data.data_dir to "
                + (
                    "a folder of traj_<id>/ folders"
                    if source == "trajectories"
                    else "a robomimic .hdf5 file"
                )
            )
        if episode_length < horizon * chunks:
            raise ValueError(
                f"episode_length={episode_length} is shorter than chunks x horizon = "
                f"{chunks} x {horizon}"
            )
        self.world: World | None = None
        self.encoder = None

    # ------------------------------------------------------------------ building the world

    def setup(self, stage: str | None = None) -> None:
        if self.world is not None:
            return
        cache = self.hparams.token_cache
        if cache is not None and Path(cache).exists():
            self.world, self.encoder = self._load(Path(cache))
            return
        if self.hparams.source == "push":
            self.world, self.encoder = build_push_world(self.hparams)
        else:
            self.world, self.encoder = build_real_world(self.hparams)
        if cache is not None:
            self._save(Path(cache))

    def _expected_token_shape(self) -> tuple[int, int]:
        config = self.encoder_config()
        size = vit.encoder_input_size(config, size=self.hparams.image_size)
        return (size // config.patch_size) ** 2, config.hidden_size

    def encoder_config(self):
        if self.hparams.encoder_path is not None:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(self.hparams.encoder_path, local_files_only=True)
        h = self.hparams
        return vit.tiny_config(h.image_size, h.patch_size, h.encoder_width, h.encoder_layers)

    def _save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        world = {f.name: getattr(self.world, f.name) for f in fields(World)}
        world["val"], world["test"] = vars(self.world.val), vars(self.world.test)
        torch.save({"world": world, "encoder": self.encoder.state_dict()}, path)

    def _load(self, path: Path) -> tuple[World, torch.nn.Module]:
        saved = torch.load(path, weights_only=True)
        world = saved["world"]
        tokens, dim = self._expected_token_shape()
        for name in ("train_tokens", "demo_tokens"):
            check_tokens(world[name].flatten(0, 1), tokens, dim, path)
        world["val"], world["test"] = Groups(**world["val"]), Groups(**world["test"])
        world["encoder_pretrain_loss"] = tuple(world["encoder_pretrain_loss"])
        encoder = vit.build_encoder(self.encoder_config())
        encoder.load_state_dict(saved["encoder"])
        return World(**world), vit.freeze(encoder)

    # ------------------------------------------------------------------ what models read

    @property
    def token_shape(self) -> tuple[int, int]:
        return tuple(self.world.train_tokens.shape[-2:])

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every (x_t, x_{t+h}, a_{t:t+h}) of the training episodes and demonstrations."""
        h, w = self.hparams.horizon, self.world
        train = chunk_pairs(w.train_tokens, w.train_actions, h)
        demos = chunk_pairs(w.demo_tokens, w.demo_actions, h)
        return tuple(torch.cat(parts) for parts in zip(train, demos, strict=True))

    def train_dataloader(self):
        # each epoch's stream starts at the trainer's step, read when the epoch starts: resumed
        # runs restart where they stopped (global_step is restored first), and an epoch cut
        # short by limit_train_batches does not repeat the previous epoch's batches
        trainer = self.trainer

        def start() -> int:
            return trainer.global_step if trainer is not None else 0

        data = StepBatches(*self.pairs(), self.hparams.batch_size, self.hparams.seed, start)
        return DataLoader(data, batch_size=None)

    def val_dataloader(self):
        return DataLoader([self.world.val], batch_size=None, collate_fn=lambda x: x)

    def test_dataloader(self):
        return DataLoader([self.world.test], batch_size=None, collate_fn=lambda x: x)


def chunk_pairs(sequences: torch.Tensor, actions: torch.Tensor, horizon: int):
    """Every (x_t, x_{t+h}, a_{t:t+h}) of episodes [E, T+1, ...] with actions [E, T, A], in
    (t, episode) order: three tensors of E * (T - h + 1) items."""
    starts = range(actions.shape[1] - horizon + 1)
    return (
        torch.cat([sequences[:, t] for t in starts]),
        torch.cat([sequences[:, t + horizon] for t in starts]),
        torch.cat([actions[:, t : t + horizon] for t in starts]),
    )


# ---------------------------------------------------------------------- the push miniature


def _episode_tensors(episodes: list[dict]) -> tuple[torch.Tensor, ...]:
    frames = torch.from_numpy(np.stack([e["frames"] for e in episodes]))
    masks = torch.from_numpy(np.stack([e["masks"] for e in episodes]))
    actions = torch.from_numpy(np.stack([e["actions"] for e in episodes]))
    return frames, masks, actions


def encode(encoder, frames: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Frozen tokens of frames [..., H, W, 3] -> [..., L, C] (any leading shape)."""
    lead = frames.shape[:-3]
    tokens = vit.encode_frames(
        encoder, frames.flatten(0, len(lead) - 1), masks.flatten(0, len(lead) - 1)
    )
    return tokens.view(*lead, *tokens.shape[-2:])


def render_groups(scene, rng, count: int, chunks: int, horizon: int) -> dict[str, torch.Tensor]:
    """``count`` starts, each with one action sequence (the noisy scripted pusher under the
    first hidden setting) replayed under every (friction, mass) pair."""
    settings = [Hidden(f, m) for f in FRICTIONS for m in MASSES]
    frames, masks, actions = [], [], []
    length = chunks * horizon
    for _ in range(count):
        start = draw_start(rng)
        nominal = rollout_episode(scene, rng, length, start=start, hidden=settings[0])
        members = [
            rollout_episode(scene, rng, length, start=start, hidden=s, actions=nominal["actions"])
            for s in settings
        ]
        keep = slice(0, length + 1, horizon)
        frames.append(np.stack([m["frames"][keep] for m in members]))
        masks.append(np.stack([m["masks"][keep] for m in members]))
        actions.append(nominal["actions"].reshape(chunks, horizon, -1))
    return {
        "frames": torch.from_numpy(np.stack(frames)),
        "masks": torch.from_numpy(np.stack(masks)),
        "actions": torch.from_numpy(np.stack(actions)),
    }


def build_push_world(h) -> tuple[World, torch.nn.Module]:
    """Render, pretrain and freeze the stand-in encoder, encode and standardise (seeded)."""
    torch.manual_seed(h.seed)
    rng = np.random.default_rng(h.seed)
    scene = PushScene(h.image_size)
    try:
        separate = [
            rollout_episode(scene, rng, h.episode_length) for _ in range(h.encoder_episodes)
        ]
        train = [rollout_episode(scene, rng, h.episode_length) for _ in range(h.num_episodes)]
        demos = [
            rollout_episode(scene, rng, h.episode_length, random_share=0.0, noise=0.1)
            for _ in range(h.num_demos)
        ]
        val = render_groups(scene, rng, h.val_groups, h.chunks, h.horizon)
        test = render_groups(scene, rng, h.test_groups, h.chunks, h.horizon)
    finally:
        scene.close()
    encoder = vit.build_encoder(
        vit.tiny_config(h.image_size, h.patch_size, h.encoder_width, h.encoder_layers)
    )
    sep_frames, sep_masks, _ = _episode_tensors(separate)
    losses = vit.pretrain(
        encoder, sep_frames.flatten(0, 1), sep_masks.flatten(0, 1), h.encoder_steps, seed=h.seed
    ) or [float("nan")]
    vit.freeze(encoder)
    frames, masks, actions = _episode_tensors(train)
    demo_frames, demo_masks, demo_actions = _episode_tensors(demos)
    raw = encode(encoder, frames, masks)
    mean, std = raw.mean((0, 1, 2)), raw.std((0, 1, 2)).clamp_min(1e-6)

    def groups(g: dict[str, torch.Tensor]) -> Groups:
        tokens = (encode(encoder, g["frames"], g["masks"]) - mean) / std
        return Groups(tokens, g["actions"], g["frames"], g["masks"])

    world = World(
        train_tokens=(raw - mean) / std,
        train_actions=actions,
        train_frames=frames,
        train_masks=masks,
        demo_tokens=(encode(encoder, demo_frames, demo_masks) - mean) / std,
        demo_actions=demo_actions,
        demo_frames=demo_frames,
        demo_masks=demo_masks,
        val=groups(val),
        test=groups(test),
        token_mean=mean,
        token_std=std,
        encoder_pretrain_loss=(losses[0], losses[-1]),
    )
    return world, encoder


# ---------------------------------------------------------------------- real episodes


def read_episodes(h) -> list[Episode]:
    """The episodes of ``data_dir`` in the chosen format, resized to the encoder's input."""
    if h.source == "trajectories":
        return [
            read_trajectory_dir(p, h.camera, size=h.image_size)
            for p in list_trajectories(h.data_dir)
        ]
    episodes = read_robomimic(h.data_dir, h.camera)
    for episode in episodes:
        episode.frames, episode.masks = resize(episode.frames, episode.masks, h.image_size)
    return episodes


def build_real_world(h) -> tuple[World, torch.nn.Module]:
    """Paper scale: a pretrained encoder (required) on real episodes; 80/10/10 episode split.

    A held-out episode is one group with one outcome, its first ``chunks`` chunks."""
    if h.encoder_path is None:
        raise DataFormatError(
            "Real episodes need the pretrained encoder: set --data.encoder_path to a local "
            "DINOv2/DINOv3 folder (config.json + model.safetensors)."
        )
    encoder = vit.freeze(vit.build_encoder(pretrained=h.encoder_path))
    vit.encoder_input_size(encoder.config, size=h.image_size)
    episodes = read_episodes(h)
    length = h.chunks * h.horizon
    short = [e.name for e in episodes if len(e.frames) < length + 1]
    if short:
        raise DataFormatError(
            f"{len(short)} episodes (e.g. {short[0]}) have fewer than chunks x horizon + 1 = "
            f"{length + 1} frames; lower --data.chunks or --data.horizon"
        )
    order = np.random.default_rng(h.seed).permutation(len(episodes))
    n_val = n_test = max(1, len(episodes) // 10)
    if len(episodes) < n_val + n_test + 1:
        raise DataFormatError(f"{h.data_dir} holds {len(episodes)} episodes; need at least 3")
    held = {"val": order[:n_val], "test": order[n_val : n_val + n_test]}
    train = [episodes[i] for i in order[n_val + n_test :]]
    clip = min(len(e.frames) for e in train)  # episodes differ in length: train on equal clips
    frames = torch.from_numpy(np.stack([e.frames[:clip] for e in train]))
    masks = torch.from_numpy(np.stack([e.masks[:clip] for e in train]))
    actions = torch.from_numpy(np.stack([e.actions[: clip - 1] for e in train])).float()
    raw = encode(encoder, frames, masks)
    mean, std = raw.mean((0, 1, 2)), raw.std((0, 1, 2)).clamp_min(1e-6)

    def groups(index) -> Groups:
        keep = slice(0, length + 1, h.horizon)
        f = torch.from_numpy(np.stack([episodes[i].frames[keep] for i in index]))[:, None]
        m = torch.from_numpy(np.stack([episodes[i].masks[keep] for i in index]))[:, None]
        a = torch.from_numpy(np.stack([episodes[i].actions[:length] for i in index])).float()
        tokens = (encode(encoder, f, m) - mean) / std
        return Groups(tokens, a.view(len(index), h.chunks, h.horizon, -1), f, m)

    world = World(
        train_tokens=(raw - mean) / std,
        train_actions=actions,
        train_frames=frames,
        train_masks=masks,
        demo_tokens=(raw[:0] - mean) / std,
        demo_actions=actions[:0],
        demo_frames=frames[:0],
        demo_masks=masks[:0],
        val=groups(held["val"]),
        test=groups(held["test"]),
        token_mean=mean,
        token_std=std,
        encoder_pretrain_loss=(float("nan"), float("nan")),
    )
    return world, encoder
