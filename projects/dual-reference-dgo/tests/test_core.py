import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dual_dgo import baselines
from dual_dgo.core import (
    dual_reference_weights,
    exact_log_partitions,
    fast_probability,
    fixed_prior_weights,
    log_mode_partitions,
    mode_masses,
    response_log_probs,
    sequence_loss,
)
from dual_dgo.miniature import TaskConfig, generate_split

# prompt 0: 1 fast (r=1) and 2 slow (r=0, 1); prompt 1: 2 fast (0, 0) and 1 slow (1)
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
MODES = torch.tensor([0, 1, 1, 0, 0, 1])
PROMPTS = torch.tensor([0, 0, 0, 1, 1, 1])
HALF = torch.tensor([0.5, 0.5], dtype=torch.float64)


def by_hand(beta: float, prior_fast: float = 0.5):
    e = math.exp(1 / beta)
    z = [[e, (1 + e) / 2], [1.0, e]]  # zhat[prompt][mode], Eq. 6
    rho = []
    for zf, zs in z:
        fast = prior_fast * zf / (prior_fast * zf + (1 - prior_fast) * zs)
        rho.append([fast, 1 - fast])
    w = [
        rho[0][0] * e / (1 * z[0][0]),
        rho[0][1] * 1 / (2 * z[0][1]),
        rho[0][1] * e / (2 * z[0][1]),
        rho[1][0] * 1 / (2 * z[1][0]),
        rho[1][0] * 1 / (2 * z[1][0]),
        rho[1][1] * e / (1 * z[1][1]),
    ]
    return np.log(z), np.array(rho), np.array(w)


@pytest.mark.parametrize("beta", [0.3, 1.0])
@pytest.mark.parametrize("prior_fast", [0.5, 0.2])
def test_dual_weights_match_a_hand_count_and_sum_to_one_per_prompt(beta, prior_fast):
    log_z, rho, w = by_hand(beta, prior_fast)
    prior = torch.tensor([prior_fast, 1 - prior_fast], dtype=torch.float64)
    weights, masses = dual_reference_weights(REWARDS, MODES, PROMPTS, 2, beta, prior)
    np.testing.assert_allclose(weights.numpy(), w, rtol=1e-12)
    np.testing.assert_allclose(masses.numpy(), rho, rtol=1e-12)
    estimated, counts = log_mode_partitions(REWARDS, MODES, PROMPTS, 2, beta)
    np.testing.assert_allclose(estimated.numpy(), log_z, rtol=1e-12)
    np.testing.assert_array_equal(counts.numpy(), [[1, 2], [2, 1]])
    per_prompt = torch.zeros(2, dtype=torch.float64).index_add(0, PROMPTS, weights)
    np.testing.assert_allclose(per_prompt.numpy(), [1.0, 1.0], rtol=1e-12)
    # the within-mode weights sum to that mode's mass: the router term of Eq. 5
    for prompt in (0, 1):
        for mode in (0, 1):
            cell = (prompt == PROMPTS) & (mode == MODES)
            assert weights[cell].sum().item() == pytest.approx(
                masses[prompt, mode].item(), rel=1e-12
            )


def test_duplicating_one_mode_leaves_dual_masses_but_moves_single_reference():
    slow_twice = MODES == 1
    rewards = torch.cat([REWARDS, REWARDS[slow_twice]])
    modes, prompts = (
        torch.cat([MODES, MODES[slow_twice]]),
        torch.cat([PROMPTS, PROMPTS[slow_twice]]),
    )
    _, before = dual_reference_weights(REWARDS, MODES, PROMPTS, 2, 0.5, HALF)
    _, after = dual_reference_weights(rewards, modes, prompts, 2, 0.5, HALF)
    torch.testing.assert_close(before, after, rtol=1e-12, atol=0)

    def single_fast_mass(r, m, p):
        w = baselines.single_reference_weights(r, p, 2, 0.5)
        return torch.zeros(2, dtype=w.dtype).index_add(0, p, w * (m == 0))

    moved = single_fast_mass(rewards, modes, prompts) - single_fast_mass(REWARDS, MODES, PROMPTS)
    assert (moved < -0.05).all()  # more slow samples: single-reference DGO shifts mass to slow


def test_single_reference_equals_dual_with_the_sample_share_prior():
    """The ablation 'prior replaced by each mode's sample share' is single-reference DGO."""
    _, counts = log_mode_partitions(REWARDS, MODES, PROMPTS, 2, 0.4)
    share = counts / counts.sum(dim=1, keepdim=True)
    dual, _ = dual_reference_weights(REWARDS, MODES, PROMPTS, 2, 0.4, share)
    single = baselines.single_reference_weights(REWARDS, PROMPTS, 2, 0.4)
    torch.testing.assert_close(dual, single, rtol=1e-12, atol=1e-15)


def test_single_reference_weights_are_dgo_mean_normalised_over_pooled_samples():
    beta = 0.5
    w = baselines.single_reference_weights(REWARDS, PROMPTS, 2, beta)
    e = math.exp(1 / beta)
    dgo = [e / ((e + 1 + e) / 3), 1 / ((e + 1 + e) / 3), e / ((e + 1 + e) / 3)]  # exp / mean
    np.testing.assert_allclose(w[:3].numpy(), np.array(dgo) / 3, rtol=1e-12)


def test_all_zero_reward_prompt_gets_no_weight_in_single_reference_dgo():
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    prompts = torch.tensor([0, 0, 1, 1])
    w = baselines.single_reference_weights(rewards, prompts, 2, 0.5)
    assert w[:2].tolist() == [0.0, 0.0] and w[2:].sum().item() == pytest.approx(1.0)
    kept = baselines.single_reference_weights(rewards, prompts, 2, 0.5, zero_all_zero_rewards=False)
    assert kept[:2].tolist() == [0.5, 0.5]


def test_weights_stay_finite_for_large_rewards_and_small_beta():
    rewards = torch.tensor([500.0, 499.0, -500.0, 3.0], dtype=torch.float32)
    modes, prompts = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 0, 1])
    for beta in (1e-3, 1e-2):
        w, rho = dual_reference_weights(rewards, modes, prompts, 2, beta, HALF)
        assert torch.isfinite(w).all() and torch.isfinite(rho).all()
        assert w.sum().item() == pytest.approx(2.0, rel=1e-5)
        assert rho[0, 0].item() == pytest.approx(1.0)  # the fast reward is 1 higher: it wins
        s = baselines.single_reference_weights(rewards, prompts, 2, beta)
        assert torch.isfinite(s).all()


def test_a_prompt_without_one_mode_puts_all_mass_on_the_other():
    w, rho = dual_reference_weights(
        torch.tensor([0.3, 0.9]), torch.tensor([1, 1]), torch.tensor([0, 0]), 1, 0.5, HALF
    )
    assert rho[0].tolist() == [0.0, 1.0]
    assert w.sum().item() == pytest.approx(1.0)


def test_fixed_prior_switches_the_competition_off():
    w, rho = fixed_prior_weights(REWARDS, MODES, PROMPTS, 2, 0.3, torch.tensor([0.7, 0.3]))
    np.testing.assert_allclose(rho.numpy(), [[0.7, 0.3], [0.7, 0.3]], rtol=1e-6)
    fast = (MODES == 0).to(w.dtype)
    for prompt in (0, 1):
        assert (w * fast)[prompt == PROMPTS].sum().item() == pytest.approx(0.7)


def test_exact_log_partitions_match_the_closed_form():
    table = torch.tensor([[[0.9, 1.0, -0.1], [0.5, 0.8, -0.2]]], dtype=torch.float64)
    beta = 0.25
    expected = [
        math.log(0.9 * math.exp(1.0 / beta) + 0.1 * math.exp(-0.1 / beta)),
        math.log(0.5 * math.exp(0.8 / beta) + 0.5 * math.exp(-0.2 / beta)),
    ]
    np.testing.assert_allclose(exact_log_partitions(table, beta)[0].numpy(), expected, rtol=1e-12)
    rho = mode_masses(exact_log_partitions(table, beta), HALF.expand(1, 2))
    z = np.exp(expected)
    assert rho[0, 0].item() == pytest.approx(z[0] / z.sum(), rel=1e-12)


def test_sft_rft_and_one_mode_weights_by_hand():
    np.testing.assert_allclose(baselines.sft_weights(PROMPTS, 2).numpy(), [1 / 3] * 6, rtol=1e-6)
    correct = torch.tensor([True, False, True, False, False, False])
    np.testing.assert_allclose(
        baselines.rft_weights(correct, PROMPTS, 2).numpy(), [0.5, 0, 0.5, 0, 0, 0]
    )
    fast_only = baselines.one_mode_weights(REWARDS, MODES, PROMPTS, 2, 0.5, mode=0)
    np.testing.assert_allclose(fast_only.numpy(), [1.0, 0, 0, 0.5, 0.5, 0], atol=1e-12)
    slow_only = baselines.one_mode_weights(REWARDS, MODES, PROMPTS, 2, 0.5, mode=1)
    e = math.exp(2.0)
    np.testing.assert_allclose(
        slow_only.numpy(), [0, 1 / (1 + e), e / (1 + e), 0, 0, 1.0], atol=1e-12
    )


def test_oracle_route_is_slow_from_the_threshold():
    assert baselines.oracle_route(torch.tensor([1, 2, 3, 4]), 3).tolist() == [0, 0, 1, 1]


def toy_sequences():
    """Vocabulary 6; sequences [prompt, prompt, mode, body, body, pad]."""
    input_ids = torch.tensor([[1, 2, 4, 3, 0, 0], [1, 2, 5, 3, 3, 0]])
    response_mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0]])
    logits = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return logits, input_ids, response_mask


def test_response_log_probs_split_mode_and_body_and_ignore_the_prompt():
    logits, input_ids, mask = toy_sequences()
    mode, body, lengths = response_log_probs(logits, input_ids, mask)
    log_p = torch.log_softmax(logits, -1)
    assert mode[0].item() == pytest.approx(log_p[0, 1, 4].item())  # position 1 predicts the mode
    assert body[1].item() == pytest.approx((log_p[1, 2, 3] + log_p[1, 3, 3]).item())
    assert lengths.tolist() == [3, 3]
    # prompt (and image) positions and padding carry no loss: changing their predictions is inert
    perturbed = logits.clone()
    perturbed[:, 0] += 5 * torch.randn(2, 6, dtype=torch.float64)
    perturbed[:, 4:] += 5 * torch.randn(2, 2, 6, dtype=torch.float64)
    again = response_log_probs(perturbed, input_ids, mask)
    torch.testing.assert_close(again[0], mode)
    torch.testing.assert_close(again[1], body)


def test_sequence_loss_sum_and_token_mean_by_hand():
    mode, body = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -5.0])
    lengths, weights = torch.tensor([2.0, 4.0]), torch.tensor([0.25, 0.75])
    assert sequence_loss(mode, body, lengths, weights, 1).item() == pytest.approx(
        0.25 * 4 + 0.75 * 7
    )
    assert sequence_loss(mode, body, lengths, weights, 2, "token_mean").item() == pytest.approx(
        (0.25 * 4 / 2 + 0.75 * 7 / 4) / 2
    )
    with pytest.raises(ValueError, match="reduction must be 'sum' or 'token_mean', got 'mean'"):
        sequence_loss(mode, body, lengths, weights, 1, "mean")


def test_log_mode_partitions_rejects_a_non_positive_beta():
    with pytest.raises(ValueError, match="beta must be positive, got 0"):
        log_mode_partitions(REWARDS, MODES, PROMPTS, 2, 0)
    with pytest.raises(ValueError, match="beta must be positive, got -1"):
        baselines.single_reference_weights(REWARDS, PROMPTS, 2, -1)


def test_fast_probability_renormalises_over_the_two_mode_tokens():
    logits = torch.tensor([[0.0, math.log(3.0), 0.0, 5.0]])
    assert fast_probability(logits, fast_id=1, slow_id=2).item() == pytest.approx(0.75)


def test_a_sequence_without_response_tokens_is_refused():
    logits, input_ids, mask = toy_sequences()
    mask = mask.clone()
    mask[1] = 0
    message = r"^every sequence needs at least one response token \(its mode token\)$"
    with pytest.raises(ValueError, match=message):
        response_log_probs(logits, input_ids, mask)


def test_token_mean_divides_by_the_true_length_even_for_one_token():
    mode, body = torch.tensor([-1.0, -2.0]), torch.tensor([0.0, -6.0])
    lengths, weights = torch.tensor([1.0, 4.0]), torch.tensor([1.0, 1.0])
    got = sequence_loss(mode, body, lengths, weights, 1, "token_mean").item()
    assert got == pytest.approx(1.0 + 2.0)


def test_weights_keep_the_rewards_dtype_and_beta_zero_is_refused_by_dgo_too():
    rewards = REWARDS.float()
    w, rho = dual_reference_weights(rewards, MODES, PROMPTS, 2, 0.5, HALF)
    assert w.dtype == torch.float32 and rho.dtype == torch.float64
    with pytest.raises(ValueError, match="beta must be positive, got 0"):
        baselines.single_reference_weights(REWARDS, PROMPTS, 2, 0)


def test_fixed_prior_gives_no_mass_to_a_mode_without_samples():
    rewards, modes, prompts = torch.tensor([0.2, 0.9]), torch.tensor([1, 1]), torch.tensor([0, 0])
    w, rho = fixed_prior_weights(rewards, modes, prompts, 1, 0.5, torch.tensor([0.7, 0.3]))
    assert rho[0].tolist() == [0.0, 1.0] and w.sum().item() == pytest.approx(1.0)


def test_rft_with_exactly_one_correct_response():
    correct = torch.tensor([False, True, False])
    w = baselines.rft_weights(correct, torch.tensor([0, 0, 0]), 1)
    assert w.tolist() == [0.0, 1.0, 0.0]


def mode_logits_dual_and_single(task: TaskConfig, beta: float = 0.1, n: int = 200):
    """Per prompt of the miniature: logit rho_F of the method (alpha 1/2), logit of
    single-reference DGO's implied fast mass, and log(n_F / n_S)."""
    records = generate_split(n, seed=0, task=task)
    rewards = torch.tensor(
        [r["reward"] for x in records for r in x["responses"]], dtype=torch.float64
    )
    modes = torch.tensor([int(r["mode"] == "slow") for x in records for r in x["responses"]])
    prompts = torch.tensor([i for i, x in enumerate(records) for _ in x["responses"]])
    _, rho = dual_reference_weights(rewards, modes, prompts, n, beta, HALF)
    single = baselines.single_reference_weights(rewards, prompts, n, beta)
    single_fast = torch.zeros(n, dtype=torch.float64).index_add(0, prompts, single * (modes == 0))
    _, counts = log_mode_partitions(rewards, modes, prompts, n, beta)
    logit = lambda p: torch.log(p) - torch.log1p(-p)  # noqa: E731
    return logit(rho[:, 0]), logit(single_fast), torch.log(counts[:, 0] / counts[:, 1])


def test_with_constant_counts_single_reference_is_the_method_plus_one_constant():
    """2 fast and 6 slow samples for every prompt (the earlier miniature): the two objectives'
    mode logits differ by log(alpha_F/alpha_S) - log(n_F/n_S) = log 3 on every prompt, so a
    single scalar (a prior, a logit bias) turns one into the other."""
    task = TaskConfig(n_fast=2, n_slow=6, n_fast_hard=2, n_slow_hard=6)
    dual, single, _ = mode_logits_dual_and_single(task)
    np.testing.assert_allclose((dual - single).numpy(), math.log(3), rtol=1e-9)


def test_with_the_difficulty_schedule_no_single_scalar_maps_single_reference_onto_the_method():
    task = TaskConfig(n_fast=4, n_slow=2, n_fast_hard=1, n_slow_hard=8)  # the record at c731642
    dual, single, log_ratio = mode_logits_dual_and_single(task)
    shift = dual - single
    # the shift is log(alpha_F/alpha_S) - log(n_F/n_S) prompt by prompt (alpha = 1/2) ...
    np.testing.assert_allclose(shift.numpy(), -log_ratio.numpy(), rtol=1e-9, atol=1e-9)
    # ... and spans log 2 + log 8 across the prompts: the best constant misses by log 4 somewhere
    assert shift.max() - shift.min() == pytest.approx(math.log(2) + math.log(8), rel=1e-9)
    best_constant = (shift.max() + shift.min()) / 2
    assert (shift - best_constant).abs().max() > 1.0


def test_mode_share_sft_gives_every_prompt_the_same_fast_mass_whatever_its_counts():
    # prompt 0: 8 fast, 1 slow (source a); prompt 1: 1 fast, 8 slow (source b); prompt 2: slow only
    modes = torch.tensor([0] * 8 + [1] + [0] + [1] * 8 + [1, 1])
    prompts = torch.tensor([0] * 9 + [1] * 9 + [2, 2])
    w = baselines.mode_share_sft_weights(modes, prompts, 3, 0.25)
    expected = [0.25 / 8] * 8 + [0.75] + [0.25] + [0.75 / 8] * 8 + [0.5, 0.5]
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    fast_mass = torch.zeros(3).index_add(0, prompts, w * (modes == 0))
    np.testing.assert_allclose(fast_mass.numpy(), [0.25, 0.25, 0.0], atol=1e-7)
    # plain SFT imitates the counts instead: 8/9 and 1/9
    plain = baselines.sft_weights(prompts, 3)
    plain_fast = torch.zeros(3).index_add(0, prompts, plain * (modes == 0))
    np.testing.assert_allclose(plain_fast.numpy(), [8 / 9, 1 / 9, 0.0], rtol=1e-6)
    only_fast = baselines.mode_share_sft_weights(torch.tensor([0, 0]), torch.tensor([0, 0]), 1, 0.3)
    assert only_fast.tolist() == [0.5, 0.5]
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="fast_share must lie strictly between 0 and 1"):
            baselines.mode_share_sft_weights(modes, prompts, 3, bad)


def test_with_source_counts_the_shift_is_plus_or_minus_log_8_by_the_tag():
    """8 fast / 1 slow on source a, 1 / 8 on source b: single-reference DGO's mode logit is the
    method's plus log(n_F/n_S) = +log 8 or -log 8 by the source tag, not by the difficulty, so
    no single scalar maps one onto the other and the shift says nothing about which mode pays."""
    data = yaml.safe_load((Path(__file__).parents[1] / "configs" / "default.yaml").read_text())
    keys = ("counts_by", "n_fast", "n_slow", "n_fast_b", "n_slow_b", "source_share", "k_max")
    task = TaskConfig(**{k: data["data"][k] for k in keys})  # the default miniature
    assert (task.counts_by, task.counts(1, 0), task.counts(1, 1)) == ("source", (8, 1), (1, 8))
    dual, single, log_ratio = mode_logits_dual_and_single(task)
    records = generate_split(200, seed=0, task=task)
    source = np.array([r["source"] for r in records])
    expected = np.where(source == 0, math.log(8), -math.log(8))
    np.testing.assert_allclose(log_ratio.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose((single - dual).numpy(), expected, rtol=1e-9, atol=1e-9)
    k = np.array([r["difficulty"] for r in records])
    assert abs(np.corrcoef(k, source)[0, 1]) < 0.2  # the tag is not the difficulty
