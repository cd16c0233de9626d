"""V-pretraining for language: top-K soft targets valued by one forward-mode pass.

Notation. The learner is a causal LM with parameters theta; an unlabeled batch holds token ids
x [B, T+1]; at position t the learner predicts the observed next token y_t = x_{t+1} with
log-probabilities log p_theta(v | x_<=t). A small feedback set gives the downstream loss
L_down(theta) (answer NLL) and its gradient g_down. P is a diagonal preconditioner (identity, or
Adam's 1 / (sqrt(v_hat) + eps) frozen at the current optimizer state [R]).

    (1) soft-target SSL loss   L_ssl(theta; q) = -(1/N) sum_t sum_v q_t(v) log p_theta(v | x_<=t)
    (2) one learner step       theta' = theta - eta P grad L_ssl(theta; q)
    (3) value of q             V(q) = L_down(theta) - L_down(theta')
                                    ~= eta <P g_down, grad L_ssl(theta; q)>          (first order)
                                     = -(eta/N) sum_t sum_v q_t(v) D_t(v)
    (4) per-token directions   D_t(v) = <P g_down, grad_theta log p_theta(v | x_<=t)>

(1) is linear in q, so (3) needs only D, and every D_t(v) comes from ONE Jacobian-vector product
of the log-softmax along the tangent u = P g_down (``log_probs_and_directions``).

    (5) candidates             C_t = top-K of the learner (detached) plus the observed y_t
    (6) designed targets [R]   q_t = (1 - lambda_t) onehot(y_t) + lambda_t softmax_{C_t}(s_t / tau)
                               lambda_t = lambda_max sigmoid(a_t)
    (7) designer loss [R]      -V(q) / scale + kappa KL(q_t || r_t) - mu H(q_t),
                               r_t = the observed token smoothed by epsilon over C_t
    (8) in-family control      q*_t = (1 - lambda_max) onehot(y_t) + lambda_max onehot(c_t)
                               where y_t is corrupted and its clean token c_t is in C_t's
                               top-K; q*_t = onehot(y_t) elsewhere (a member of family (6))

(3) is exact to first order only for the step (2) with P = identity, i.e. plain SGD; under
AdamW the realised step is not eta g, which is why the claim runs SGD arms beside AdamW ones.
The value may be restricted to a set of positions (a mask in (1), (3), (7), e.g. the answer
digits of the stream) as an option.

The designer steps on (7) with D detached (no second-order term through the learner); the
learner steps on (1) with q detached, so downstream labels never reach its parameters.
Reconstructions ([R]) are the paper-note's guesses: the designer's form (6), its regularisers
(7), Adam's preconditioner and the refresh of g_down every R steps by an EMA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call, jvp

OBSERVED = 0  # slot of the observed token among the K + 1 candidates; slots 1..K: learner top-K


def candidates(log_probs: torch.Tensor, observed: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. (5): the observed token (slot 0) and the learner's top-K tokens, [B, T, K+1].

    The observed token may also be among the top-K; the duplicate is harmless because every
    use of the slots is linear (its mass simply adds up on one token)."""
    top = log_probs.detach().topk(k, dim=-1).indices  # [B, T, K]
    return torch.cat([observed.unsqueeze(-1), top], dim=-1)


def soft_targets(
    mixing: torch.Tensor, scores: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Eq. (6): target weights over the K+1 candidate slots, [B, T, K+1].

    ``mixing`` lambda_t [B, T] in [0, 1]; ``scores`` s_t [B, T, K] over the top-K slots. Slot 0
    gets 1 - lambda_t, the top-K slots share lambda_t by a softmax of s_t / tau."""
    spread = torch.softmax(scores / temperature, dim=-1) * mixing.unsqueeze(-1)  # [B, T, K]
    return torch.cat([(1.0 - mixing).unsqueeze(-1), spread], dim=-1)


def in_family_targets(
    slots: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor, lambda_max: float
) -> torch.Tensor:
    """Eq. (8): the in-family positive control's targets over the K+1 slots, [B, T, K+1].

    ``slots`` [B, T, K+1] from eq. (5), ``clean`` [B, T] the right token, ``corrupted`` [B, T]
    (bool) where the observed token is wrong. Where corrupted and ``clean`` is one of the top-K
    slots (1..K), lambda_max goes to its first such slot and 1 - lambda_max stays on the observed
    slot 0; everywhere else the one-hot observed token. This is the member of the designer's
    family (6) with lambda_t in {0, lambda_max} and all of the top-K mass on one candidate."""
    hits = slots[..., 1:] == clean.unsqueeze(-1)  # [B, T, K]
    reachable = corrupted.bool() & hits.any(-1)  # [B, T]
    first = hits & (hits.cumsum(-1) == 1)  # the first top-K slot holding the clean token
    mixing = reachable.to(torch.float32) * lambda_max  # [B, T]
    spread = first.to(torch.float32) * mixing.unsqueeze(-1)  # [B, T, K]
    return torch.cat([(1.0 - mixing).unsqueeze(-1), spread], dim=-1)


def to_vocabulary(weights: torch.Tensor, slots: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The distribution over the vocabulary that slot weights describe, [B, T, V]."""
    dense = weights.new_zeros(*weights.shape[:-1], vocab_size)
    return dense.scatter_add_(-1, slots, weights)


def soft_cross_entropy(
    log_probs_at: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. (1): -(1/N) sum_t sum_slots q_t log p_t over the N unmasked positions.

    ``log_probs_at`` [B, T, S] (learner log-probabilities gathered at the slots), ``weights``
    [B, T, S] (the targets, detached by the caller for the learner step), ``mask`` [B, T]."""
    per_position = -(weights * log_probs_at).sum(-1)  # [B, T]
    if mask is None:
        return per_position.mean()
    return (per_position * mask).sum() / mask.sum().clamp_min(1)


def predicted_decrease(
    weights: torch.Tensor,
    directions: torch.Tensor,
    lr: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. (3): V(q) = -(eta/N) sum_t sum_slots q_t D_t, the first-order decrease of the
    downstream loss after one learner step on L_ssl(q); ``directions`` D [B, T, S] from eq. (4)."""
    per_position = (weights * directions).sum(-1)  # [B, T]
    n = per_position.numel() if mask is None else mask.sum().clamp_min(1)
    if mask is not None:
        per_position = per_position * mask
    return -lr * per_position.sum() / n


def log_probs_and_directions(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    tangent: Mapping[str, torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. (4) in one forward-mode pass: (log p [B, T, V], D [B, T, V], last hidden [B, T, H]).

    D_t(v) = <tangent, grad_theta log p_theta(v | x_<=t)> for every position and token, from
    ``torch.func.jvp`` of the log-softmax through ``functional_call``. Parameters missing from
    ``tangent`` (frozen ones) get a zero tangent. Forward-mode AD needs the model's eager
    attention (formats.check_attention_supports_jvp)."""
    names = list(params)
    primals = tuple(params[name].detach() for name in names)
    tangents = tuple(
        tangent[name] if name in tangent else torch.zeros_like(params[name]) for name in names
    )

    def forward(*values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = functional_call(
            model,
            dict(zip(names, values, strict=True)),
            args=(),
            kwargs={
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "output_hidden_states": True,
            },
        )
        return log_softmax_at_least_fp32(out.logits), out.hidden_states[-1]

    (log_probs, hidden), (directions, _) = jvp(forward, primals, tangents)
    return log_probs, directions, hidden


def log_softmax_at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax over the vocabulary in float32 or wider (bf16 logits lose the tail)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)


def adam_preconditioner(
    optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """P = diag(1 / (sqrt(v_hat) + eps)) from an Adam(W) state, frozen at this step [R].

    A parameter without state yet (before Adam's first step) gets P = 1: that first step is
    sign-like, which no fixed diagonal matches, so identity is the honest guess."""
    by_id = {id(p): name for name, p in named_params.items()}
    scales = {name: torch.ones_like(p) for name, p in named_params.items()}
    for group in optimizer.param_groups:
        beta2, eps = group["betas"][1], group["eps"]
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if id(p) not in by_id or "exp_avg_sq" not in state:
                continue
            step = float(state["step"])
            v_hat = state["exp_avg_sq"] / (1.0 - beta2**step)
            scales[by_id[id(p)]] = 1.0 / (v_hat.sqrt() + eps)
    return scales


def mass_by_rank(weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean target mass per top-K rank over the (masked) positions, [K]: sum_k of it is the
    mean mixing weight lambda_t; ``weights`` [B, T, K+1] from eq. (6), ``mask`` [B, T]."""
    top = weights[..., 1:].flatten(0, -2)  # [N, K]
    if mask is None:
        return top.mean(0)
    keep = mask.flatten().to(top.dtype)
    return (top * keep.unsqueeze(-1)).sum(0) / keep.sum().clamp_min(1)


def score_entropy(scores: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean entropy (nats) of softmax(s_t / tau) over the top-K, the spread eq. (6) gives the
    moved mass; log K when flat, 0 when on one candidate. ``scores`` [B, T, K]."""
    log_p = torch.log_softmax(scores / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(-1).mean()


def designer_regularisers(
    weights: torch.Tensor, smoothing: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (7)'s terms [R]: (mean KL(q_t || r_t), mean H(q_t)) over positions.

    r_t puts 1 - smoothing on the observed slot and smoothing / K on each top-K slot, so the KL
    is finite everywhere and zero exactly when q_t = r_t."""
    k = weights.shape[-1] - 1
    reference = torch.full_like(weights, smoothing / k)
    reference[..., OBSERVED] = 1.0 - smoothing
    safe = weights.clamp_min(1e-12)
    kl = (weights * (safe.log() - reference.log())).sum(-1)  # [B, T]
    entropy = -(weights * safe.log()).sum(-1)  # [B, T]
    if mask is None:
        return kl.mean(), entropy.mean()
    n = mask.sum().clamp_min(1)
    return (kl * mask).sum() / n, (entropy * mask).sum() / n


class TargetDesigner(nn.Module):
    """The lightweight designer of eq. (6) [R]: per position, from detached learner features,
    a mixing weight lambda_t = lambda_max sigmoid(a_t) and scores s_t over the top-K.

    Inputs per position: the learner's last hidden state h_t [H], and per candidate slot its
    log-probability and whether it is the observed token. a_t reads h_t and three summaries of
    the learner's belief (log p(y_t), the top-1 log-probability, their gap); s_t is the learner's
    own candidate log-probability, scaled and shifted by a learned per-rank bias and a read-out
    of h_t."""

    def __init__(self, hidden_size: int, k: int, width: int = 64, lambda_max: float = 0.9):
        super().__init__()
        self.k = k
        self.lambda_max = lambda_max
        self.mixing = nn.Sequential(
            nn.Linear(hidden_size + 3, width), nn.GELU(), nn.Linear(width, 1)
        )
        self.rank_bias = nn.Sequential(
            nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, k)
        )
        self.score_scale = nn.Parameter(torch.ones(()))
        # Start near the one-hot target (lambda_t ~ lambda_max * 0.05): the designer must earn
        # every bit of mass it moves.
        nn.init.zeros_(self.mixing[-1].weight)
        nn.init.constant_(self.mixing[-1].bias, -3.0)
        nn.init.zeros_(self.rank_bias[-1].weight)
        nn.init.zeros_(self.rank_bias[-1].bias)

    def forward(
        self, hidden: torch.Tensor, log_probs_at: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(lambda [B, T], scores [B, T, K]) from hidden [B, T, H] and slot log-probs
        [B, T, K+1] (both detached by the caller)."""
        observed = log_probs_at[..., OBSERVED]
        top1 = log_probs_at[..., 1]
        belief = torch.stack([observed, top1, top1 - observed], dim=-1)
        mixing = self.lambda_max * torch.sigmoid(
            self.mixing(torch.cat([hidden, belief], dim=-1)).squeeze(-1)
        )
        scores = self.score_scale * log_probs_at[..., 1:] + self.rank_bias(hidden)
        return mixing, scores


def answer_nll(
    log_probs_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    answer_mask: torch.Tensor,
) -> torch.Tensor:
    """The downstream loss per problem: mean NLL of its answer tokens given the prompt, [B].

    ``answer_mask`` [B, L] marks the answer tokens of ``input_ids`` [B, L]; the token at i is
    predicted from position i - 1. ``log_probs_fn(input_ids, attention_mask)`` -> [B, L, V]."""
    log_probs = log_probs_fn(input_ids, attention_mask)[:, :-1]  # [B, L-1, V]
    target = input_ids[:, 1:]
    picked = log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, L-1]
    mask = answer_mask[:, 1:].to(picked.dtype)
    return -(picked * mask).sum(-1) / mask.sum(-1).clamp_min(1)
