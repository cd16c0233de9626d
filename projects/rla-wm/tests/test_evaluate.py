"""The claim's oracle (resampled true outcomes) and the RLA ceiling (decoder + true RLA), by
value on hand-made groups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlawm.evaluate import ceiling_rollouts, resampled_truth, score_rollouts


def groups(g=3, m=4, k=3, tokens=2, channels=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return SimpleNamespace(tokens=torch.randn(g, m, k + 1, tokens, channels, generator=generator))


def test_the_oracle_draws_whole_true_trajectories_of_its_own_group():
    world = groups()
    draws = resampled_truth(world, 64, torch.Generator().manual_seed(1))
    assert draws.shape == (3, 64, 3, 2, 2)
    truth = world.tokens[:, :, 1:]  # [G, M, K, L, C]
    for group in range(3):
        # every draw is one of its group's M outcomes, all chunks of the same outcome
        match = (draws[group][:, None] == truth[group][None]).flatten(2).all(-1)  # [S, M]
        assert match.sum(1).eq(1).all()
        assert match.any(0).all()  # 64 draws from 4 outcomes: each one appears
    again = resampled_truth(world, 64, torch.Generator().manual_seed(1))
    assert torch.equal(draws, again)


def test_the_resampled_truth_scores_near_the_truth_and_keeps_its_spread():
    world = groups(g=16, tokens=4, channels=3)
    scores = score_rollouts(resampled_truth(world, 8, torch.Generator().manual_seed(0)),
                            world.tokens[:, :, 1:], 0.05)  # fmt: skip
    copies = world.tokens[:, :1, :1].expand(-1, 1, 3, -1, -1)
    persistence = score_rollouts(copies, world.tokens[:, :, 1:], 0.05)
    assert scores["energy_distance"].mean() < 0.3 * persistence["energy_distance"].mean()
    assert abs(torch.log(scores["collapse_ratio"]).mean()) < 0.25


class HalfStepDecoder:
    """encode = the true residual, decode = x + share * z: applies ``share`` of the change."""

    def __init__(self, share: float):
        self.share = share
        self.rla = SimpleNamespace(
            encode=lambda x_t, x_next: (x_next - x_t, None),
            decode=lambda x, z: x + self.share * z,
        )


def test_the_ceiling_rolled_out_and_teacher_forced_by_value():
    world = groups(g=2, m=3, k=3)
    truth = world.tokens  # [G, M, K+1, L, C]
    exact = ceiling_rollouts(HalfStepDecoder(1.0), world)
    torch.testing.assert_close(exact, truth[:, :, 1:])  # a perfect decoder is the truth
    forced = ceiling_rollouts(HalfStepDecoder(0.5), world, teacher_forced=True)
    torch.testing.assert_close(forced, 0.5 * (truth[:, :, :-1] + truth[:, :, 1:]))
    rolled = ceiling_rollouts(HalfStepDecoder(0.5), world)
    # rolled out, chunk k starts from the previous prediction: x_hat_k = x_hat_{k-1} + d_k / 2
    steps = 0.5 * (truth[:, :, 1:] - truth[:, :, :-1])
    torch.testing.assert_close(rolled, truth[:, :, :1] + steps.cumsum(dim=2))


def test_score_rollouts_by_hand_counts():
    """One token of one channel, K = 2 chunks, S = 3 samples, M = 2 outcomes per group."""
    from rlawm import core

    truth = torch.tensor(
        [
            [[0.0, 2.0], [0.0, 4.0]],  # group 0: outcomes A, B (chunks 1, 2)
            [[0.0, 1.0], [0.0, 1.5]],
        ]  # group 1: a smaller spread
    )[..., None, None]  # [G=2, M=2, K=2, L=1, C=1]
    predictions = torch.tensor(
        [[[0.0, 2.0], [1.0, 3.0], [5.0, 9.0]],
         [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]]
    )[..., None, None]  # [G=2, S=3, K=2, L=1, C=1]  # fmt: skip
    group1_spread = float(core.spread(truth[1, :, -1].flatten(1)))
    s = score_rollouts(predictions, truth, min_truth_spread=group1_spread)
    assert set(s) == {"energy_distance", "feature_l1_best", "feature_l1_mean", "collapse_ratio",
                      "pooled_collapse_ratio", "truth_spread", "prediction_spread"}  # fmt: skip
    # group 0: L1 (mean over chunks) of samples to A: 0, 1, 6; to B: 1, 1, 5
    torch.testing.assert_close(s["feature_l1_best"][0], torch.tensor(0.5))  # (0 + 1) / 2
    torch.testing.assert_close(s["feature_l1_mean"][0], torch.tensor(14 / 6))
    final_pred, final_true = predictions[:, :, -1].flatten(2), truth[:, :, -1].flatten(2)
    for g in range(2):
        torch.testing.assert_close(
            s["energy_distance"][g], core.energy_distance(final_pred[g], final_true[g])
        )
        torch.testing.assert_close(s["truth_spread"][g], core.spread(final_true[g]))
        torch.testing.assert_close(s["prediction_spread"][g], core.spread(final_pred[g]))
    # a group whose truth spread equals the bar is kept: both groups count here
    assert len(s["collapse_ratio"]) == 2
    torch.testing.assert_close(s["collapse_ratio"], s["prediction_spread"] / s["truth_spread"])
    pooled = core.pooled_collapse_ratio(final_pred, final_true, group1_spread)[0]
    torch.testing.assert_close(s["pooled_collapse_ratio"], pooled)
    # the bar at group 0's spread keeps group 0 alone, in the ratios and in the pooled ratio
    group0_spread = float(core.spread(final_true[0]))
    high = score_rollouts(predictions, truth, min_truth_spread=group0_spread)
    assert len(high["collapse_ratio"]) == 1
    torch.testing.assert_close(
        high["pooled_collapse_ratio"], core.spread(final_pred[0]) / core.spread(final_true[0])
    )
    # no multimodal group: no ratios, and the pooled ratio is NaN
    none = score_rollouts(predictions, truth, min_truth_spread=1e6)
    assert len(none["collapse_ratio"]) == 0 and torch.isnan(none["pooled_collapse_ratio"])
    # predictions and truth for different numbers of groups are refused
    with pytest.raises(ValueError):
        score_rollouts(predictions, truth[:1], min_truth_spread=0.0)
