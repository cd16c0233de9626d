"""Baselines: per-response weights for the same weighted sequence loss (core.sequence_loss).

- ``single_reference_weights``: DGO as published (one reference policy; every prompt's pooled
  responses self-normalised, w_i = exp(r_i/beta) / mean_j exp(r_j/beta), zero for a prompt whose
  rewards are all 0), rescaled by 1/N_x so that each prompt's weights sum to 1 as in Eq. 7
  (a per-prompt constant: the same optimum, the same loss scale as the method);
- ``sft_weights``: SFT on every response, uniform within the prompt;
- ``mode_share_sft_weights``: SFT with the mode token's share fixed on every prompt (the claim's
  warm start, so that it carries no routing the sample counts imply);
- ``rft_weights``: SFT on the correct responses only (rejection-sampling fine-tuning);
- ``one_mode_weights``: always-fast / always-slow, Eq. 7 with all prior on one mode;
- ``oracle_route``: the oracle router, slow exactly when the true difficulty reaches a threshold.
"""

from __future__ import annotations

import torch

from dual_dgo.core import dual_reference_weights


def _per_prompt_sum(values: torch.Tensor, prompts: torch.Tensor, n_prompts: int) -> torch.Tensor:
    return torch.zeros(n_prompts, dtype=values.dtype, device=values.device).index_add(
        0, prompts, values
    )


def single_reference_weights(
    rewards: torch.Tensor,
    prompts: torch.Tensor,
    n_prompts: int,
    beta: float,
    zero_all_zero_rewards: bool = True,
) -> torch.Tensor:
    """DGO's weights (blog's Eq.: w_i = exp(r_i/beta) / Z(x), Z estimated by the mean over the
    prompt's pooled samples), divided by the prompt's sample count N_x."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    scaled = rewards.to(torch.float64) / beta
    peak = torch.full((n_prompts,), -torch.inf, dtype=torch.float64, device=rewards.device)
    peak = peak.scatter_reduce(0, prompts, scaled, reduce="amax", include_self=True)
    exp = torch.exp(scaled - peak[prompts])
    weights = exp / _per_prompt_sum(exp, prompts, n_prompts)[prompts]  # = (exp / mean) / N_x
    if zero_all_zero_rewards:
        nonzero = _per_prompt_sum((rewards != 0).to(torch.float64), prompts, n_prompts)
        weights = torch.where(nonzero[prompts] > 0, weights, torch.zeros_like(weights))
    return weights.to(rewards.dtype)


def sft_weights(prompts: torch.Tensor, n_prompts: int) -> torch.Tensor:
    """1 / N_x on every response: plain SFT on the mixture of both behaviour policies."""
    ones = torch.ones(len(prompts), dtype=torch.float32, device=prompts.device)
    return ones / _per_prompt_sum(ones, prompts, n_prompts)[prompts]


def mode_share_sft_weights(
    modes: torch.Tensor, prompts: torch.Tensor, n_prompts: int, fast_share: float
) -> torch.Tensor:
    """SFT on the mixture with the mode token's share fixed: on every prompt the fast responses
    share ``fast_share`` equally and the slow ones 1 - ``fast_share`` (all of it to the mode
    present when a prompt has one mode only). Each prompt's weights sum to 1 as in
    ``sft_weights``, but the sample counts no longer set the first token's target, so a warm
    start trained this way carries no routing the counts imply (its P(fast) is ``fast_share``
    on every prompt)."""
    if not 0.0 < fast_share < 1.0:
        raise ValueError(f"fast_share must lie strictly between 0 and 1, got {fast_share}")
    fast = (modes == 0).to(torch.float64)
    n_fast = _per_prompt_sum(fast, prompts, n_prompts)[prompts]
    n_slow = _per_prompt_sum(1.0 - fast, prompts, n_prompts)[prompts]
    share_fast = torch.where(
        n_slow > 0, torch.full_like(n_fast, fast_share), torch.ones_like(n_fast)
    )
    share_fast = torch.where(n_fast > 0, share_fast, torch.zeros_like(share_fast))
    weights = torch.where(
        fast.bool(), share_fast / n_fast.clamp_min(1), (1.0 - share_fast) / n_slow.clamp_min(1)
    )
    return weights.to(torch.float32)


def rft_weights(correct: torch.Tensor, prompts: torch.Tensor, n_prompts: int) -> torch.Tensor:
    """1 / (number of correct responses) on each correct response, 0 elsewhere (and on prompts
    with no correct response)."""
    hits = correct.to(torch.float32)
    total = _per_prompt_sum(hits, prompts, n_prompts)[prompts]
    return torch.where(total > 0, hits / total.clamp_min(1), torch.zeros_like(hits))


def one_mode_weights(
    rewards: torch.Tensor,
    modes: torch.Tensor,
    prompts: torch.Tensor,
    n_prompts: int,
    beta: float,
    mode: int,
) -> torch.Tensor:
    """Always-fast (mode 0) or always-slow (mode 1): the reward-weighted within-mode weights of
    Eq. 7 on that mode only (the prior puts all its mass there)."""
    prior = torch.zeros(2, dtype=torch.float64)
    prior[mode] = 1.0
    weights, _ = dual_reference_weights(rewards, modes, prompts, n_prompts, beta, prior)
    return weights


def oracle_route(difficulty: torch.Tensor, threshold: float) -> torch.Tensor:
    """P(slow) of the oracle router: 1 where the true difficulty is at least ``threshold``."""
    return (difficulty >= threshold).to(torch.float32)
