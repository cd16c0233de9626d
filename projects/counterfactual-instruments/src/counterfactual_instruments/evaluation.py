"""The three uses and the leakage measurements, per test galaxy (so intervals pair over galaxies).

- Parameter inference: ridge probes (cross-validated penalty) from a latent to the standardised
  targets, fit on the training split's latents; a galaxy's score is 1 - its squared error
  averaged over targets (each over the test variance), so the mean over galaxies is R^2.
- Leakage: the same probes from z_p to the observing condition (PSF FWHM, noise sigma) and
  from z_s to the intrinsic parameters; and, as a check of the instrument latent itself, from
  z_s to the condition.
- Instrument independence: probes fit on A's latents scored on B's latents (and the reverse).
- Similarity search: z_p of a galaxy's A view queries the B views of all test galaxies
  (cosine); recall@k of its own B view (both directions averaged).
- Counterfactual views: D_B(z_p(x^A_i), z_s(x^B_partner)) against galaxy i rendered noise-free
  under the partner's condition: chi-square per pixel in the partner's noise units (core eq. 2),
  and GalSim HSM adaptive moments (size sigma, shape g1 g2) of the band-summed images.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.linear_model import RidgeCV

from counterfactual_instruments.core import chi2_per_pixel
from counterfactual_instruments.simulate import HSC_LIKE, LEGACY_LIKE

RIDGE_ALPHAS = np.logspace(-3, 3, 7)
SIZE_ERROR_CAP = 1.0  # a failed or wild HSM measurement counts as a 100% size error


@torch.no_grad()
def encode(module, dataset, batch_size: int = 200) -> dict[str, np.ndarray]:
    """z_p and z_s of both views of every item (z_s from what the objective's instrument encoder
    reads: the neighbour for the method, the view itself otherwise; absent when the objective
    has none) and, on the miniature's test split, the counterfactual B views."""
    module.eval()
    out: dict[str, list[np.ndarray]] = {}
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    for batch in loader:
        batch = {k: v.to(module.device) for k, v in batch.items()}
        for x in ("A", "B"):
            out.setdefault(f"zp_{x}", []).append(module.intrinsic(batch, x).cpu().numpy())
            z_s = module.instrument(batch, x, module.instrument_source)
            if z_s is not None:
                out.setdefault(f"zs_{x}", []).append(z_s.cpu().numpy())
        if "truth_B" in batch:
            view = module.counterfactual_view(batch)
            if view is not None:
                out.setdefault("counterfactual_B", []).append(view.cpu().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def probe_scores(train_x, train_y, test_x, test_y) -> np.ndarray:
    """Per test item: 1 - mean over targets of (prediction - truth)^2 / var_test(target)."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-8
    probe = RidgeCV(alphas=RIDGE_ALPHAS).fit((train_x - mean) / std, train_y)
    # reshaped: for a single target column RidgeCV predicts a flat [N], which would broadcast
    prediction = probe.predict((test_x - mean) / std).reshape(test_y.shape)
    error = (prediction - test_y) ** 2
    return 1.0 - (error / test_y.var(0).clip(1e-12)).mean(1)


def recall_at_k(queries: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """Per query i: 1 if key i is among its k nearest keys by cosine similarity, else 0."""
    q = queries / (np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12)
    c = keys / (np.linalg.norm(keys, axis=1, keepdims=True) + 1e-12)
    similarity = q @ c.T
    own = np.diag(similarity)
    rank = (similarity > own[:, None]).sum(1)  # keys strictly closer than the true one
    return (rank < k).astype(np.float64)


def hsm_moments(images: np.ndarray, pixel_scale: float) -> np.ndarray:
    """[N, C, H, W] -> [N, 3]: HSM adaptive-moment size sigma (arcsec) and observed shape
    (g1, g2) of each band-summed image; NaN rows where HSM fails."""
    import galsim

    out = np.full((len(images), 3), np.nan)
    for i, image in enumerate(images.sum(1)):
        moments = galsim.hsm.FindAdaptiveMom(
            galsim.Image(np.ascontiguousarray(image, dtype=np.float64), scale=pixel_scale),
            strict=False,
        )
        if moments.moments_status == 0:
            shape = moments.observed_shape
            out[i] = (moments.moments_sigma * pixel_scale, shape.g1, shape.g2)
    return out


def shape_errors(prediction: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Relative HSM size error and |g_pred - g_true| per item, capped at SIZE_ERROR_CAP (a
    failed measurement counts as the cap)."""
    p, t = hsm_moments(prediction, HSC_LIKE.pixel_scale), hsm_moments(truth, HSC_LIKE.pixel_scale)
    size = np.abs(p[:, 0] - t[:, 0]) / t[:, 0]
    shape = np.hypot(p[:, 1] - t[:, 1], p[:, 2] - t[:, 2])
    return (
        np.nan_to_num(size, nan=SIZE_ERROR_CAP).clip(0, SIZE_ERROR_CAP),
        np.nan_to_num(shape, nan=SIZE_ERROR_CAP).clip(0, SIZE_ERROR_CAP),
    )


def evaluate(module, data) -> dict[str, Any]:
    """Every per-galaxy metric of the claim on the test split (probes fit on train)."""
    train, test = encode(module, data.train_set), encode(module, data.test_set)
    tr, te = data.train_set.arrays, data.test_set.arrays
    n = len(data.test_set)
    nan = np.full(n, np.nan)
    metrics: dict[str, Any] = {}

    def both(fn):
        return 0.5 * (fn("A") + fn("B"))

    metrics["nuisance_r2"] = both(
        lambda x: probe_scores(
            train[f"zp_{x}"], tr[f"cond_{x}"].numpy(), test[f"zp_{x}"], te[f"cond_{x}"].numpy()
        )
    )
    for column, name in enumerate(("psf_r2", "noise_r2")):
        metrics[name] = both(
            lambda x, c=column: probe_scores(
                train[f"zp_{x}"],
                tr[f"cond_{x}"][:, c : c + 1].numpy(),
                test[f"zp_{x}"],
                te[f"cond_{x}"][:, c : c + 1].numpy(),
            )
        )
    if "zs_A" in train:  # does z_s carry the condition it should?
        metrics["condition_r2_from_instrument"] = both(
            lambda x: probe_scores(
                train[f"zs_{x}"], tr[f"cond_{x}"].numpy(), test[f"zs_{x}"], te[f"cond_{x}"].numpy()
            )
        )
    else:
        metrics["condition_r2_from_instrument"] = nan
    has_params = "params" in tr
    if "zs_A" in train and has_params:
        metrics["intrinsic_r2_from_instrument"] = both(
            lambda x: probe_scores(
                train[f"zs_{x}"], tr["params"].numpy(), test[f"zs_{x}"], te["params"].numpy()
            )
        )
    else:
        metrics["intrinsic_r2_from_instrument"] = nan
    if has_params:
        p_tr, p_te = tr["params"].numpy(), te["params"].numpy()
        within = both(lambda x: probe_scores(train[f"zp_{x}"], p_tr, test[f"zp_{x}"], p_te))
        other = {"A": "B", "B": "A"}
        cross = both(lambda x: probe_scores(train[f"zp_{x}"], p_tr, test[f"zp_{other[x]}"], p_te))
        metrics.update(probe_r2_within=within, cross_probe_r2=cross, transfer_gap=within - cross)
    else:
        metrics.update(probe_r2_within=nan, cross_probe_r2=nan, transfer_gap=nan)
    for k in (1, 5):
        metrics[f"recall_at_{k}"] = 0.5 * (
            recall_at_k(test["zp_A"], test["zp_B"], k) + recall_at_k(test["zp_B"], test["zp_A"], k)
        )
    if "counterfactual_B" in test:
        view = torch.from_numpy(test["counterfactual_B"])
        metrics["counterfactual_chi2"] = chi2_per_pixel(
            view, te["truth_B"], te["partner_ivar_B"]
        ).numpy()
        size, shape = shape_errors(test["counterfactual_B"], te["truth_B"].numpy())
        metrics.update(counterfactual_size_error=size, counterfactual_shape_error=shape)
    else:
        metrics.update(
            counterfactual_chi2=nan, counterfactual_size_error=nan, counterfactual_shape_error=nan
        )
    metrics["observed_size_psf_corr"] = observed_size_psf_corr(data)
    return metrics


def observed_size_psf_corr(data) -> float:
    """Spearman correlation of the HSM size of the observed A views with A's PSF FWHM over the
    test galaxies: how strongly seeing confounds the apparent size (the precondition)."""
    images = data.test_set.arrays["image_A"].numpy()
    sizes = hsm_moments(images, LEGACY_LIKE.pixel_scale)[:, 0]
    psf = data.test_set.arrays["cond_A"][:, 0].numpy()
    ok = np.isfinite(sizes)
    return float(spearmanr(sizes[ok], psf[ok]).statistic)
