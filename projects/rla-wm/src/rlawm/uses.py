"""The two robot-learning uses of a feature world model, judged in the simulator.

- The world action model (WAM): a chunk policy whose shared trunk over x_t feeds an RLA head,
  trained on every demonstration video (no actions needed: its target is the frozen RLA
  encoder's latent of (x_t, x_{t+h})), and an action head that reads the trunk and the latent,
  trained on a small action-labelled share with the true latent and run with the predicted one.
  Against it: behaviour cloning (the same trunk and action head, no latent) on that share alone.
- Visual RL inside a world model from offline videos: a chunk policy optimised by gradients
  through imagined rollouts of a frozen world model (RLA-WM's Euler sampler with fixed noise, or
  the regression model), starting from demonstration frames, with a video-aligned reward: minus
  the feature L1 between the imagined tokens and the demonstration's tokens at the matched step.
  No handcrafted reward and no simulator interaction during training (reconstructed: the paper
  names the reward's kind, not this optimiser).

``evaluate_in_simulator`` runs any chunk policy from seeded starts in the MuJoCo scene: it
renders and encodes a frame at each chunk boundary, executes the chunk, and counts a success
when the box reaches the goal patch at any step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def mlp(inputs: int, width: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, width),
        nn.GELU(),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, outputs),
    )


class ChunkPolicy(nn.Module):
    """x_t tokens [B, L, C] -> an action chunk [B, h, A] in [-1, 1].

    With ``latent_shape`` it is the WAM: ``rla_head`` predicts the (standardised) RLA from the
    trunk, and the action head reads [trunk ; RLA]."""

    def __init__(
        self,
        tokens: int,
        token_dim: int,
        horizon: int,
        action_dim: int,
        width: int = 128,
        latent_shape: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.chunk_shape = (horizon, action_dim)
        self.latent_shape = latent_shape
        latent = 0 if latent_shape is None else latent_shape[0] * latent_shape[1]
        self.trunk = nn.Sequential(nn.Flatten(1), nn.Linear(tokens * token_dim, width), nn.GELU())
        self.action_head = mlp(width + latent, width, horizon * action_dim)
        self.rla_head = mlp(width, width, latent) if latent_shape is not None else None

    def predict_rla(self, x_t: torch.Tensor) -> torch.Tensor:
        return self.rla_head(self.trunk(x_t)).view(-1, *self.latent_shape)

    def forward(self, x_t: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        h = self.trunk(x_t)
        if self.rla_head is not None:
            z = self.rla_head(h) if z is None else z.flatten(1)
            h = torch.cat([h, z], dim=-1)
        return torch.tanh(self.action_head(h)).view(-1, *self.chunk_shape)


def train_chunk_policy(
    policy: ChunkPolicy,
    labelled: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    steps: int,
    lr: float,
    seed: int,
    rla: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    videos: tuple[torch.Tensor, torch.Tensor] | None = None,
    batch_size: int = 64,
) -> list[float]:
    """BC (``rla`` None) or the WAM: MSE on the labelled chunks (the WAM's action head fed the
    true RLA ``rla(x_t, x_next)``) plus, for the WAM, MSE of the RLA head on ``videos`` pairs
    (x_t, x_next) of every demonstration. Returns the loss per step."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    x_t, x_next, chunks = labelled
    losses = []
    for _ in range(steps):
        index = torch.randint(len(x_t), (batch_size,), generator=generator)
        if rla is None:
            loss = F.mse_loss(policy(x_t[index]), chunks[index])
        else:
            with torch.no_grad():
                z = rla(x_t[index], x_next[index])
            loss = F.mse_loss(policy(x_t[index], z), chunks[index])
            video_index = torch.randint(len(videos[0]), (batch_size,), generator=generator)
            v_t, v_next = videos[0][video_index], videos[1][video_index]
            with torch.no_grad():
                target = rla(v_t, v_next)
            loss = loss + F.mse_loss(policy.predict_rla(v_t), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def video_aligned_reward(imagined: torch.Tensor, demo: torch.Tensor) -> torch.Tensor:
    """The reward of one imagined chunk: minus the mean feature L1 to the demonstration's tokens
    at the matched step, per item: [B, L, C] x [B, L, C] -> [B]."""
    return -(imagined - demo).abs().mean(dim=(1, 2))


def train_policy_in_model(
    policy: ChunkPolicy,
    step: Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor],
    demo_tokens: torch.Tensor,
    horizon: int,
    chunks: int,
    steps: int,
    lr: float,
    seed: int,
    batch_size: int = 32,
) -> list[float]:
    """Maximise the summed video-aligned reward of ``chunks``-chunk imagined rollouts from
    demonstration frames at random chunk boundaries, by backpropagation through the frozen
    world model ``step(x, chunk, generator) -> x_next`` (differentiable). Returns the mean
    reward per step."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    boundaries = (demo_tokens.shape[1] - 1) // horizon  # chunk boundaries of one demonstration
    if boundaries < chunks:
        raise ValueError(f"demonstrations hold {boundaries} chunks, fewer than {chunks}")
    rewards = []
    for _ in range(steps):
        demo = torch.randint(len(demo_tokens), (batch_size,), generator=generator)
        first = torch.randint(boundaries - chunks + 1, (batch_size,), generator=generator)
        x = demo_tokens[demo, first * horizon]
        reward = torch.zeros(batch_size)
        for k in range(1, chunks + 1):
            x = step(x, policy(x), generator)
            reward = reward + video_aligned_reward(x, demo_tokens[demo, (first + k) * horizon])
        loss = -reward.mean() / chunks
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rewards.append(-loss.item())
    return rewards


def rla_wm_step(module, sample_steps: int):
    """RLA-WM as a differentiable one-chunk model (Euler sampling with the given noise)."""

    def step(x, chunk, generator):
        z = module.net.sample(x, chunk, sample_steps, generator)
        return module.decode_standardised(x, z)

    return step


def regression_step(module):
    return lambda x, chunk, generator: module.net(x, chunk)


def evaluation_starts(count: int, seed: int):
    """Seeded (start, hidden setting) pairs shared by every policy of a seed."""
    from rlawm.scene import draw_hidden, draw_start

    rng = np.random.default_rng(10_000 + seed)
    return [(draw_start(rng), draw_hidden(rng)) for _ in range(count)]


@torch.no_grad()
def evaluate_in_simulator(
    act: Callable[[torch.Tensor], torch.Tensor],
    tokens_of: Callable[[np.ndarray, np.ndarray], torch.Tensor],
    starts,
    chunks: int,
    horizon: int,
    image_size: int = 64,
) -> np.ndarray:
    """Success (0/1) per start: ``act(x [1, L, C]) -> chunk [1, h, A]`` at each of ``chunks``
    chunk boundaries; ``tokens_of(frame, mask)`` encodes and standardises a rendered frame."""
    from rlawm.scene import PushScene

    scene = PushScene(image_size)
    successes = []
    try:
        for (pusher, box), hidden in starts:
            scene.reset(pusher, box, hidden)
            reached = False
            for _ in range(chunks):
                frame, mask = scene.render()
                chunk = act(tokens_of(frame, mask))[0].numpy()
                for action in chunk:
                    scene.step(action)
                    reached = reached or scene.success()
                if reached:
                    break
            successes.append(float(reached))
    finally:
        scene.close()
    return np.asarray(successes)


def random_policy(horizon: int, action_dim: int, seed: int):
    generator = torch.Generator().manual_seed(20_000 + seed)
    return lambda x: torch.rand((1, horizon, action_dim), generator=generator) * 2 - 1


def parameter_change(trained: nn.Module, initial: dict[str, torch.Tensor]) -> float:
    """||theta - theta_0|| / ||theta_0||: how far training moved a policy."""
    a = torch.cat([v.flatten() for v in initial.values()])
    b = torch.cat([v.detach().flatten() for v in trained.state_dict().values()])
    return ((b - a).norm() / a.norm()).item()
