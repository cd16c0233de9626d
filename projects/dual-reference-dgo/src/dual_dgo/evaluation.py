"""Evaluation measures of the claim: budget-matched accuracy, the difficulty probe, the
precondition. These are this implementation's definitions (README, "Reconstructed vs stated").

Per-prompt arrays come from ``DualDgoModule.evaluate_prompts``: ``p_fast`` (exact),
``{fast,slow}_correct`` and ``{fast,slow}_tokens`` (greedy decodes forced into each mode) and
``difficulty``. A routing rule is P(slow) per prompt; its expected correctness and tokens are
exact mixtures of the two forced decodes (``model.chosen``).
"""

from __future__ import annotations

import numpy as np
import torch

from dual_dgo.model import chosen


def matched_correctness(arrays: dict[str, np.ndarray], target_tokens: float) -> np.ndarray:
    """A model's per-prompt expected correctness at ``target_tokens`` mean tokens.

    Its greedy choices are kept and a uniformly random share of them is switched to the other
    mode (slow -> fast when it spends more than the target, fast -> slow when less) until the
    expected mean tokens equal the target: a difficulty-blind move along the line between the
    model's operating point and its forced-fast (or forced-slow) point. When even switching
    every prompt cannot reach the target, every prompt is switched.
    """
    greedy = chosen(arrays)["p_slow"]
    spread = arrays["slow_tokens"] - arrays["fast_tokens"]  # [n] tokens saved per switch
    own = chosen(arrays)["tokens"].mean()
    if own > target_tokens:
        room = (greedy * spread).mean()
        share = 1.0 if room <= 0 else min(1.0, (own - target_tokens) / room)
        p_slow = greedy * (1 - share)
    else:
        room = ((1 - greedy) * spread).mean()
        share = 1.0 if room <= 0 else min(1.0, (target_tokens - own) / room)
        p_slow = greedy + (1 - greedy) * share
    return chosen(arrays, p_slow)["correct"]


def gain_at_matched_tokens(
    subject: dict[str, np.ndarray],
    baseline: dict[str, np.ndarray],
    p_slow: np.ndarray | None = None,
) -> np.ndarray:
    """Per prompt: the subject's correctness minus the baseline's at the subject's mean tokens."""
    picked = chosen(subject, p_slow)
    return picked["correct"] - matched_correctness(baseline, float(picked["tokens"].mean()))


def ridge_probe_r2(
    train_x: torch.Tensor,
    train_y: np.ndarray,
    test_x: torch.Tensor,
    test_y: np.ndarray,
    l2: float = 1.0,
) -> float:
    """R^2 on held-out prompts of a ridge regression of the difficulty on frozen features."""

    def design(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)

    a, b = design(train_x), torch.as_tensor(train_y, dtype=torch.float64)
    ridge = l2 * torch.eye(a.shape[1], dtype=a.dtype)
    ridge[-1, -1] = 0.0  # no penalty on the intercept
    weights = torch.linalg.solve(a.T @ a + ridge, a.T @ b)
    prediction = (design(test_x) @ weights).numpy()
    residual = ((test_y - prediction) ** 2).sum()
    total = ((test_y - test_y.mean()) ** 2).sum()
    return float(1 - residual / total)


def accuracy_by_difficulty(arrays: dict[str, np.ndarray], mode: str, levels: list[int]) -> float:
    """Forced-``mode`` greedy accuracy on the prompts whose difficulty is in ``levels``."""
    keep = np.isin(arrays["difficulty"], levels)
    return float(arrays[f"{mode}_correct"][keep].mean())


def fast_rate_by_difficulty(arrays: dict[str, np.ndarray], k_max: int) -> list[float]:
    """Mean P(fast) per difficulty 1..k_max (NaN where a level has no prompt)."""
    return [
        float(arrays["p_fast"][arrays["difficulty"] == k].mean())
        if (arrays["difficulty"] == k).any()
        else float("nan")
        for k in range(1, k_max + 1)
    ]
