"""Data: reward-free offline trajectories as frozen embeddings, states and actions.

Sources (``--data.source``):

- ``synthetic``: the synthetic-embedding world (``tcwm.synthetic``): embeddings phi([s ; c]) of
  a known injective map, so identifiability is measurable exactly;
- ``pointmaze`` / ``reacher``: the miniature's MuJoCo scenes (``tcwm.scene``) rendered at 64x64
  with distractors of strength ``kappa``, random-action episodes as in DINO-WM, written once in
  DINO-WM's folder layout and read back through the same loader as real data, then encoded by
  the frozen stand-in encoder (a tiny ``Dinov2Model``, self-supervised on frames of separate
  episodes, then frozen: a stand-in for DINOv2, not DINO);
- ``dino_wm``: a DINO-WM PointMaze folder (``root``: ``obses/``, ``states.pth``, ...);
- ``robomimic``: a robomimic HDF5 file (``root``), images from ``image_key``, the state to
  align from the obs keys ``state_variables``;
- ``minari``: a Minari dataset (``root``); it holds no images, so its states are rendered by the
  miniature's PointMaze scene (the same point agent and U-maze; label it).

Real frames are encoded by the encoder in ``encoder_checkpoint`` (a local DINOv2 folder, e.g.
``facebook/dinov2-small`` saved with ``save_pretrained``); without one, the stand-in is
pretrained on the data's own held-out episodes. Token grids are average-pooled to
``token_grid`` x ``token_grid`` (the same for every model). Every array is cached by its config.

Items are windows of ``history + 1`` frames: the model sees frames t-h+1..t and action a_t and
predicts frame t+1; the state aligned by TC-WM is ``align_on`` (the agent's position, what a
single frame shows, or the whole state).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import ClosedUnitInterval, NonNegativeInt, OpenUnitInterval, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_data import EpochShuffle, cached_generate, drawn_by_trainer, seeded_split
from papers_gpu import run_seed
from tcwm.formats import DataFormatError  # noqa: F401  (re-exported: the data's error type)
from tcwm.synthetic import WORLD_VERSION, SyntheticWorld

# robomimic's camera observations (obs/<camera>_image)
RobomimicImage = Literal[
    "agentview_image",
    "robot0_eye_in_hand_image",
    "sideview_image",
    "frontview_image",
    "birdview_image",
]
Source = Literal["synthetic", "pointmaze", "reacher", "dino_wm", "robomimic", "minari"]


def world_for(h):
    """The simulator of a miniature source with an ``observe`` that gives the frozen tokens
    (planning runs in it); real datasets have none."""
    if h.source == "synthetic":
        return SyntheticWorld()
    if h.source in ("pointmaze", "reacher"):
        from tcwm.pipeline import RenderedWorld, load_encoder

        return RenderedWorld(h.source, load_encoder(h), h.token_grid)
    raise ConfigError(f"data.source={h.source!r} has no simulator: planning needs a miniature")


def random_episodes(world, n_episodes: int, length: int, kappa: float, seed: int) -> dict:
    """Random-action episodes of a world (uniform actions in [-1, 1], as DINO-WM's data): the
    observations (embeddings or frames), states, actions and, for the synthetic world, the
    nuisance c_t. One nuisance draw per episode."""
    rng = np.random.default_rng(seed)
    observations, states, actions, nuisances = [], [], [], []
    for _ in range(n_episodes):
        world.set_state(world.sample_start(rng))
        nuisance = world.draw_nuisance(rng, kappa)
        episode_obs, episode_states, episode_actions, episode_c = [], [], [], []
        for t in range(length):
            episode_obs.append(world.observe(nuisance, t))
            episode_states.append(world.get_state())
            action = rng.uniform(-1, 1, world.action_dim).astype(np.float32)
            episode_actions.append(action)
            if hasattr(nuisance, "at"):
                episode_c.append(nuisance.at(t))
            world.step(action)
        observations.append(np.stack(episode_obs))
        states.append(np.stack(episode_states))
        actions.append(np.stack(episode_actions))
        nuisances.append(np.stack(episode_c) if episode_c else np.zeros((length, 0), np.float32))
    return {
        "observations": np.stack(observations),
        "states": np.stack(states).astype(np.float32),
        "actions": np.stack(actions).astype(np.float32),
        "nuisance": np.stack(nuisances).astype(np.float32),
    }


class Windows(Dataset):
    """Windows of ``length`` consecutive steps of the episodes ``episodes`` (indices into the
    arrays), starting where a full window fits."""

    def __init__(self, arrays: dict, episodes: np.ndarray, length: int) -> None:
        self.arrays, self.length = arrays, length
        steps = arrays["tokens"].shape[1]
        if steps < length:
            raise ConfigError(f"episodes of {steps} steps are shorter than a window of {length}")
        starts = np.arange(steps - length + 1)
        self.index = np.array([(e, s) for e in episodes for s in starts], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        episode, start = self.index[i]
        window = slice(start, start + self.length)
        return {key: value[episode, window] for key, value in self.arrays.items()}


class TcwmDataModule(LightningDataModule):
    """Episodes split by episode into train / validation / test; batches are windows.

    ``seed`` fixes the episodes, the split and the stand-in encoder; by default it is the run's
    ``seed_everything``, so one seed changes data, initialisation and noise together.
    """

    def __init__(
        self,
        source: Source = "synthetic",
        root: str | None = None,
        kappa: ClosedUnitInterval = 1.0,
        n_episodes: PositiveInt = 120,
        episode_length: PositiveInt = 40,
        val_fraction: OpenUnitInterval = 0.15,
        test_fraction: OpenUnitInterval = 0.15,
        history: PositiveInt = 1,
        align_on: Literal["position", "state"] = "state",
        token_grid: PositiveInt = 4,
        encoder_checkpoint: str | None = None,
        encoder_steps: NonNegativeInt = 300,
        image_key: RobomimicImage = "agentview_image",
        state_variables: list[str] | None = None,
        batch_size: PositiveInt = 128,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= kappa <= 1.0:
            raise ConfigError(f"data.kappa (distractor strength) must lie in [0, 1], got {kappa}")
        if val_fraction <= 0 or test_fraction <= 0 or val_fraction + test_fraction >= 1:
            raise ConfigError("val_fraction and test_fraction must be positive and sum below 1")
        self.save_hyperparameters()
        self.arrays: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ sizes the model links
    @property
    def embed_dim(self) -> int:
        return self._load()["tokens"].shape[-1]

    @property
    def n_tokens(self) -> int:
        return self._load()["tokens"].shape[-2]

    @property
    def state_dim(self) -> int:
        return self._load()["states"].shape[-1]

    @property
    def align_dim(self) -> int:
        return self._load()["aligned"].shape[-1]

    @property
    def action_dim(self) -> int:
        return self._load()["actions"].shape[-1]

    # ------------------------------------------------------------------ loading
    def _load(self) -> dict[str, torch.Tensor]:
        if self.arrays is None:
            h = self.hparams
            self.seed = run_seed() if h.seed is None else h.seed
            arrays = load_arrays(h, self.seed)
            tokens = torch.from_numpy(arrays["tokens"])
            states = torch.from_numpy(arrays["states"])
            world_position = arrays.get("positions")
            aligned = states if h.align_on == "state" else torch.from_numpy(world_position)
            self.arrays = {
                "tokens": tokens,
                "states": states,
                "aligned": aligned,
                "positions": torch.from_numpy(world_position),
                "actions": torch.from_numpy(arrays["actions"]),
                "nuisance": torch.from_numpy(arrays["nuisance"]),
            }
        return self.arrays

    def setup(self, stage: str | None = None) -> None:
        arrays = self._load()
        h = self.hparams
        n = arrays["tokens"].shape[0]
        val, test = seeded_split(n, [h.val_fraction, h.test_fraction], self.seed + 1)
        train = np.setdiff1d(np.arange(n), np.concatenate([val, test]))
        if min(len(train), len(val), len(test)) == 0:
            raise ConfigError(f"{n} episodes are too few for train/val/test splits")
        self.episodes = {"train": train, "val": val, "test": test}
        length = h.history + 1
        self.train_set = Windows(arrays, train, length)
        self.val_set = Windows(arrays, val, length)
        self.test_set = Windows(arrays, test, length)

    def train_dataloader(self) -> DataLoader:
        n = len(self.train_set)
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, self.hparams.batch_size))
        return self._loader(self.train_set, sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def _loader(self, dataset: Dataset, sampler=None) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
        )


def load_arrays(h, seed: int) -> dict[str, np.ndarray]:
    """tokens float32 [N, T, P, D], states [N, T, S], positions [N, T, 2], actions [N, T, A],
    nuisance [N, T, C] (empty C outside the synthetic world)."""
    if h.source == "synthetic":
        config = {
            "source": "synthetic",
            "world": WORLD_VERSION,
            "n": h.n_episodes,
            "T": h.episode_length,
            "kappa": h.kappa,
            "seed": seed,
        }

        def generate():
            world = SyntheticWorld()
            data = random_episodes(world, h.n_episodes, h.episode_length, h.kappa, seed)
            data["tokens"] = data.pop("observations")
            data["positions"] = world.position(data["states"])
            return data

        return cached_generate("tc-wm", config, generate)
    from tcwm.pipeline import load_visual_arrays

    return load_visual_arrays(h, seed)


def check_goal_tokens(goal: torch.Tensor, tokens_shape) -> None:
    """A goal's tokens must have the frames' token count and width."""
    if tuple(goal.shape[-2:]) != tuple(tokens_shape[-2:]):
        raise DataFormatError(
            f"the goal's embedding has shape {tuple(goal.shape[-2:])}, the frames' "
            f"{tuple(tokens_shape[-2:])}: render the goal image like the observations"
        )
