r"""Alternating Token-Weighted Unlearning (ATWU): the method in pure torch (no Lightning, no I/O).

Notation. A forget batch of answers ``a`` given questions ``q``; answer token t has log-probability
``log p_t(theta) = log p_theta(a_t | q, a_<t)`` and a mask ``m_t`` (1 on answer tokens). The retain
objective is the NLL of a retain batch R::

    L_r(theta) = -1/|R| sum_{t in R} log p_t(theta)                                   (Eq. 1)

Per-token forget losses (minimising them forgets the token)::

    GA:   l_t = log p_t(theta)                                                      (Eq. 2a)
    NPO:  l_t = -(2/beta) log sigmoid(-beta (log p_t(theta) - log p_t(theta_ref)))   (Eq. 2b)

Forget relevance through the retain interaction. A descent step ``-eta grad l_t`` on token t
changes the retain loss by ``-eta <grad L_r, grad l_t>``, so the first-order conflict score::

    c_t = < grad_theta l_t , grad_theta L_r >                                          (Eq. 3)

is positive when forgetting t also lowers (or leaves) the retain loss and negative when it
conflicts with it. All c_t of a batch come from ONE forward-mode pass: the Jacobian-vector product
of the per-token loss vector ``l(theta)`` along the tangent ``g_r = grad L_r``.

Scorer. A linear map over detached hidden states ``h_t`` (no external labels)::

    s_t = psi^T sg(h_t) + b,      w_t = sigmoid(s_t)                                  (Eq. 4)

fitted to the batch's conflict-derived relevance targets, scale free within the batch::

    y_t = rank_m(c)_t / (n_m - 1)                          (Eq. 5c, default: robust to outliers)
    y_t = sigmoid(((c_t - median_m c) / (IQR_m c / 1.349)) / tau)                      (Eq. 5b)
    y_t = sigmoid(z(c)_t / tau),   z(c)_t = (c_t - mean_m c) / std_m c                 (Eq. 5)
    L_psi = BCE(s_t, y_t) averaged over answer tokens                                 (Eq. 6)

Fixed forgetting budget. Weights are rescaled per batch so that their mean over answer tokens is
a fixed budget B (default 1), so they can neither collapse to zero nor grow::

    wbar_t = B * w_t / mean_m(w)                                                      (Eq. 7)

Model step (scorer fixed, weights detached) with the retain term weighted by lambda::

    L_theta = sum_t m_t wbar_t l_t / sum_t m_t + lambda L_r(theta)                     (Eq. 8)

Alternation (strict, as the abstract's "alternating"): at every step the scorer first takes one
step on Eq. 6 with the conflict scores of the current parameters, then the model takes one step
on Eq. 8 with the weights of the updated scorer. During a short burn-in the model step uses
uniform weights (token NPO) while the scorer already learns, so the scorer does not read conflict
scores only at the memorised point, where p_t ~ 1 makes them ~0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def answer_logprobs(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_t of every label under next-token logits, and the answer mask (labels != -100).

    logits [B, T, V], labels [B, T] -> (logp [B, T-1], mask [B, T-1]); position j scores label j+1.
    """
    targets = labels[:, 1:]
    mask = targets != -100
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return logp * mask, mask.float()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / sum(mask), the token average used by every loss here."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def retain_nll(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 1: mean negative log-likelihood of the retain answer tokens."""
    return -masked_mean(logp, mask)


def ga_token_loss(logp: torch.Tensor) -> torch.Tensor:
    """Eq. 2a: gradient-ascent token loss l_t = log p_t (minimising it lowers p_t)."""
    return logp


def npo_token_loss(logp: torch.Tensor, ref_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 2b: token-level NPO, -(2/beta) log sigmoid(-beta (log p_t - log p_ref_t)).

    Bounded below by 0 and saturating once p_t << p_ref_t, so forgotten tokens stop pulling.
    """
    return -(2.0 / beta) * F.logsigmoid(-beta * (logp - ref_logp))


def forget_token_loss(
    kind: str, logp: torch.Tensor, ref_logp: torch.Tensor | None, beta: float
) -> torch.Tensor:
    """Eq. 2a or 2b by name ('ga' or 'npo')."""
    if kind == "ga":
        return ga_token_loss(logp)
    if kind == "npo":
        if ref_logp is None:
            raise ValueError("the NPO token loss needs the reference model's log-probabilities")
        return npo_token_loss(logp, ref_logp, beta)
    raise ValueError(f"forget loss must be 'ga' or 'npo', got {kind!r}")


def conflict_scores(
    token_losses: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    params: dict[str, torch.Tensor],
    retain_grad: dict[str, torch.Tensor],
) -> torch.Tensor:
    """Eq. 3 for every token at once: c = J_l(theta) g_r, one forward-mode pass (JVP).

    ``token_losses(params)`` returns the per-token forget losses [B, T] of a functional model call;
    ``retain_grad`` holds grad_theta L_r for the same parameter names. Returns c [B, T].
    """
    primals = {name: params[name].detach() for name in retain_grad}
    tangents = {name: retain_grad[name].detach() for name in retain_grad}
    _, scores = torch.func.jvp(token_losses, (primals,), (tangents,))
    return scores


def standardise(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """z(c) of Eq. 5: zero mean, unit variance over the masked tokens (0 elsewhere)."""
    mean = masked_mean(values, mask)
    std = masked_mean((values - mean) ** 2, mask).sqrt()
    return (values - mean) / (std + eps) * mask


def robust_standardise(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Eq. 5b: (c - median) / (IQR / 1.349) over the masked tokens (0 elsewhere); a few
    outliers do not set the scale, unlike the mean / standard deviation of ``standardise``."""
    kept = values[mask.bool()]
    median = kept.median()
    iqr = torch.quantile(kept, 0.75) - torch.quantile(kept, 0.25)
    return (values - median) / (iqr / 1.349 + eps) * mask


def masked_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5c: the rank of each masked value among the masked values, scaled to [0, 1]."""
    kept = mask.bool()
    ranks = torch.zeros_like(values, dtype=torch.float32)
    order = values[kept].argsort().argsort().float()
    ranks[kept] = order / max(int(kept.sum()) - 1, 1)
    return ranks


def relevance_targets(
    scores: torch.Tensor, mask: torch.Tensor, temperature: float, kind: str = "rank"
) -> torch.Tensor:
    """Eq. 5: relevance targets in [0, 1], high where forgetting helps (or does not hurt) retention.

    ``z``: sigmoid(z(c)_t / tau); ``robust_z``: the same on median / IQR scores (Eq. 5b);
    ``rank``: the within-batch rank of c_t (Eq. 5c), scale free and blind to outliers.
    """
    if kind == "rank":
        return masked_ranks(scores, mask) * mask
    if kind == "robust_z":
        return torch.sigmoid(robust_standardise(scores, mask) / temperature) * mask
    if kind == "z":
        return torch.sigmoid(standardise(scores, mask) / temperature) * mask
    raise ValueError(f"relevance target must be 'rank', 'robust_z' or 'z', got {kind!r}")


class RelevanceScorer(nn.Module):
    """Eq. 4: the linear scorer s_t = psi^T sg(h_t) + b over (detached) hidden states.

    Initialised at zero, so every token starts with the same weight (sample-level unlearning).
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, D] -> logits s [B, T] (the hidden states are detached here)."""
        return self.linear(hidden.detach().float()).squeeze(-1)


def scorer_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 6: binary cross-entropy of the scorer's logits against the relevance targets."""
    losses = F.binary_cross_entropy_with_logits(logits, targets.detach(), reduction="none")
    return masked_mean(losses, mask)


def normalise_budget(
    weights: torch.Tensor, mask: torch.Tensor, budget: float = 1.0
) -> torch.Tensor:
    """Eq. 7: wbar = B * w / mean_m(w), so the mean weight over answer tokens is exactly B."""
    weights = weights.clamp(min=0) * mask
    return budget * weights / masked_mean(weights, mask).clamp(min=1e-12)


def weighted_forget_loss(
    token_loss: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """First term of Eq. 8: sum_t m_t wbar_t l_t / sum_t m_t (weights are treated as constants)."""
    return masked_mean(weights.detach() * token_loss, mask)


def atwu_objective(
    token_loss: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    retain_loss: torch.Tensor,
    retain_weight: float,
) -> torch.Tensor:
    """Eq. 8: the token-weighted forget loss plus lambda times the retain loss."""
    return weighted_forget_loss(token_loss, weights, mask) + retain_weight * retain_loss
