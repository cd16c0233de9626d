"""The two robot-learning uses: the WAM and BC policies, optimisation inside a world model with
the video-aligned reward, and success counted in the simulator."""

from __future__ import annotations

import numpy as np
import torch

from rlawm.data import chunk_pairs
from rlawm.scene import Hidden
from rlawm.uses import (
    ChunkPolicy,
    evaluate_in_simulator,
    evaluation_starts,
    random_policy,
    train_chunk_policy,
    train_policy_in_model,
    video_aligned_reward,
)


def test_policies_emit_bounded_chunks_and_the_wam_reads_its_latent():
    torch.manual_seed(0)
    wam = ChunkPolicy(tokens=4, token_dim=3, horizon=2, action_dim=2, width=8, latent_shape=(2, 3))
    x = torch.randn(5, 4, 3)
    chunk = wam(x)
    assert chunk.shape == (5, 2, 2) and chunk.abs().max() <= 1
    assert wam.predict_rla(x).shape == (5, 2, 3)
    assert not torch.allclose(wam(x, torch.zeros(5, 2, 3)), wam(x, torch.ones(5, 2, 3)))
    assert ChunkPolicy(4, 3, 2, 2, width=8).rla_head is None


def test_chunk_pairs_cut_every_chunk():
    tokens = torch.arange(6.0).view(1, 6, 1, 1).expand(2, 6, 1, 1)  # token value = time step
    actions = torch.arange(5.0).view(1, 5, 1).expand(2, 5, 1)
    x_t, x_next, chunks = chunk_pairs(tokens, actions, horizon=2)
    assert len(x_t) == 2 * 4
    assert torch.equal(x_next - x_t, torch.full_like(x_t, 2.0))
    assert torch.equal(chunks[:, 0, 0], x_t[:, 0, 0])  # the chunk starts at x_t's step


def test_the_wam_learns_its_rla_head_from_videos_and_bc_fits_its_labels():
    g = torch.Generator().manual_seed(0)
    x_t, x_next = torch.randn(64, 4, 3, generator=g), torch.randn(64, 4, 3, generator=g)
    chunks = torch.tanh(x_next[:, :2, :2] - x_t[:, :2, :2])  # the action explains the motion

    def rla(a, b):
        return (b - a)[:, :2]

    torch.manual_seed(0)
    bc = ChunkPolicy(4, 3, 2, 2, width=32)
    losses = train_chunk_policy(bc, (x_t, x_next, chunks), 150, 3e-3, seed=0, batch_size=32)
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
    wam = ChunkPolicy(4, 3, 2, 2, width=32, latent_shape=(2, 3))
    losses = train_chunk_policy(
        wam, (x_t, x_next, chunks), 150, 3e-3, seed=0, rla=rla, videos=(x_t, x_next), batch_size=32
    )
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
    with torch.no_grad():  # with the true latent the action head recovers the labels
        assert (wam(x_t, rla(x_t, x_next)) - chunks).abs().mean() < (bc(x_t) - chunks).abs().mean()


def test_the_reward_is_minus_the_feature_l1_to_the_matched_step():
    imagined = torch.zeros(2, 3, 4)
    demo = torch.ones(2, 3, 4)
    demo[1] = 3.0
    assert torch.equal(video_aligned_reward(imagined, demo), torch.tensor([-1.0, -3.0]))


def test_optimising_inside_a_model_follows_the_demonstrations():
    """A point that moves by the chunk's mean action; demonstrations move by +0.5 per chunk
    (0.25 per step), so the best chunk is a mean action of 0.5."""
    tokens = 0.5 * torch.arange(9.0).view(1, 9, 1, 1).expand(8, 9, 1, 2) / 2

    def step(x, chunk, generator):
        return x + chunk.mean(dim=1, keepdim=True)

    torch.manual_seed(0)
    policy = ChunkPolicy(1, 2, 2, 2, width=16)
    rewards = train_policy_in_model(
        policy, step, tokens, horizon=2, chunks=2, steps=150, lr=1e-2, seed=0, batch_size=8
    )
    assert np.mean(rewards[-10:]) > 0.5 * np.mean(rewards[:10])  # rewards are negative: closer to 0
    with torch.no_grad():
        actions = policy(tokens[:, 0]).mean(dim=1)
    torch.testing.assert_close(actions, torch.full_like(actions, 0.5), atol=0.1, rtol=0)


def test_simulator_success_counts_a_push_into_the_goal_and_not_standing_still():
    starts = [((np.array([-0.07, 0.12]), np.array([0.0, 0.12])), Hidden(0.2, 0.1))]

    def tokens_of(frame, mask):
        assert frame.shape == (32, 32, 3) and mask.shape == (32, 32)
        return torch.zeros(1, 1, 1)

    push = evaluate_in_simulator(
        lambda x: torch.tensor([[[1.0, 0.0]] * 4]), tokens_of, starts, 3, 4, 32
    )
    still = evaluate_in_simulator(lambda x: torch.zeros(1, 4, 2), tokens_of, starts, 3, 4, 32)
    assert push.tolist() == [1.0] and still.tolist() == [0.0]


def test_evaluation_starts_and_the_random_policy_are_seeded():
    a, b = evaluation_starts(3, seed=1), evaluation_starts(3, seed=1)
    assert all(np.array_equal(x[0][1], y[0][1]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0][0][1], evaluation_starts(3, seed=2)[0][0][1])
    first, second = random_policy(4, 2, 0), random_policy(4, 2, 0)
    chunk = first(None)
    assert torch.equal(chunk, second(None)) and chunk.abs().max() <= 1
