"""Metrics on m sampled permutations per test input (the same code for validation, test and
reproduce). Each metric is returned per input, so that intervals can resample inputs:

* accuracy: per unambiguous input (K = 1), the share of its samples equal to the valid order;
* valid_rate: per ambiguous input (K = 2), the share of its samples in V(c);
* both_modes: per ambiguous input, 1 if its samples contain both valid orders, else 0;
* mode_balance: per ambiguous input with a valid sample, |freq(P_1) - 0.5| among its valid
  samples (0 = balanced, 0.5 = one mode only);
* coupling (flows): per ambiguous input, the share of samples decoded to the valid order nearest
  to their own x0, i.e. the order the nearest-target coupling assigned to that x0 in training
  (1 = the learned field routes like the coupling); an invalid sample counts as 0 here, so a
  field that ignores x0 scores half its valid rate, not 0.5;
* coupling_valid (flows): the same share among the input's valid samples only (inputs with a
  valid sample; 1 = routes like the coupling, 0.5 = ignores x0 among the orders it gets right);
* violation, violation_200, negative_mass: per input, the largest row/column-sum deviation of
  the continuous output (Sinkhorn also run to 200 iterations) and its negative mass;
* both_modes_curve: both-modes recovery using only the first k samples, k = 1..m.
"""

import numpy as np
import torch

from permflow import core

# what validation and `train test` log (means over the inputs)
LOGGED_METRICS = (
    "accuracy",
    "valid_rate",
    "both_modes",
    "mode_balance",
    "coupling",
    "coupling_valid",
    "violation",
    "violation_200",
    "negative_mass",
)


def permutation_metrics(
    samples: np.ndarray,
    optima: np.ndarray,
    num_valid: np.ndarray,
    nearest: np.ndarray | None = None,
    **per_input: np.ndarray,
) -> dict[str, np.ndarray]:
    """samples [B, m, n], optima [B, 2, n], num_valid [B], nearest [B, m] (optional), other
    per-input diagnostics [B] (passed through) -> metric name -> per-input values."""
    matches = (samples[:, :, None, :] == optima[:, None, :, :]).all(-1)  # [B, m, 2]
    unambiguous, ambiguous = num_valid == 1, num_valid == 2
    metrics: dict[str, np.ndarray] = {k: np.asarray(v, float) for k, v in per_input.items()}
    if unambiguous.any():
        metrics["accuracy"] = matches[unambiguous, :, 0].mean(1)
    if ambiguous.any():
        amb = matches[ambiguous]  # [A, m, 2]
        hits_first, hits_second = amb[..., 0], amb[..., 1]  # [A, m]
        metrics["valid_rate"] = (hits_first | hits_second).mean(1)
        seen_first = np.logical_or.accumulate(hits_first, axis=1)  # [A, m]
        seen_second = np.logical_or.accumulate(hits_second, axis=1)
        metrics["both_modes_curve"] = (seen_first & seen_second).mean(axis=0)  # [m]
        metrics["both_modes"] = (seen_first[:, -1] & seen_second[:, -1]).astype(float)
        n_valid = (hits_first | hits_second).sum(1)  # [A]
        has_valid = n_valid > 0
        freq_first = hits_first.sum(1)[has_valid] / n_valid[has_valid]
        metrics["mode_balance"] = np.abs(freq_first - 0.5)
        if nearest is not None:
            assigned = np.take_along_axis(amb, nearest[ambiguous][..., None], axis=2)[..., 0]
            metrics["coupling"] = assigned.mean(1)
            metrics["coupling_valid"] = assigned.sum(1)[has_valid] / n_valid[has_valid]
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, num_samples: int = 16, seed: int = 0, **sample_kwargs) -> dict:
    """Sample ``num_samples`` permutations per input with ``model.sample_permutations`` and score.

    Extra keyword arguments (steps, sampler, project, decode, oracle) override the model's
    settings. Returns metric name -> per-input array (see the module docstring).
    """
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    outputs: list[dict[str, np.ndarray]] = []
    for batch in dataloader:
        batch = {k: v.to(model.device) for k, v in batch.items()}
        perms, stats = model.sample_permutations(
            batch, num_samples, generator=generator, **sample_kwargs
        )
        outputs.append(
            {
                "samples": perms,
                "optima": batch["optima"].cpu().numpy(),
                "num_valid": batch["num_valid"].cpu().numpy(),
                **stats,
            }
        )
    model.train(was_training)
    return permutation_metrics(**{k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]})


@torch.no_grad()
def start_cross_entropy(model, batch: dict, images: torch.Tensor, draws: int = 8) -> float:
    """The endpoint cross-entropy at t = 0 (x_t = x0, pure noise) with ``images`` as the input,
    averaged over ``draws`` seeded draws of x0: only the images can bring it below log n, so
    the gap between a batch's own images and shuffled ones measures how much the field reads
    them (a field that learned to follow x_t alone has no gap)."""
    targets = core.permutation_matrices(batch["optima"]).float()
    generator = torch.Generator().manual_seed(0)
    t = torch.zeros(len(targets))
    features = model.features(images)
    losses = []
    for _ in range(draws):
        x0 = core.sample_base(len(targets), model.hparams.n, model.hparams.sigma, generator)
        x1, _ = core.nearest_target_coupling(x0, targets, batch["num_valid"])
        logits = model.net(features, core.interpolate(x0, x1, t), t).float()
        losses.append(core.endpoint_cross_entropy(logits, x1).item())
    return sum(losses) / len(losses)


@torch.no_grad()
def early_fit(
    model, dataloader, t_max: float = 0.05, draws: int = 2, max_batches: int = 4, seed: int = 0
) -> dict[str, float]:
    """How well the learned endpoint field fits at early t, where the target must come from the
    input (and, for an ambiguous input, from x0's cell): x0 from the base, x1 from the
    nearest-target coupling, t uniform in [0, t_max), x_t on the coupling path (Eq. 6), as in
    training. Returns the endpoint cross-entropy (Eq. 7) and the share of predicted endpoints
    whose Hungarian decode is the coupled target, over all inputs and split into unambiguous
    and ambiguous ones. Run on the training split, it says whether the field underfits (a high
    value on train and test alike) or overfits (low on train, high on test)."""
    generator = torch.Generator().manual_seed(seed)
    hp = model.hparams
    sums: dict[str, list[float]] = {}
    was_training = model.training
    model.eval()
    for index, batch in enumerate(dataloader):
        if index == max_batches:
            break
        batch = {k: v.to(model.device) for k, v in batch.items()}
        targets = core.permutation_matrices(batch["optima"]).float()  # [B, K, n, n]
        features = model.features(batch["condition"])
        for _ in range(draws):
            x0 = core.sample_base(len(targets), hp.n, hp.sigma, generator, model.device)
            x1, _ = core.nearest_target_coupling(x0, targets, batch["num_valid"])
            t = t_max * torch.rand(len(targets), generator=generator).to(model.device)
            logits = model.net(features, core.interpolate(x0, x1, t), t).float()  # [B, n, n]
            ce = -(x1 * logits.log_softmax(-1)).sum(-1).mean(-1)  # [B]: Eq. (7) per input
            right = core.hungarian_decode(logits.softmax(-1)) == x1.argmax(-1).cpu().numpy()
            right = right.all(-1)  # [B]
            for name, mask in (
                ("all", np.ones(len(targets), bool)),
                ("unambiguous", (batch["num_valid"] == 1).cpu().numpy()),
                ("ambiguous", (batch["num_valid"] == 2).cpu().numpy()),
            ):
                sums.setdefault(f"cross_entropy_{name}", []).extend(ce.cpu().numpy()[mask])
                sums.setdefault(f"decodes_to_coupled_{name}", []).extend(right[mask])
    model.train(was_training)
    return {k: float(np.mean(v)) for k, v in sums.items() if len(v)}
