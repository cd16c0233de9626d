"""Rollout scores on evaluation groups: energy distance, collapse ratio and feature L1.

A group is one start and one action sequence with M true outcomes (the hidden settings). A
world model rolls S samples out from the shared start (S = 1 for a deterministic model); the
scores compare the S predicted and the M true token sequences, per group, so the claim's
intervals pair subjects over the same groups.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlawm import core


@torch.no_grad()
def predict_rollouts(
    predict_chunk: Callable,
    groups,
    samples: int,
    generator: torch.Generator | None = None,
    actions: torch.Tensor | None = None,
) -> torch.Tensor:
    """S autoregressive rollouts per group: tokens [G, S, K, L, C].

    ``predict_chunk(x_t [B, L, C], chunk [B, h, A], generator)``; ``actions`` [G, K, h, A]
    replaces the groups' own (the shuffled-action control)."""
    actions = groups.actions if actions is None else actions
    start = groups.tokens[:, 0, 0].repeat_interleave(samples, 0)  # [G*S, L, C]
    chunks = actions.repeat_interleave(samples, 0)  # [G*S, K, h, A]
    tokens = core.rollout(lambda x, a: predict_chunk(x, a, generator), start, chunks)
    return tokens.view(len(actions), samples, *tokens.shape[1:])


def score_rollouts(
    predictions: torch.Tensor, truth: torch.Tensor, min_truth_spread: float
) -> dict[str, torch.Tensor]:
    """Per-group scores of predictions [G, S, K, L, C] against truth [G, M, K, L, C].

    - ``energy_distance`` [G]: Eq. 8 between the S and M final-chunk token sets;
    - ``feature_l1_best`` [G]: per true outcome, the L1 of the closest sample (mean over chunks,
      tokens and channels), averaged over outcomes (best-of-S; S = 1 is plain L1);
    - ``feature_l1_mean`` [G]: L1 averaged over samples and outcomes;
    - ``collapse_ratio`` [G']: Eq. 9 at the final chunk on the G' groups whose truth spread
      reaches ``min_truth_spread`` (the multimodal ones), and ``pooled_collapse_ratio`` over them;
    - ``truth_spread`` [G] and ``prediction_spread`` [G] at the final chunk.
    """
    final_pred, final_true = predictions[:, :, -1].flatten(2), truth[:, :, -1].flatten(2)
    energy = torch.stack(
        [core.energy_distance(p, t) for p, t in zip(final_pred, final_true, strict=True)]
    )
    # [G, S, M]: L1 between every sample and every outcome, averaged over chunks and tokens
    l1 = (predictions[:, :, None] - truth[:, None]).abs().mean(dim=(3, 4, 5))
    truth_spread = torch.stack([core.spread(t) for t in final_true])
    prediction_spread = torch.stack([core.spread(p) for p in final_pred])
    kept = truth_spread >= min_truth_spread
    pooled = (
        core.pooled_collapse_ratio(final_pred, final_true, min_truth_spread)[0]
        if kept.any()
        else torch.tensor(float("nan"))
    )
    return {
        "energy_distance": energy,
        "feature_l1_best": l1.min(dim=1).values.mean(dim=1),
        "feature_l1_mean": l1.mean(dim=(1, 2)),
        "collapse_ratio": prediction_spread[kept] / truth_spread[kept],
        "pooled_collapse_ratio": pooled,
        "truth_spread": truth_spread,
        "prediction_spread": prediction_spread,
    }


@torch.no_grad()
def resampled_truth(groups, samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The positive control (a real oracle): per group, ``samples`` of its M true outcome
    trajectories drawn with replacement, tokens [G, S, K, L, C]. A world model that has learnt
    the true distribution of outcomes produces draws like these."""
    truth = groups.tokens[:, :, 1:]  # [G, M, K, L, C]
    g, m = truth.shape[:2]
    index = torch.randint(m, (g, samples), generator=generator)
    return truth[torch.arange(g)[:, None], index]


@torch.no_grad()
def ceiling_rollouts(module, groups, teacher_forced: bool = False) -> torch.Tensor:
    """The RLA ceiling (a diagnostic, not an oracle): the frozen RLA decoder fed, per outcome and
    chunk, the true RLA (the encoder on the real residual of that outcome), tokens [G, M, K, L, C].
    Rolled out, each chunk decodes from the previous prediction (what a perfect RLA predictor
    would give); ``teacher_forced`` decodes each chunk from the true x_k (the decoder alone)."""
    truth = groups.tokens  # [G, M, K+1, L, C]
    g, m = truth.shape[:2]
    flat = truth.flatten(0, 1)  # [G*M, K+1, L, C]
    x = flat[:, 0]
    out = []
    for k in range(flat.shape[1] - 1):
        z, _ = module.rla.encode(flat[:, k], flat[:, k + 1])
        x = module.rla.decode(flat[:, k] if teacher_forced else x, z)
        out.append(x)
    predictions = torch.stack(out, dim=1)  # [G*M, K, L, C]
    return predictions.view(g, m, *predictions.shape[1:])
