"""The six-component causal evaluation protocol, on per-state tables of exact step returns.

Given, for N evaluation states, the exact return R_k(s) of the readout after every k
(``returns`` [N, K]: exact Q*/V* for grids, log-likelihood for language, negative squared distance
to the expert action for robotics) and an allocation K(s) (``steps`` [N]):

  C1 matched budget      AIC vs fixed K = round(mean K_AIC)
  C2 frontier            return vs mean steps: AIC over a price sweep, fixed K over 1..K_max
  C3 targeted removal    starting from full compute (K_max on every state), cut the fraction q
                         of states AIC gives the most steps to one step, vs removing exactly
                         the same number of steps from randomly chosen states
  C4 reverse control     the same number of steps removed from AIC's lowest-compute states
                         (should hurt no more than random); and its other half, addition:
                         starting from AIC's allocation, add steps where AIC stopped soonest,
                         to random states, or where AIC spent most (should gain least, middle,
                         most)
  C5 dose-response       C3 over several fractions
  C6 validity            Spearman correlation of K_AIC with the true difficulty, and a
                         shuffled-allocation control (same histogram of K, permuted over states)

Only C3's targeted-vs-random ablation is stated in the abstract; the other five are
reconstructed (see README). Paired bootstrap intervals come from papers_eval.bootstrap_ci.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import spearmanr

from papers_eval import bootstrap_ci


def value_of(returns: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per-state return of an allocation: R_{K(s)}(s), [N]."""
    return returns[torch.arange(returns.shape[0]), steps.long() - 1]


def remove_steps(steps: torch.Tensor, amount: int, order: torch.Tensor) -> torch.Tensor:
    """Remove exactly ``amount`` steps, visiting states in ``order`` and cutting each towards
    one step (the last visited state is cut only partly)."""
    steps = steps.clone()
    removable = int((steps - 1).sum())
    if not 0 <= amount <= removable:
        raise ValueError(f"cannot remove {amount} steps; only {removable} are above one step")
    left = amount
    for i in order.tolist():
        if left == 0:
            break
        cut = min(int(steps[i]) - 1, left)
        steps[i] -= cut
        left -= cut
    return steps


def add_steps(steps: torch.Tensor, amount: int, order: torch.Tensor, k_max: int) -> torch.Tensor:
    """Add exactly ``amount`` steps, visiting states in ``order`` and raising each towards
    ``k_max`` (the last visited state is raised only partly)."""
    steps = steps.clone()
    room = int((k_max - steps).sum())
    if not 0 <= amount <= room:
        raise ValueError(f"cannot add {amount} steps; only {room} fit below k_max={k_max}")
    left = amount
    for i in order.tolist():
        if left == 0:
            break
        extra = min(k_max - int(steps[i]), left)
        steps[i] += extra
        left -= extra
    return steps


def addition_control(
    returns: torch.Tensor, steps: torch.Tensor, fraction: float, n_random: int = 10, seed: int = 0
) -> dict:
    """C4's addition half: add fraction x AIC's total steps to AIC's allocation, (a) where AIC
    stopped soonest, (b) at random, (c) where AIC spent most; the gains in exact return, with a
    paired bootstrap interval of (random - stopped-soonest) over states."""
    k_max = returns.shape[1]
    n = steps.shape[0]
    amount = min(round(fraction * int(steps.sum())), int((k_max - steps).sum()))
    generator = torch.Generator().manual_seed(seed)
    jitter = 0.5 * torch.rand(n, generator=generator)  # random order among equal K
    base = value_of(returns, steps)

    def gain(order: torch.Tensor) -> np.ndarray:
        return (value_of(returns, add_steps(steps, amount, order, k_max)) - base).numpy()

    soonest = gain(torch.argsort(steps.double() + jitter))
    most = gain(torch.argsort(steps.double() + jitter, descending=True))
    random = np.mean(
        [gain(torch.randperm(n, generator=generator)) for _ in range(n_random)], axis=0
    )
    return {
        "fraction": fraction,
        "added_steps": amount,
        "gain_where_aic_stopped_soonest": float(soonest.mean()),
        "gain_random": float(random.mean()),
        "gain_where_aic_spent_most": float(most.mean()),
        "random_minus_stopped_soonest_ci": bootstrap_ci(random - soonest, seed=seed),
    }


def removal_arms(
    priority: torch.Tensor, base: torch.Tensor, fraction: float, n_random: int, seed: int
) -> dict:
    """C3/C4 arms on a base allocation (the full-compute policy, K_max everywhere): targeted
    cuts the round(fraction * N) states AIC gives the most steps (``priority``) to one step;
    random and reverse (AIC's lowest-compute states first) remove exactly as many steps."""
    n = base.shape[0]
    generator = torch.Generator().manual_seed(seed)
    jitter = 0.5 * torch.rand(n, generator=generator)  # random order among equal K
    cut = torch.argsort(priority.double() + jitter, descending=True)[: round(fraction * n)]
    targeted = base.clone()
    targeted[cut] = 1
    amount = int(base.sum() - targeted.sum())
    reverse_order = torch.argsort(priority.double() + jitter)
    return {
        "amount": amount,
        "targeted": targeted,
        "reverse": remove_steps(base, amount, reverse_order),
        "random": [
            remove_steps(base, amount, torch.randperm(n, generator=generator))
            for _ in range(n_random)
        ],
    }


def removal_curve(
    returns: torch.Tensor,
    priority: torch.Tensor,
    fractions: list[float],
    n_random: int = 10,
    seed: int = 0,
) -> list[dict]:
    """C3-C5: return drops of the targeted, random and reverse arms at each fraction, from the
    full-compute allocation, with a paired bootstrap interval of (targeted - random) over states."""
    base = torch.full_like(priority, returns.shape[1])
    full = value_of(returns, base)
    rows = []
    for fraction in fractions:
        arms = removal_arms(priority, base, fraction, n_random, seed)
        drop_targeted = (full - value_of(returns, arms["targeted"])).numpy()
        drop_reverse = (full - value_of(returns, arms["reverse"])).numpy()
        drop_random = np.mean(
            [(full - value_of(returns, s)).numpy() for s in arms["random"]], axis=0
        )
        difference = drop_targeted - drop_random
        rows.append(
            {
                "fraction": fraction,
                "removed_steps": arms["amount"],
                "drop_targeted": float(drop_targeted.mean()),
                "drop_random": float(drop_random.mean()),
                "drop_reverse": float(drop_reverse.mean()),
                "targeted_minus_random": float(difference.mean()),
                "targeted_minus_random_ci": bootstrap_ci(difference, seed=seed),
                "random_minus_reverse": float((drop_random - drop_reverse).mean()),
            }
        )
    return rows


def validity(steps: torch.Tensor, difficulty: torch.Tensor, returns: torch.Tensor, seed: int = 0):
    """C6: Spearman(K, difficulty) and the return lost by shuffling the allocation."""
    keep = difficulty >= 0  # language noise characters (label -1) have no defined difficulty
    rho = spearmanr(steps[keep].numpy(), difficulty[keep].numpy()).statistic
    generator = torch.Generator().manual_seed(seed)
    shuffled = steps[torch.randperm(steps.shape[0], generator=generator)]
    loss = (value_of(returns, steps) - value_of(returns, shuffled)).numpy()
    return {
        "spearman_steps_vs_difficulty": float(rho) if np.isfinite(rho) else None,
        "shuffled_allocation_return_drop": float(loss.mean()),
        "shuffled_allocation_return_drop_ci": bootstrap_ci(loss, seed=seed),
    }


def matched_budget(returns: torch.Tensor, steps: torch.Tensor) -> dict:
    """C1: AIC vs the fixed K with the same (rounded) mean compute, paired over states."""
    k = int(min(max(round(float(steps.float().mean())), 1), returns.shape[1]))
    gain = (value_of(returns, steps) - returns[:, k - 1]).numpy()
    return {"matched_k": k, "aic_minus_fixed": float(gain.mean()), "ci": bootstrap_ci(gain)}
