"""Metrics on m sampled permutations per test input (the same code for validation and reproduce).

* unambiguous accuracy: share of samples equal to the unique valid permutation (K = 1 inputs);
* valid rate: share of samples in V(c) (K = 2 inputs);
* both-modes recovery: share of K = 2 inputs whose samples contain both valid permutations;
* mode balance: |freq(P_1) - 0.5| among the valid samples of a K = 2 input (0 = perfectly balanced,
  0.5 = one mode only), averaged over inputs with at least one valid sample;
* violation: the largest row/column-sum deviation of the continuous output at the end of sampling;
* both-modes curve: both-modes recovery using only the first k samples, k = 1..m.
"""

import numpy as np
import torch


def permutation_metrics(
    samples: np.ndarray, optima: np.ndarray, num_valid: np.ndarray
) -> dict[str, float | list[float]]:
    """samples [B, m, n], optima [B, 2, n], num_valid [B] -> metric dict."""
    matches = (samples[:, :, None, :] == optima[:, None, :, :]).all(-1)  # [B, m, 2]
    unambiguous, ambiguous = num_valid == 1, num_valid == 2
    metrics: dict[str, float | list[float]] = {
        "n_unambiguous": int(unambiguous.sum()),
        "n_ambiguous": int(ambiguous.sum()),
    }
    if unambiguous.any():
        metrics["unambiguous_accuracy"] = float(matches[unambiguous, :, 0].mean())
    if ambiguous.any():
        amb = matches[ambiguous]  # [A, m, 2]
        hits_first, hits_second = amb[..., 0], amb[..., 1]  # [A, m]
        metrics["valid_rate"] = float((hits_first | hits_second).mean())
        seen_first = np.logical_or.accumulate(hits_first, axis=1)  # [A, m]
        seen_second = np.logical_or.accumulate(hits_second, axis=1)
        curve = (seen_first & seen_second).mean(axis=0)  # [m]
        metrics["both_modes"] = float(curve[-1])
        metrics["both_modes_curve"] = [float(v) for v in curve]
        n_valid = (hits_first | hits_second).sum(1)  # [A]
        has_valid = n_valid > 0
        freq_first = hits_first.sum(1)[has_valid] / n_valid[has_valid]
        metrics["mode_balance"] = float(np.abs(freq_first - 0.5).mean()) if has_valid.any() else 0.5
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, num_samples: int = 16, seed: int = 0, **sample_kwargs) -> dict:
    """Sample ``num_samples`` permutations per input with ``model.sample_permutations`` and score.

    Extra keyword arguments (steps, sampler, project, decode) override the model's settings.
    """
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    all_samples, all_optima, all_valid, violations = [], [], [], []
    for batch in dataloader:
        batch = {k: v.to(model.device) for k, v in batch.items()}
        perms, violation = model.sample_permutations(
            batch, num_samples, generator=generator, **sample_kwargs
        )
        all_samples.append(perms)
        all_optima.append(batch["optima"].cpu().numpy())
        all_valid.append(batch["num_valid"].cpu().numpy())
        violations.append(violation.float().cpu())
    model.train(was_training)
    metrics = permutation_metrics(
        np.concatenate(all_samples), np.concatenate(all_optima), np.concatenate(all_valid)
    )
    metrics["violation"] = float(torch.cat(violations).max())
    return metrics
