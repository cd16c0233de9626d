r"""Baselines: sample-level unlearning, probability-based token weights, annotators.

Same notation as ``core``: ``logp`` [B, T] answer-token log-probabilities, ``mask`` [B, T],
sequence log-probability ``log pi(y|x) = sum_t m_t log p_t`` and length ``|y| = sum_t m_t``.
Formulas follow the open-unlearning trainers (``src/trainer/unlearn/``).

Sample-level (one weight per token, i.e. none)::

    GA:        L = mean_m(log p_t)                                                    (B1)
    GradDiff:  L = GA + lambda L_r                                                    (B2)
    NPO:       L = -(2/beta) mean_i log sigmoid(-beta (log pi(y_i|x_i) - log pi_ref(y_i|x_i)))
                   + lambda L_r                                                       (B3)
    SimNPO:    L = -(2/beta) mean_i log sigmoid(-(beta/|y_i|) log pi(y_i|x_i) - gamma)
                   + lambda L_r                                                       (B4)

Probability-based token weighting (weights from the detached token probability p_t)::

    WGA:     L = mean_m(p_t^beta log p_t) + lambda L_r                                (B5)
    SatImp:  L = mean_m(p_t^beta1 (1 - p_t)^beta2 log p_t) + lambda L_r               (B6)

Annotation-based token weighting (stands in for auxiliary-model methods such as TIF, which label
"unwanted" words with an external model): a heuristic annotator that marks capitalised, numeric and
rare tokens (B7), and the ground-truth span mask of the generated data as the upper bound (B8);
both weights go through the same budget normalisation and forget loss as ATWU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atwu.core import masked_mean


def sequence_logprob(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(y|x) [B] and |y| [B] of each answer."""
    return (logp * mask).sum(-1), mask.sum(-1)


def ga_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """B1: gradient ascent, the mean answer-token log-probability (minimised)."""
    return masked_mean(logp, mask)


def graddiff_loss(
    logp: torch.Tensor, mask: torch.Tensor, retain_loss: torch.Tensor, retain_weight: float
) -> torch.Tensor:
    """B2: gradient difference, GA on the forget batch plus lambda times the retain NLL."""
    return ga_loss(logp, mask) + retain_weight * retain_loss


def npo_loss(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """B3 (forget term): NPO on whole answers against the frozen reference model."""
    log_ratio = sequence_logprob(logp, mask)[0] - sequence_logprob(ref_logp, mask)[0]
    return -(2.0 / beta) * F.logsigmoid(-beta * log_ratio).mean()


def simnpo_loss(logp: torch.Tensor, mask: torch.Tensor, beta: float, gamma: float) -> torch.Tensor:
    """B4 (forget term): SimNPO, reference-free NPO on the length-normalised log-probability."""
    total, length = sequence_logprob(logp, mask)
    return -(2.0 / beta) * F.logsigmoid(-beta * total / length.clamp(min=1.0) - gamma).mean()


def wga_weights(logp: torch.Tensor, beta: float) -> torch.Tensor:
    """B5 weights: p_t^beta (detached), large on tokens the model still predicts well."""
    return logp.detach().exp() ** beta


def satimp_weights(logp: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """B6 weights: p_t^beta1 (1 - p_t)^beta2 (detached)."""
    p = logp.detach().exp()
    return p**beta1 * (1.0 - p) ** beta2


def probability_weighted_loss(
    logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """B5/B6 forget term: mean_m(w_t log p_t) with the weights held constant."""
    return masked_mean(weights.detach() * logp, mask)


def heuristic_vocab_weights(
    token_strings: list[str], token_counts: torch.Tensor, rare_max_count: int
) -> torch.Tensor:
    """B7: a per-vocabulary annotator, 1 for tokens that look like facts, else 0.

    A token is marked when it starts a capitalised word, holds a digit, or occurs at most
    ``rare_max_count`` times in the fine-tuning answers (proper names and rare content words).
    """
    marks = torch.zeros(len(token_strings))
    for index, text in enumerate(token_strings):
        stripped = text.strip()
        capitalised = stripped[:1].isupper() and stripped[:1].isalpha()
        numeric = any(ch.isdigit() for ch in stripped)
        rare = 0 < token_counts[index] <= rare_max_count
        marks[index] = float(capitalised or numeric or bool(rare))
    return marks
