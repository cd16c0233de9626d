"""Forecast metrics (pure torch). Fields are [S, T, G, C] (samples, lead, grid point, variable)
with area weights w [G] (zero outside the scored region); ensembles are [S, M, T, G, C].

    RMSE(t)      = sqrt( mean_s sum_g w_g (x_hat - x)^2 / sum_g w_g )                     (M1)
    activity(t)  = sqrt( mean_s var_w(x_hat - clim) ) / sqrt( mean_s var_w(x - clim) )      (M2)
                   var_w(a) = sum_g w_g (a_g - abar)^2 / sum_g w_g,  abar = weighted mean
    R_hi(t)      = sum_{|k| >= k_c} E_hat(k) / sum_{|k| >= k_c} E(k)  (isotropic spectra)   (M3)
                   on a non-periodic (regional) window the fields are Hann-tapered first, so
                   the jump between opposite edges does not leak energy into high k
    CRPS         = mean_m |X_m - y| - 1/(2 M^2) sum_{m, m'} |X_m - X_m'|                    (M4)
    spread/skill = sqrt((M+1)/M) * sqrt(mean var_ens) / RMSE(ensemble mean)                 (M5)

Activity 1 means the forecast anomalies vary as much as the truth's; a forecast that blurs
toward climatology has activity < 1 (climatology itself has 0). Spread/skill 1 is a
well-dispersed ensemble (Fortin et al. 2014); < 1 is under-dispersive.
"""

from __future__ import annotations

import torch


def _weighted_mean(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted mean over the grid axis (-2) of a [..., G, C]."""
    return (a * w[:, None]).sum(-2) / w.sum()


def weighted_rmse(prediction: torch.Tensor, truth: torch.Tensor, w: torch.Tensor):
    """Eq. M1: [S, T, G, C] -> [T, C]."""
    return _weighted_mean((prediction - truth).pow(2), w).mean(0).sqrt()


def weighted_variance(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """var_w over the grid axis: [..., G, C] -> [..., C]."""
    mean = _weighted_mean(a, w)
    return _weighted_mean((a - mean.unsqueeze(-2)).pow(2), w)


def activity(prediction, truth, climatology, w) -> torch.Tensor:
    """Eq. M2: anomaly std of the forecast relative to the truth's; [S, T, G, C] -> [T, C]."""
    forecast = weighted_variance(prediction - climatology, w).mean(0)
    reference = weighted_variance(truth - climatology, w).mean(0)
    return (forecast / reference.clamp(min=1e-12)).sqrt()


def hann_window(n: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """2-D Hann taper [n, n] scaled to mean square 1 (the total energy of white noise is kept)."""
    w = torch.hann_window(n, periodic=False, dtype=dtype, device=device)
    w2 = w[:, None] * w[None, :]
    return w2 / w2.pow(2).mean().sqrt()


def isotropic_spectrum(fields: torch.Tensor, taper: bool = False) -> torch.Tensor:
    """Energy per integer wavenumber shell of square fields [..., n, n] -> [..., n//2 + 1]
    (mean removed; shells beyond the Nyquist circle are dropped). ``taper``: Hann window
    first, for fields that are not periodic (a regional window)."""
    n = fields.shape[-1]
    anomaly = fields - fields.mean((-2, -1), keepdim=True)
    if taper:
        anomaly = anomaly * hann_window(n, fields.dtype, fields.device)
    f = torch.fft.fft2(anomaly, norm="ortho")
    k = torch.fft.fftfreq(n, 1 / n, device=fields.device)
    shell = (k[:, None] ** 2 + k[None, :] ** 2).sqrt().round().long().clamp(max=n // 2 + 1)
    power = f.abs().pow(2).flatten(-2)  # [..., n*n]
    out = torch.zeros(*power.shape[:-1], n // 2 + 2, dtype=power.dtype, device=power.device)
    out.index_add_(-1, shell.flatten(), power)
    return out[..., : n // 2 + 1]


def high_wavenumber_ratio(
    prediction: torch.Tensor, truth: torch.Tensor, k_cut: int, taper: bool = False
):
    """Eq. M3 on square fields [S, T, C, n, n] -> [T, C] (energies summed over samples)."""
    e_hat = isotropic_spectrum(prediction, taper)[..., k_cut:].sum(-1).sum(0)
    e = isotropic_spectrum(truth, taper)[..., k_cut:].sum(-1).sum(0)
    return e_hat / e.clamp(min=1e-12)


def crps_ensemble(members: torch.Tensor, truth: torch.Tensor, w: torch.Tensor):
    """Eq. M4, area-weighted: members [S, M, T, G, C], truth [S, T, G, C] -> [T, C]."""
    skill = (members - truth[:, None]).abs().mean(1)  # [S, T, G, C]
    pairs = (members[:, :, None] - members[:, None]).abs().mean((1, 2))  # [S, T, G, C]
    return _weighted_mean(skill - 0.5 * pairs, w).mean(0)


def spread_skill(members: torch.Tensor, truth: torch.Tensor, w: torch.Tensor):
    """Eq. M5: members [S, M, T, G, C], truth [S, T, G, C] -> (ratio, spread, skill) [T, C]."""
    m = members.shape[1]
    spread = _weighted_mean(members.var(1, unbiased=True), w).mean(0).sqrt()
    skill = weighted_rmse(members.mean(1), truth, w)
    return ((m + 1) / m) ** 0.5 * spread / skill.clamp(min=1e-12), spread, skill
