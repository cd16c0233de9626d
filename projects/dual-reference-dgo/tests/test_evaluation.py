import numpy as np
import pytest
import torch

from dual_dgo.evaluation import (
    accuracy_by_difficulty,
    fast_rate_by_difficulty,
    gain_at_matched_tokens,
    random_switch_correctness,
    ranked_switch_p_slow,
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


def test_random_switch_correctness_switches_a_random_share_to_reach_the_target_tokens():
    always_slow = arrays([0.1] * 4, [1, 1, 0, 0], [1, 1, 1, 1])  # 10 tokens, accuracy 1
    # target 7 tokens: half of the prompts switched to fast (6 tokens saved each): 1 - 0.5 * 0.5
    matched = random_switch_correctness(always_slow, 7.0)
    np.testing.assert_allclose(matched, [1, 1, 0.5, 0.5])
    assert matched.mean() == pytest.approx(0.75)
    always_fast = arrays([0.9] * 4, [1, 0, 0, 0], [1, 1, 1, 0])
    np.testing.assert_allclose(random_switch_correctness(always_fast, 5.5), [1, 0.25, 0.25, 0])
    # out of reach: everything switched
    np.testing.assert_allclose(random_switch_correctness(always_fast, 50.0), [1, 1, 1, 0])
    # at its own tokens nothing changes
    np.testing.assert_allclose(random_switch_correctness(always_fast, 4.0), [1, 0, 0, 0])


def test_gain_at_matched_tokens_rewards_routing_by_difficulty():
    # fast is right on the easy half only; slow is always right
    easy_fast = [1, 1, 0, 0]
    router = arrays(
        [0.9, 0.9, 0.1, 0.1], easy_fast, [1, 1, 1, 1]
    )  # fast on the easy half: acc 1, 7 tokens
    always_slow = arrays([0.1] * 4, easy_fast, [1, 1, 1, 1])
    gain = gain_at_matched_tokens(router, always_slow, rule="random")
    assert gain.mean() == pytest.approx(1 - 0.75)
    # always-slow's P(fast) is one tied value: ranking it is the blind switch in expectation
    np.testing.assert_allclose(gain_at_matched_tokens(router, always_slow), gain)
    # a random router at the same tokens gains nothing over the blind switch
    blind = arrays([0.9, 0.1, 0.9, 0.1], easy_fast, [1, 1, 1, 1])
    assert gain_at_matched_tokens(blind, always_slow, rule="random").mean() == pytest.approx(0.0)
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


def test_random_switch_correctness_with_mixed_choices_and_both_clamps():
    # greedy: slow on prompts 0 and 1, fast on 2 and 3; 6 tokens saved per switch
    mixed = arrays([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 0], [1, 1, 1, 1])
    # own tokens 7; target 8.5: half of the fast-chosen prompts switched to slow
    np.testing.assert_allclose(random_switch_correctness(mixed, 8.5), [1, 1, 1, 0.5])
    # target 5.5: half of the slow-chosen prompts switched to fast
    np.testing.assert_allclose(random_switch_correctness(mixed, 5.5), [0.5, 1, 1, 0])
    # below the forced-fast cost: every slow choice switched (the share is clamped at 1)
    np.testing.assert_allclose(random_switch_correctness(mixed, 1.0), [0, 1, 1, 0])
    # forced modes of equal cost: nothing to trade, every prompt goes to the cheaper side's mode
    flat = arrays([0.1, 0.9], [0, 1], [1, 0], fast_tokens=5.0, slow_tokens=5.0)
    np.testing.assert_allclose(random_switch_correctness(flat, 4.0), [0, 1])  # all fast
    np.testing.assert_allclose(random_switch_correctness(flat, 6.0), [1, 0])  # all slow


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


def test_random_switch_correctness_with_a_one_token_spread():
    # slow costs one token more: switching half of the slow choices saves a quarter token
    a = arrays([0.1, 0.1, 0.9, 0.9], [0, 0, 1, 1], [1, 1, 1, 1], fast_tokens=4.0, slow_tokens=5.0)
    np.testing.assert_allclose(random_switch_correctness(a, 4.25), [0.5, 0.5, 1, 1])
    np.testing.assert_allclose(random_switch_correctness(a, 4.75), [1, 1, 1, 1])


def test_ranked_switch_sends_the_rivals_own_most_fast_prompts_fast_first():
    # a rival slow everywhere at greedy decoding whose P(fast) still ranks the easy prompts first
    rival = arrays([0.4, 0.3, 0.2, 0.1], [1, 1, 0, 0], [1, 1, 1, 1])
    np.testing.assert_allclose(ranked_switch_p_slow(rival, 7.0), [0, 0, 1, 1])
    # the boundary prompt goes fast with the fraction that lands on the target: 10 - 1.5 - 0.75
    np.testing.assert_allclose(ranked_switch_p_slow(rival, 7.75), [0, 0.5, 1, 1])
    # the target at or above its all-slow cost: nothing goes fast; out of reach: everything does
    np.testing.assert_allclose(ranked_switch_p_slow(rival, 12.0), [1, 1, 1, 1])
    np.testing.assert_allclose(ranked_switch_p_slow(rival, 1.0), [0, 0, 0, 0])
    router = arrays([0.9, 0.9, 0.1, 0.1], [1, 1, 0, 0], [1, 1, 1, 1])  # 7 tokens, accuracy 1
    assert gain_at_matched_tokens(router, rival).mean() == pytest.approx(0.0)  # ranked: a tie
    assert gain_at_matched_tokens(router, rival, rule="random").mean() == pytest.approx(0.25)
    with pytest.raises(ValueError, match="rule must be 'ranked' or 'random', got 'best'"):
        gain_at_matched_tokens(router, rival, rule="best")


def test_ranked_switch_splits_ties_evenly_and_lands_on_the_target():
    tied = arrays([0.5, 0.5, 0.1, 0.1], [1, 0, 0, 0], [1, 1, 1, 1])
    np.testing.assert_allclose(ranked_switch_p_slow(tied, 8.5), [0.5, 0.5, 1, 1])
    # a prompt whose fast answer costs more than its slow one is still taken in rank order
    odd = arrays([0.9, 0.5], [1, 1], [1, 1])
    odd["fast_tokens"] = np.array([12.0, 4.0])
    p_slow = ranked_switch_p_slow(odd, 9.0)
    np.testing.assert_allclose(p_slow, [0, 1 / 3])
    assert chosen(odd, p_slow)["tokens"].mean() == pytest.approx(9.0)
    g = np.random.default_rng(0)
    many = arrays(g.random(50), g.integers(0, 2, 50), g.integers(0, 2, 50))
    many["slow_tokens"] = g.integers(6, 14, 50).astype(float)
    for target in (5.0, 7.3, 9.0):  # the all-slow mean is 9.52
        got = chosen(many, ranked_switch_p_slow(many, target))["tokens"].mean()
        assert got == pytest.approx(target)


def test_the_count_swap_shift_is_per_prompt_so_opposite_moves_do_not_cancel():
    from dual_dgo.evaluation import count_swap_shift, fast_rate_by_source

    before, after = np.array([0.8, 0.2, 0.5, 0.5]), np.array([0.2, 0.8, 0.5, 0.4])
    assert count_swap_shift(before, after) == pytest.approx((0.6 + 0.6 + 0.0 + 0.1) / 4)
    assert abs(before.mean() - after.mean()) == pytest.approx(0.025)  # the mean barely moves
    with pytest.raises(ValueError, match="the same prompts are needed"):
        count_swap_shift(before, after[:3])
    arrays = {"p_fast": before, "source": np.array([0, 1, 0, -1])}
    assert fast_rate_by_source(arrays) == pytest.approx([0.65, 0.2])
    assert np.isnan(fast_rate_by_source({"p_fast": before, "source": -np.ones(4)})).all()
