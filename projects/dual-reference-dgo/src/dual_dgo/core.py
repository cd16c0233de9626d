"""Dual-Reference DGO: the offline objective for adaptive fast/slow reasoning, in pure torch.

Notation. A prompt x has responses y of two modes m in {F (fast, direct answer), S (slow,
step-by-step)}. Every response starts with a mode token (``<fast>`` or ``<think>``), so the two
modes have disjoint supports and log pi(y|x) = log pi(m|x) + log pi(y|x, m). Offline data came
from two behaviour policies mu_F and mu_S; each response has a reward r (verifier minus a length
cost). The KL-regularised optimum against a fast/slow *mixture reference* with mode prior alpha is

    pi_mix(y|x) = alpha_F mu_F(y|x) + alpha_S mu_S(y|x)                               (Eq. 1)
    pi*(y|x)    = pi_mix(y|x) exp(r(x, y) / beta) / Z(x)                              (Eq. 2)
    Z_m(x)      = E_{y ~ mu_m} exp(r(x, y) / beta)        (mode partition functions)  (Eq. 3)
    rho_m(x)    = pi*(m|x) = alpha_m Z_m(x) / sum_m' alpha_m' Z_m'(x)    (competition)  (Eq. 4)

Minimising KL(pi* || pi_theta) over theta, by the chain rule above, is

    L(theta) = - E_x sum_m rho_m(x) log pi_theta(m|x)                       (router term)
               - E_x sum_m rho_m(x) E_{y ~ mu_m}[ exp(r/beta) / Z_m(x) log pi_theta(y|x, m) ]
                                                                              (Eq. 5)

Estimated from n_m samples per mode (the mode-wise correction: weights self-normalised inside
each mode, so neither behaviour policy's likelihood nor its sample count enters rho):

    zhat_m     = 1/n_m sum_i exp(r_{m,i} / beta)                                      (Eq. 6)
    w_{m,i}    = rhohat_m exp(r_{m,i} / beta) / (n_m zhat_m),   sum_{m,i} w_{m,i} = 1 (Eq. 7)

Since sum_i w_{m,i} = rhohat_m, the router term of Eq. 5 is sum_i w_{m,i} log pi(m_i|x), so one
weighted sequence loss over (mode token + summed body) is Eq. 5 exactly (``sequence_loss``).
Single-reference DGO (the baseline, ``baselines.py``) pools all n_F + n_S responses of a prompt:
w_i = exp(r_i / beta) / mean_j exp(r_j / beta), whose implied fast mass
n_F zhat_F / (n_F zhat_F + n_S zhat_S) depends on the sample counts.

The abstract states the mixture reference, the partition-function competition and a mode-wise
correction; Eqs. 1-7 (prior alpha, the per-mode self-normalisation, the separate mode-token
term) are this implementation's reconstruction (README, "Reconstructed vs stated").
"""

from __future__ import annotations

import math

import torch

FAST, SLOW = 0, 1  # mode indices: column 0 is fast, column 1 is slow


def log_mode_partitions(
    rewards: torch.Tensor, modes: torch.Tensor, prompts: torch.Tensor, n_prompts: int, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6 in log space: log zhat_m(x) = logsumexp_i(r_{m,i} / beta) - log n_m.

    rewards, modes (0 fast / 1 slow), prompts (index of each response's prompt): [N].
    Returns log zhat [P, 2] (-inf where a prompt has no response of that mode) and n [P, 2].
    """
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    cell = prompts * 2 + modes  # [N] flat index of (prompt, mode)
    scaled = rewards.to(torch.float64) / beta
    log_sum = torch.full((n_prompts * 2,), -math.inf, dtype=torch.float64, device=rewards.device)
    log_sum = log_sum.scatter_reduce(0, cell, scaled, reduce="amax", include_self=True)
    peak = torch.where(torch.isfinite(log_sum), log_sum, torch.zeros_like(log_sum))
    total = torch.zeros_like(log_sum).index_add(0, cell, torch.exp(scaled - peak[cell]))
    counts = torch.zeros_like(log_sum).index_add(0, cell, torch.ones_like(scaled))
    log_z = torch.where(counts > 0, peak + torch.log(total) - torch.log(counts), log_sum)
    return log_z.view(n_prompts, 2), counts.view(n_prompts, 2)


def mode_masses(log_z: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """Eq. 4: rho_m = alpha_m Z_m / sum_m' alpha_m' Z_m' from log Z [P, 2] and alpha [P, 2].

    A mode without samples (log Z = -inf) or with prior 0 gets mass 0.
    """
    logits = log_z + torch.log(prior.to(log_z.dtype))
    return torch.softmax(logits, dim=-1)


def dual_reference_weights(
    rewards: torch.Tensor,
    modes: torch.Tensor,
    prompts: torch.Tensor,
    n_prompts: int,
    beta: float,
    prior: torch.Tensor,
    log_z: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7: per-response weights w_{m,i} = rho_m exp(r/beta) / (n_m zhat_m) and rho [P, 2].

    ``prior``: alpha as [2] (one prior for every prompt) or [P, 2]. ``log_z``: replaces the
    estimate of Eq. 6 in the mode masses (the positive control passes the exact partition
    functions of the scripted policies); the within-mode weights always use the samples.
    """
    estimated, counts = log_mode_partitions(rewards, modes, prompts, n_prompts, beta)
    prior = prior.to(torch.float64).expand(n_prompts, 2)
    rho = mode_masses(estimated if log_z is None else log_z.to(torch.float64), prior)
    cell_log_z = estimated[prompts, modes]  # [N]
    within = torch.exp(rewards.to(torch.float64) / beta - cell_log_z) / counts[prompts, modes]
    return (rho[prompts, modes] * within).to(rewards.dtype), rho


def exact_log_partitions(policy_table: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 3 in closed form for a behaviour policy with known accuracy p and rewards r_good
    (correct) and r_bad (wrong): log Z_m = log(p exp(r_good/beta) + (1 - p) exp(r_bad/beta)).

    policy_table [P, 2, 3] holds (p, r_good, r_bad) per prompt and mode; returns [P, 2].
    """
    p, good, bad = policy_table.to(torch.float64).unbind(-1)
    both = torch.stack([good / beta + torch.log(p), bad / beta + torch.log1p(-p)], dim=-1)
    return torch.logsumexp(both, dim=-1)


def fixed_prior_weights(
    rewards: torch.Tensor,
    modes: torch.Tensor,
    prompts: torch.Tensor,
    n_prompts: int,
    beta: float,
    prior: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The negative control: Eq. 7 with the competition of Eq. 4 switched off (rho = alpha for
    every prompt, where the prompt has both modes); the within-mode weights are unchanged."""
    _, counts = log_mode_partitions(rewards, modes, prompts, n_prompts, beta)
    present = torch.where(counts > 0, 0.0, -math.inf).to(torch.float64)  # [P, 2]
    return dual_reference_weights(rewards, modes, prompts, n_prompts, beta, prior, log_z=present)


def response_log_probs(
    logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split log pi(y|x) into the mode token and the body (the chain rule above Eq. 1).

    logits [N, T, V] predict token t+1 at position t; response_mask [N, T] is 1 on response
    tokens (mode token first), 0 on the prompt, image tokens and padding. Returns
    log pi(m|x) [N], sum_t log pi(y_t|x, m, y_<t) over the body [N], and response lengths [N].
    """
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, T-1, V]
    targets = input_ids[:, 1:]
    token_lp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T-1]
    mask = response_mask[:, 1:].to(token_lp.dtype)
    first = mask.cumsum(dim=1).eq(1) & mask.bool()  # the mode token: first response token
    if not bool(first.any(dim=1).all()):
        raise ValueError("every sequence needs at least one response token (its mode token)")
    mode_lp = (token_lp * first).sum(dim=1)
    body_lp = (token_lp * (mask - first.to(mask.dtype))).sum(dim=1)
    return mode_lp, body_lp, mask.sum(dim=1)


def sequence_loss(
    mode_log_prob: torch.Tensor,
    body_log_prob: torch.Tensor,
    lengths: torch.Tensor,
    weights: torch.Tensor,
    n_prompts: int,
    reduction: str = "sum",
) -> torch.Tensor:
    """Eq. 5 as a weighted sequence NLL: -1/P sum_i w_i (log pi(m_i|x) + log pi(y_i|x, m_i)).

    ``reduction="sum"`` is Eq. 5 (the mode token counts once per sequence, like the router
    term). ``"token_mean"`` (an ablation) divides each sequence's log-likelihood by its length,
    which also shrinks the mode token's gradient on long (slow) responses.
    """
    sequence = mode_log_prob + body_log_prob  # [N]
    if reduction == "token_mean":
        sequence = sequence / lengths.clamp_min(1)
    elif reduction != "sum":
        raise ValueError(f"reduction must be 'sum' or 'token_mean', got {reduction!r}")
    return -(weights.to(sequence.dtype) * sequence).sum() / n_prompts


def fast_probability(first_token_logits: torch.Tensor, fast_id: int, slow_id: int) -> torch.Tensor:
    """P(fast | x) = pi(<fast>|x) / (pi(<fast>|x) + pi(<think>|x)) from the logits [B, V] of
    the first response token: the exact fast rate, no sampling."""
    pair = first_token_logits[:, [fast_id, slow_id]].float()
    return torch.softmax(pair, dim=-1)[:, 0]
