"""Baselines of the language arms, on the same slots and directions as core.py.

- Fixed top-K soft targets (self-distillation at a fixed mixing weight): isolates "targets
  learned by value" from "soft targets".
- Online gradient-alignment token reweighting (LESS-style): the same per-token directions D of
  eq. (4), used to weight one-hot tokens instead of to build targets.

Plain continued pretraining and the oracle are one-hot next-token prediction (model.py); the
vision baselines (fixed DINO augmentations, random views) live in vision_core.py.
"""

from __future__ import annotations

import torch

from vpretrain.core import soft_targets


def fixed_soft_targets(log_probs_at: torch.Tensor, mixing: float) -> torch.Tensor:
    """Baseline: fixed top-K soft targets (self-distillation). The learner's renormalised top-K
    probabilities get a fixed share ``mixing`` of the mass, the observed token the rest; the
    same eq. (6) with lambda_t = lambda and s_t = log p(C_t), nothing learned."""
    lam = torch.full(log_probs_at.shape[:-1], mixing, dtype=log_probs_at.dtype)
    return soft_targets(lam.to(log_probs_at.device), log_probs_at[..., 1:].detach())


def alignment_token_weights(observed_directions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Baseline: online gradient-alignment token reweighting (LESS-style) [R].

    A token helps the downstream loss to first order when its one-hot update does, i.e. when
    D_t(y_t) < 0 (eq. 3 with q = onehot); weight w_t = relu(-D_t(y_t)), scaled to mean 1 over
    the unmasked positions (all ones when no token helps). [B, T]."""
    raw = torch.relu(-observed_directions.detach()) * mask
    total = raw.sum()
    if total <= 0:
        return mask.clone()
    return raw * mask.sum() / total
