import numpy as np
import pytest
import torch

from dual_dgo.evaluation import (
    accuracy_by_difficulty,
    fast_rate_by_difficulty,
    gain_at_matched_tokens,
    matched_correctness,
    ridge_probe_r2,
)
from dual_dgo.model import chosen, summary_metrics


def arrays(p_fast, fast_correct, slow_correct, fast_tokens=4.0, slow_tokens=10.0, difficulty=None):
    n = len(p_fast)
    return {
        "p_fast": np.array(p_fast, float),
        "fast_correct": np.array(fast_correct, float),
        "slow_correct": np.array(slow_correct, float),
        "fast_tokens": np.full(n, fast_tokens),
        "slow_tokens": np.full(n, slow_tokens),
        "difficulty": np.arange(1, n + 1, dtype=float)
        if difficulty is None
        else np.array(difficulty, float),
    }


def test_chosen_takes_the_more_probable_mode_or_an_exact_mixture():
    a = arrays([0.9, 0.2], [1, 0], [0, 1])
    picked = chosen(a)
    assert picked["correct"].tolist() == [1, 1] and picked["tokens"].tolist() == [4, 10]
    mixed = chosen(a, np.array([0.25, 0.5]))
    assert mixed["correct"].tolist() == [0.75, 0.5] and mixed["tokens"].tolist() == [5.5, 7.0]


def test_matched_correctness_switches_a_random_share_to_reach_the_target_tokens():
    always_slow = arrays([0.1] * 4, [1, 1, 0, 0], [1, 1, 1, 1])  # 10 tokens, accuracy 1
    # target 7 tokens: half of the prompts switched to fast (6 tokens saved each): 1 - 0.5 * 0.5
    matched = matched_correctness(always_slow, 7.0)
    np.testing.assert_allclose(matched, [1, 1, 0.5, 0.5])
    assert matched.mean() == pytest.approx(0.75)
    always_fast = arrays([0.9] * 4, [1, 0, 0, 0], [1, 1, 1, 0])
    np.testing.assert_allclose(matched_correctness(always_fast, 5.5), [1, 0.25, 0.25, 0])
    # out of reach: everything switched
    np.testing.assert_allclose(matched_correctness(always_fast, 50.0), [1, 1, 1, 0])
    # at its own tokens nothing changes
    np.testing.assert_allclose(matched_correctness(always_fast, 4.0), [1, 0, 0, 0])


def test_gain_at_matched_tokens_rewards_routing_by_difficulty():
    # fast is right on the easy half only; slow is always right
    easy_fast = [1, 1, 0, 0]
    router = arrays(
        [0.9, 0.9, 0.1, 0.1], easy_fast, [1, 1, 1, 1]
    )  # fast on the easy half: acc 1, 7 tokens
    always_slow = arrays([0.1] * 4, easy_fast, [1, 1, 1, 1])
    gain = gain_at_matched_tokens(router, always_slow)
    assert gain.mean() == pytest.approx(1 - 0.75)
    # a random router at the same tokens gains nothing over the blind switch
    blind = arrays([0.9, 0.1, 0.9, 0.1], easy_fast, [1, 1, 1, 1])
    assert gain_at_matched_tokens(blind, always_slow).mean() == pytest.approx(0.0)
    # routing rules can be given as P(slow)
    oracle = gain_at_matched_tokens(always_slow, always_slow, p_slow=np.array([0, 0, 1, 1.0]))
    assert oracle.mean() == pytest.approx(0.25)


def test_ridge_probe_r2_is_one_for_a_linear_signal_and_low_for_noise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g, dtype=torch.float64)
    y = (x @ torch.tensor([1.0, -2.0, 0, 0, 0.5], dtype=torch.float64) + 3).numpy()
    assert ridge_probe_r2(x[:150], y[:150], x[150:], y[150:], l2=1e-6) == pytest.approx(
        1.0, abs=1e-6
    )
    noise = torch.randn(200, 5, generator=g, dtype=torch.float64)
    assert ridge_probe_r2(noise[:150], y[:150], noise[150:], y[150:]) < 0.2


def test_summary_metrics_by_hand():
    a = arrays([0.9, 0.2, 0.6], [1, 0, 1], [0, 1, 1], difficulty=[1, 3, 2])
    s = summary_metrics(a, length_cost=0.5, max_length=10)
    assert s["fast_rate"] == pytest.approx((0.9 + 0.2 + 0.6) / 3)
    assert s["accuracy"] == pytest.approx(1.0) and s["tokens"] == pytest.approx(6.0)
    assert s["reward"] == pytest.approx(1 - 0.5 * 0.6)
    assert s["slow_rank_correlation"] == pytest.approx(1.0)  # P(slow) 0.1, 0.4, 0.8 for k 1, 2, 3
    assert s["fast_accuracy"] == pytest.approx(2 / 3) and s["slow_accuracy"] == pytest.approx(2 / 3)


def test_accuracy_and_fast_rate_by_difficulty():
    a = arrays([0.9, 0.5, 0.1], [1, 0, 0], [0, 1, 1], difficulty=[1, 1, 3])
    assert accuracy_by_difficulty(a, "fast", [1]) == pytest.approx(0.5)
    assert accuracy_by_difficulty(a, "slow", [3]) == pytest.approx(1.0)
    rates = fast_rate_by_difficulty(a, 3)
    assert rates[0] == pytest.approx(0.7) and np.isnan(rates[1]) and rates[2] == pytest.approx(0.1)


def test_matched_correctness_with_mixed_choices_and_both_clamps():
    # greedy: slow on prompts 0 and 1, fast on 2 and 3; 6 tokens saved per switch
    mixed = arrays([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 0], [1, 1, 1, 1])
    # own tokens 7; target 8.5: half of the fast-chosen prompts switched to slow
    np.testing.assert_allclose(matched_correctness(mixed, 8.5), [1, 1, 1, 0.5])
    # target 5.5: half of the slow-chosen prompts switched to fast
    np.testing.assert_allclose(matched_correctness(mixed, 5.5), [0.5, 1, 1, 0])
    # below the forced-fast cost: every slow choice switched (the share is clamped at 1)
    np.testing.assert_allclose(matched_correctness(mixed, 1.0), [0, 1, 1, 0])
    # forced modes of equal cost: nothing to trade, every prompt goes to the cheaper side's mode
    flat = arrays([0.1, 0.9], [0, 1], [1, 0], fast_tokens=5.0, slow_tokens=5.0)
    np.testing.assert_allclose(matched_correctness(flat, 4.0), [0, 1])  # all fast
    np.testing.assert_allclose(matched_correctness(flat, 6.0), [1, 0])  # all slow


def test_ridge_probe_r2_by_hand_and_an_unpenalised_intercept():
    g = np.random.default_rng(1)
    x, y = g.normal(size=(40, 3)), g.normal(size=40)
    xt, yt = g.normal(size=(20, 3)), g.normal(size=20)
    design = np.hstack([x, np.ones((40, 1))])
    penalty = 2.0 * np.eye(4)
    penalty[-1, -1] = 0.0
    w = np.linalg.solve(design.T @ design + penalty, design.T @ y)
    prediction = np.hstack([xt, np.ones((20, 1))]) @ w
    expected = 1 - ((yt - prediction) ** 2).sum() / ((yt - yt.mean()) ** 2).sum()
    got = ridge_probe_r2(torch.from_numpy(x), y, torch.from_numpy(xt), yt, l2=2.0)
    assert got == pytest.approx(expected, rel=1e-10)
    # a huge penalty leaves the intercept alone: the probe predicts the training mean
    flat = 1 - ((yt - y.mean()) ** 2).sum() / ((yt - yt.mean()) ** 2).sum()
    huge = ridge_probe_r2(torch.from_numpy(x), y + 5, torch.from_numpy(xt), yt + 5, l2=1e12)
    assert huge == pytest.approx(flat, abs=1e-6)
    assert ridge_probe_r2(torch.from_numpy(x), y, torch.from_numpy(xt), yt) == pytest.approx(
        ridge_probe_r2(torch.from_numpy(x), y, torch.from_numpy(xt), yt, l2=1.0)
    )


def test_fast_rate_by_difficulty_has_one_entry_per_level():
    a = arrays([0.9, 0.5], [1, 0], [0, 1], difficulty=[2, 2])
    rates = fast_rate_by_difficulty(a, 4)
    assert len(rates) == 4 and rates[1] == pytest.approx(0.7)
    assert np.isnan(rates[0]) and np.isnan(rates[2]) and np.isnan(rates[3])


def test_matched_correctness_with_a_one_token_spread():
    # slow costs one token more: switching half of the slow choices saves a quarter token
    a = arrays([0.1, 0.1, 0.9, 0.9], [0, 0, 1, 1], [1, 1, 1, 1], fast_tokens=4.0, slow_tokens=5.0)
    np.testing.assert_allclose(matched_correctness(a, 4.25), [0.5, 0.5, 1, 1])
    np.testing.assert_allclose(matched_correctness(a, 4.75), [1, 1, 1, 1])
