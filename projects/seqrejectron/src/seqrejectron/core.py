"""SeqRejectron: selective imitation under dynamics shift, in numpy and torch (no Lightning, I/O).

Notation. Labelled expert trajectories in the train dynamics P: D_P = {(s^i_{1:T_i}, a^i_{1:T_i})},
i <= n. Unlabelled expert state trajectories in the test dynamics Q: D_Q = {s~^j_{1:T_j}}, j <= m.
pi-hat is behaviour cloning on D_P. A set V of validator policies defines the stopping time

    tau_V(s_{1:T}) = min{t : exists v in V, v(s_t) != pi-hat(s_t)}      (inf if none)      (Eq. 1)

SeqRejectron (deterministic; reconstructed from Rejectron, see README) adds validators while one
scores above epsilon, the score being trajectory-level:

    S(v) = 1/m sum_j 1[exists t < tau_V(s~^j): v(s~^j_t) != pi-hat(s~^j_t)]
           - Lambda * 1/n sum_i 1[exists t: v(s^i_t) != a^i_t]                              (Eq. 2)

Each accepted validator cuts at least epsilon of the test prefixes not yet cut, so |V| <= 1/eps.

Stochastic policies: the per-step squared Hellinger distance between pi-hat and a validator,

    H^2(p, q) = 1 - sum_a sqrt(p_a q_a)                          (categorical, Eq. 3)
    H^2(N(m1, s1^2), N(m2, s2^2)) = 1 - sqrt(2 s1 s2 / (s1^2 + s2^2))
                                      * exp(-(m1 - m2)^2 / (4 (s1^2 + s2^2)))   (Gaussian, Eq. 4)

(product over dimensions of the Bhattacharyya coefficients for a diagonal Gaussian), and the
cumulative Hellinger stopping time

    tau_eta = min{t : sum_{u <= t} max_{v in V} H^2(pi-hat(.|s_u), v(.|s_u)) >= eta}       (Eq. 5)

with eta calibrated on held-out train trajectories.

The neural relaxation of the argmax in Eq. 2 (after Detectron's disagreement loss): starting from
pi-hat, minimise

    L(v) = Lambda * CE(v(s^i_t), a^i_t)
           + sum_j w_j sum_{t < tau_V} -log(1 - v(pi-hat(s~^j_t) | s~^j_t))
                                                                                         (Eq. 6)

with w_j = 1 / (m * prefix length) so each test trajectory counts once (trajectory weighting).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

INF = np.iinfo(np.int64).max


def check_epsilon(epsilon: float) -> float:
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon must lie in (0, 1), got {epsilon}")
    return float(epsilon)


def first_true(flags: np.ndarray) -> int:
    """Index of the first True in a [T] bool array, INF if none (Eq. 1 for one trajectory)."""
    hits = np.flatnonzero(flags)
    return int(hits[0]) if len(hits) else INF


def stop_times(disagreements: Sequence[np.ndarray]) -> np.ndarray:
    """tau_V per trajectory (Eq. 1) from per-step disagreement flags [T_j] (any validator)."""
    return np.array([first_true(d) for d in disagreements], dtype=np.int64)


def prefix_cut(disagreements: Sequence[np.ndarray], taus: np.ndarray) -> np.ndarray:
    """1[exists t < tau_j: d_jt] per trajectory: the first term of Eq. 2 before averaging."""
    return np.array(
        [
            bool(np.any(d[: min(int(tau), len(d))]))
            for d, tau in zip(disagreements, taus, strict=True)
        ]
    )


def validator_score(
    test_disagree: Sequence[np.ndarray],
    test_taus: np.ndarray,
    train_disagree: Sequence[np.ndarray],
    lam: float,
) -> tuple[float, float, float]:
    """S(v) of Eq. 2 and its two parts: (score, test-prefix cut rate, train disagreement rate).

    ``test_disagree[j][t]`` = v(s~^j_t) != pi-hat(s~^j_t); ``train_disagree[i][t]`` =
    v(s^i_t) != a^i_t.
    """
    cut = float(prefix_cut(test_disagree, test_taus).mean())
    train = float(np.mean([bool(np.any(d)) for d in train_disagree])) if train_disagree else 0.0
    return cut - lam * train, cut, train


def accepts(score: float, train_rate: float, epsilon: float) -> bool:
    """The loop's acceptance rule [R]: a candidate joins V when S(v) > epsilon (Eq. 2) and it
    disagrees with the expert on at most epsilon/2 of the train trajectories (the design note's
    explicit train-agreement check); otherwise the search ends."""
    return score > epsilon and train_rate <= epsilon / 2


def prefix_lengths(taus: np.ndarray, lengths: Sequence[int]) -> list[int]:
    """min(tau_j, T_j): how many leading states of each test trajectory are not yet stopped
    (the states Eq. 6's disagreement term acts on)."""
    return [min(int(t), int(n)) for t, n in zip(taus, lengths, strict=True)]


def advance_stop_times(taus: np.ndarray, test_disagree: Sequence[np.ndarray]) -> np.ndarray:
    """tau_{V + v} (Eq. 1) from tau_V and the accepted validator's per-step disagreements."""
    return np.minimum(taus, stop_times(test_disagree))


# ---------------------------------------------------------------------------------------------
# Exact search over a small policy class: all tables z -> action over n_z abstract states.


def all_tables(n_z: int, n_actions: int) -> np.ndarray:
    """Every deterministic policy z -> a: [n_actions ** n_z, n_z]."""
    return np.array(list(itertools.product(range(n_actions), repeat=n_z)), dtype=np.int64)


def pair_masks(
    zs: Sequence[np.ndarray], actions: Sequence[np.ndarray], n_actions: int
) -> np.ndarray:
    """Bitmask of the (z, a) pairs each trajectory contains: bit z * n_actions + a. [N]."""
    return np.array(
        [
            np.bitwise_or.reduce(1 << (z * n_actions + a)) if len(z) else 0
            for z, a in zip(zs, actions, strict=True)
        ],
        dtype=np.int64,
    )


def table_agreement_masks(tables: np.ndarray, n_actions: int) -> np.ndarray:
    """For each table, the bitmask of the (z, table[z]) pairs it agrees with. [K]."""
    bits = np.left_shift(1, np.arange(tables.shape[1]) * n_actions + tables)  # [K, n_z]
    return np.bitwise_or.reduce(bits, axis=1)


def exact_search(
    tables: np.ndarray,
    n_actions: int,
    test_z: Sequence[np.ndarray],
    test_pihat: Sequence[np.ndarray],
    train_z: Sequence[np.ndarray],
    train_expert: Sequence[np.ndarray],
    epsilon: float,
    lam: float,
    max_rounds: int | None = None,
) -> tuple[list[int], list[dict]]:
    """SeqRejectron's loop (Eq. 2) with the argmax taken by enumerating every table.

    A table disagrees with pi-hat somewhere in a prefix iff the prefix holds a pair (z, pi-hat)
    outside the table's agreement mask. Returns the chosen table indices and one diagnostic
    dict per round (S, |V|, cut rate, train disagreement).
    """
    check_epsilon(epsilon)
    max_rounds = max_rounds or math.ceil(1 / epsilon)
    agree = table_agreement_masks(tables, n_actions)  # [K]
    train_masks = pair_masks(train_z, train_expert, n_actions)  # [n]
    train_dis = ((train_masks[None, :] & ~agree[:, None]) != 0).mean(axis=1)  # [K]
    taus = np.full(len(test_z), INF, dtype=np.int64)
    chosen, rounds = [], []
    for _ in range(max_rounds):
        prefixes = [
            (z[: min(int(t), len(z))], a[: min(int(t), len(a))])
            for z, a, t in zip(test_z, test_pihat, taus, strict=True)
        ]
        masks = pair_masks([p[0] for p in prefixes], [p[1] for p in prefixes], n_actions)
        cut = ((masks[None, :] & ~agree[:, None]) != 0).mean(axis=1)  # [K]
        scores = cut - lam * train_dis
        best = int(np.argmax(scores))
        rounds.append(
            {"score": float(scores[best]), "cut": float(cut[best]), "train": float(train_dis[best])}
        )
        if scores[best] <= epsilon:
            break
        chosen.append(best)
        table = tables[best]
        for j, (z, a) in enumerate(zip(test_z, test_pihat, strict=True)):
            taus[j] = min(taus[j], first_true(table[z] != a))
        rounds[-1]["size"] = len(chosen)
    return chosen, rounds


# ---------------------------------------------------------------------------------------------
# Hellinger closed forms and the cumulative stopping time.


def hellinger_sq_categorical(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Eq. 3: 1 - sum_a sqrt(p_a q_a) over the last axis. [..., A] x [..., A] -> [...].
    At most 1 by construction; the clamp at 0 absorbs rounding when p = q."""
    return (1 - torch.sqrt(p * q).sum(-1)).clamp(min=0)


def hellinger_sq_gaussian(
    mean1: torch.Tensor, std1: torch.Tensor, mean2: torch.Tensor, std2: torch.Tensor
) -> torch.Tensor:
    """Eq. 4 for diagonal Gaussians: 1 - prod_d BC_d over the last axis. [..., D] -> [...]."""
    var = std1.pow(2) + std2.pow(2)
    log_bc = 0.5 * torch.log(2 * std1 * std2 / var) - (mean1 - mean2).pow(2) / (4 * var)
    return (1 - torch.exp(log_bc.sum(-1))).clamp(min=0)  # at most 1: exp > 0


def cumulative_stop_time(divergences: np.ndarray, eta: float) -> int:
    """Eq. 5: the first t with sum_{u <= t} d_u >= eta, INF if never."""
    return first_true(np.cumsum(divergences) >= eta)


def calibrate_threshold(max_scores: np.ndarray, rate: float) -> float:
    """The smallest threshold kappa whose rule 'stop when score > kappa' stops at most ``rate``
    of the calibration trajectories (``max_scores``: each trajectory's largest score)."""
    ordered = np.sort(np.asarray(max_scores, dtype=np.float64))[::-1]
    allowed = int(math.floor(rate * len(ordered) + 1e-9))
    if allowed >= len(ordered):
        return -math.inf
    return float(ordered[allowed])


# ---------------------------------------------------------------------------------------------
# Policies and the neural relaxation.


def make_policy(in_features: int, hidden: int, n_actions: int) -> nn.Module:
    """pi-hat and the neural validators: [N, F] -> logits [N, A]."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


def disagreement_loss(
    logits: torch.Tensor, avoid: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The test term of Eq. 6: sum_k w_k * -log(1 - v(avoid_k | s_k)). logits [K, A], avoid [K]."""
    log_p = torch.log_softmax(logits, dim=-1)
    log_other = torch.logsumexp(
        log_p.masked_fill(nn.functional.one_hot(avoid, logits.shape[-1]).bool(), -math.inf), -1
    )
    return -(weights * log_other).sum()


def relaxed_loss(
    validator: nn.Module,
    train_x: torch.Tensor,
    train_a: torch.Tensor,
    test_x: torch.Tensor,
    test_avoid: torch.Tensor,
    test_w: torch.Tensor,
    lam: float,
) -> torch.Tensor:
    """Eq. 6: Lambda * CE on the train states + the weighted disagreement on test prefixes."""
    agree = nn.functional.cross_entropy(validator(train_x), train_a)
    if len(test_x) == 0:
        return lam * agree
    return lam * agree + disagreement_loss(validator(test_x), test_avoid, test_w)


def prefix_weights(lengths: Sequence[int], per_trajectory: bool) -> torch.Tensor:
    """w of Eq. 6: 1/(m * prefix length) per state (each trajectory counts once), or a flat
    1/(total states) when ``per_trajectory`` is False (the per-step, pooled-state variant)."""
    lengths = [int(n) for n in lengths if n > 0]
    if not lengths:
        return torch.zeros(0)
    if per_trajectory:
        return torch.cat([torch.full((n,), 1.0 / (len(lengths) * n)) for n in lengths])
    total = sum(lengths)
    return torch.full((total,), 1.0 / total)
