"""Evaluation measures of the claim: budget-matched accuracy, the difficulty probe, the
image ablation, the precondition. These are this implementation's definitions (README,
"Reconstructed vs stated").

Per-prompt arrays come from ``DualDgoModule.evaluate_prompts``: ``p_fast`` (exact),
``{fast,slow}_correct`` and ``{fast,slow}_tokens`` (greedy decodes forced into each mode) and
``difficulty`` (and ``source``: 0 / 1 for the miniature's two data sources, -1 otherwise).
A routing rule is P(slow) per prompt; its expected correctness and tokens are
exact mixtures of the two forced decodes (``model.chosen``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from dual_dgo.data import PromptItem
from dual_dgo.model import chosen


def random_switch_correctness(arrays: dict[str, np.ndarray], target_tokens: float) -> np.ndarray:
    """A model's per-prompt expected correctness at ``target_tokens`` mean tokens, switched blindly.

    Its greedy choices are kept and a uniformly random share of them is switched to the other
    mode (slow -> fast when it spends more than the target, fast -> slow when less) until the
    expected mean tokens equal the target: a difficulty-blind move along the line between the
    model's operating point and its forced-fast (or forced-slow) point. When even switching
    every prompt cannot reach the target, every prompt is switched. Reported beside the ranked
    rule: it throws away the model's own routing signal, so it flatters a rival that routes.
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


def ranked_switch_p_slow(arrays: dict[str, np.ndarray], target_tokens: float) -> np.ndarray:
    """P(slow) per prompt when a model goes fast on its OWN most-fast prompts first, until its
    expected mean tokens fall to ``target_tokens``.

    Prompts are taken in decreasing order of the model's P(fast); the prompt (or the group of
    prompts with one tied P(fast)) at which the mean tokens cross the target goes fast with the
    fraction that lands exactly on it (ties share that fraction: the expectation over random
    tie-breaking). Every threshold on P(fast), i.e. every constant bias added to the mode logit,
    is one point of this curve, so this is the rival's best use of its own routing score at the
    subject's budget. All slow when even that spends no more than the target; all fast when no
    prefix reaches it.
    """
    p_fast, n = arrays["p_fast"], len(arrays["p_fast"])
    saved = arrays["slow_tokens"] - arrays["fast_tokens"]  # [n] tokens saved by going fast
    p_slow = np.ones(n)
    tokens = arrays["slow_tokens"].mean()
    for level in np.unique(p_fast)[::-1]:  # most-fast first
        if tokens <= target_tokens:
            break
        group = p_fast == level
        saving = saved[group].sum() / n
        if saving > 0 and tokens - saving <= target_tokens:
            p_slow[group] = 1.0 - (tokens - target_tokens) / saving
            break
        p_slow[group] = 0.0
        tokens -= saving
    return p_slow


def gain_at_matched_tokens(
    subject: dict[str, np.ndarray],
    baseline: dict[str, np.ndarray],
    p_slow: np.ndarray | None = None,
    rule: str = "ranked",
) -> np.ndarray:
    """Per prompt: the subject's correctness minus the baseline's at the subject's mean tokens,
    the baseline moved there by ``rule``: ``ranked`` (its own P(fast) order, the registered
    comparison) or ``random`` (a blind share of its greedy choices switched, reported)."""
    picked = chosen(subject, p_slow)
    target = float(picked["tokens"].mean())
    if rule == "ranked":
        matched = chosen(baseline, ranked_switch_p_slow(baseline, target))["correct"]
    elif rule == "random":
        matched = random_switch_correctness(baseline, target)
    else:
        raise ValueError(f"rule must be 'ranked' or 'random', got {rule!r}")
    return picked["correct"] - matched


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


def count_swap_shift(p_fast: np.ndarray, p_fast_swapped: np.ndarray) -> float:
    """Mean over the same prompts of |P(fast) trained on the registered counts - P(fast) trained
    on the swapped ones|: a per-prompt shift, so a model that moves fast on one source and slow on
    the other by the same amount (a shift of the means would cancel) is caught."""
    if p_fast.shape != p_fast_swapped.shape:
        raise ValueError(f"the same prompts are needed: {p_fast.shape} != {p_fast_swapped.shape}")
    return float(np.abs(np.asarray(p_fast) - np.asarray(p_fast_swapped)).mean())


def fast_rate_by_source(arrays: dict[str, np.ndarray]) -> list[float]:
    """Mean P(fast) on the prompts of source a and of source b (NaN where none)."""
    return [
        float(arrays["p_fast"][arrays["source"] == s].mean())
        if (arrays["source"] == s).any()
        else float("nan")
        for s in (0, 1)
    ]


def fast_rate_by_difficulty(arrays: dict[str, np.ndarray], k_max: int) -> list[float]:
    """Mean P(fast) per difficulty 1..k_max (NaN where a level has no prompt)."""
    return [
        float(arrays["p_fast"][arrays["difficulty"] == k].mean())
        if (arrays["difficulty"] == k).any()
        else float("nan")
        for k in range(1, k_max + 1)
    ]


def ablate_images(items: list[PromptItem], how: str, seed: int) -> list[PromptItem]:
    """Copies of the prompts with the pixels taken away, the text and responses untouched.

    ``zeroed``: every pixel value 0. ``shuffled``: each image's pixel positions permuted (one
    seeded permutation per prompt, the same for every channel): the brightness histogram and so
    roughly the number of filled cells survive, the glyphs do not. A model that reads its answers
    from the pixels falls to chance (1 in 10) on both; one that reads them elsewhere does not.
    """
    if how not in ("zeroed", "shuffled"):
        raise ValueError(f"how must be 'zeroed' or 'shuffled', got {how!r}")
    generator = torch.Generator().manual_seed(seed)
    out = []
    for item in items:
        pixels = item.prompt.vision["pixel_values"]  # [1, C, H, W]
        if how == "zeroed":
            ablated = torch.zeros_like(pixels)
        else:
            flat = pixels.flatten(-2)  # [1, C, H*W]
            order = torch.randperm(flat.shape[-1], generator=generator)
            ablated = flat[..., order].reshape(pixels.shape)
        vision = {**item.prompt.vision, "pixel_values": ablated}
        out.append(
            dataclasses.replace(item, prompt=dataclasses.replace(item.prompt, vision=vision))
        )
    return out
