"""The synthetic-embedding world: a known injective map of state and nuisance (design note [G]).

A point with state s = (x, y) moves in the box [-1, 1]^2 by s' = clip(s + DT a) under 2-d
actions (first order: the frame shows the whole state, so the aligned subspace can hold all of it
and the planning cost on it compares positions only); a per-episode
nuisance c_t in R^{16} (slow sinusoids with random amplitude, frequency and phase, scaled by the
strength kappa) stands for everything in a frame the agent does not control. The "foundation
embedding" is e_t = phi([s_t ; c_t]) in R^{384}, phi a fixed random 3-layer leaky-ReLU MLP whose
layers widen (18 -> 128 -> 256 -> 384) with full-column-rank weights, so phi is injective: the
premise of the identifiability statement (the abstract's "identify the task-centric latent
factors up to a simple transformation"). Because s and c are known, the aligned subspace can be
scored exactly: linear R^2 / MCC against s, and R^2 against c, which it must ignore.

The world has the same interface as the rendered scenes (``tcwm.scene``), with ``observe``
returning the embedding instead of a frame, so data generation and planning share their code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

STATE_DIM = 2
ACTION_DIM = 2
NUISANCE_DIM = 16
EMBED_DIM = 384
DT = 0.1  # x' = x + DT a
SUCCESS_RADIUS = 0.1
WIDTHS = (STATE_DIM + NUISANCE_DIM, 128, 256, EMBED_DIM)
WORLD_VERSION = 2  # part of the data cache's key: bump it when the world changes
MAP_SEED = 1234  # phi is part of the world, the same for every run seed


@dataclass(frozen=True)
class Nuisance:
    """One episode's task-irrelevant signal: c_t = kappa * amplitude * sin(frequency t + phase)."""

    amplitude: np.ndarray
    frequency: np.ndarray
    phase: np.ndarray
    kappa: float

    def at(self, t: int) -> np.ndarray:
        return (self.kappa * self.amplitude * np.sin(self.frequency * t + self.phase)).astype(
            np.float32
        )


def embedding_map(seed: int = MAP_SEED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """phi's weights: widening layers with full column rank (checked), leaky ReLU between."""
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        weight = torch.randn(fan_out, fan_in, generator=generator) / fan_in**0.5
        assert torch.linalg.matrix_rank(weight) == fan_in  # injective linear part
        layers.append((weight, 0.1 * torch.randn(fan_out, generator=generator)))
    return layers


_PHI = embedding_map()


def phi(state: np.ndarray, nuisance: np.ndarray) -> np.ndarray:
    """e = phi([s ; c]): float [..., 2], [..., 16] -> float32 [..., 384]."""
    h = torch.as_tensor(np.concatenate([state, nuisance], -1), dtype=torch.float32)
    for i, (weight, bias) in enumerate(_PHI):
        h = h @ weight.T + bias
        if i < len(_PHI) - 1:
            h = torch.nn.functional.leaky_relu(h, 0.2)  # strictly monotone: keeps phi injective
    return h.numpy()


class SyntheticWorld:
    """First-order point dynamics in a box; ``observe`` gives the embedding phi([s ; c_t])."""

    name = "synthetic"
    state_dim = STATE_DIM
    action_dim = ACTION_DIM

    def __init__(self) -> None:
        self.state = np.zeros(STATE_DIM, np.float32)

    def set_state(self, state: np.ndarray) -> None:
        self.state = np.asarray(state, np.float32).copy()

    def get_state(self) -> np.ndarray:
        return self.state.copy()

    def step(self, action: np.ndarray) -> np.ndarray:
        action = np.asarray(action, np.float32)
        if action.shape != (ACTION_DIM,):
            raise ValueError(f"expected an action of shape ({ACTION_DIM},), got {action.shape}")
        action = np.clip(action, -1.0, 1.0)
        self.state = np.clip(self.state + DT * action, -1.0, 1.0).astype(np.float32)
        return self.get_state()

    def observe(self, nuisance: Nuisance, t: int) -> np.ndarray:
        """The embedding of the current state under ``nuisance`` at step t: float32 [1, 384]."""
        return phi(self.state, nuisance.at(t))[None]

    @staticmethod
    def position(state: np.ndarray) -> np.ndarray:
        return np.asarray(state)[..., :2]

    def success(self, state: np.ndarray, goal: np.ndarray) -> bool:
        return bool(np.linalg.norm(self.position(state) - self.position(goal)) < SUCCESS_RADIUS)

    @staticmethod
    def sample_start(rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-0.9, 0.9, STATE_DIM).astype(np.float32)

    @staticmethod
    def draw_nuisance(rng: np.random.Generator, kappa: float) -> Nuisance:
        if not 0.0 <= kappa <= 1.0:
            raise ValueError(f"the distractor strength kappa must lie in [0, 1], got {kappa}")
        return Nuisance(
            amplitude=rng.uniform(0.5, 1.5, NUISANCE_DIM),
            frequency=rng.uniform(0.02, 0.2, NUISANCE_DIM),
            phase=rng.uniform(0, 2 * np.pi, NUISANCE_DIM),
            kappa=float(kappa),
        )

    def close(self) -> None:
        pass
