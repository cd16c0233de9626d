"""Evaluation plumbing for ``reproduce``: rollouts, ensembles, diagnostics and inference cost.

Every function takes a trained ``GraphWeatherModel`` with its graph attached and standardised
test windows [S, T+1, G, C]; scores cover the interior (regional runs) with area weights.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from graphmet.baselines import initial_condition_ensemble
from graphmet.core import GraphWeatherModel
from graphmet.koopman import dirichlet_energy
from graphmet.metrics import (
    activity,
    crps_ensemble,
    high_wavenumber_ratio,
    isotropic_spectrum,
    spread_skill,
    weighted_rmse,
)


def interior_square(fields: torch.Tensor, grid: tuple[int, int], boundary: int) -> torch.Tensor:
    """[S, T, G, C] -> the scored interior as square images [S, T, C, n, n]."""
    ny, nx = grid
    images = fields.unflatten(-2, (ny, nx)).movedim(-1, -3)
    return images[..., boundary : ny - boundary, boundary : nx - boundary]


@torch.no_grad()
def deterministic_scores(
    model: GraphWeatherModel,
    windows: torch.Tensor,
    climatology: torch.Tensor,
    grid: tuple[int, int],
    boundary: int,
    variable: int = 0,
    batch: int = 8,
    latent: bool = False,
) -> dict:
    """RMSE, activity, R_hi per lead, the spectrum at the last lead, latent energy per step."""
    predictions, energies = [], []
    for chunk in windows.split(batch):
        if latent:
            predictions.append(model.rollout_latent(chunk[:, 0], chunk[:, 1:]))
        else:
            prediction, energy = model.rollout(chunk[:, 0], chunk[:, 1:], diagnostics=True)
            predictions.append(prediction)
            energies.append(energy)
    prediction, truth = torch.cat(predictions), windows[:, 1:]
    return score_fields(
        prediction,
        truth,
        climatology,
        model.graph.loss_weight,
        grid,
        boundary,
        variable,
        torch.cat(energies).mean(0) if energies else None,
    )


def score_fields(prediction, truth, climatology, weight, grid, boundary, variable, energy=None):
    """The deterministic metrics of any forecast [S, T, G, C] (models and references)."""
    images_hat = interior_square(prediction, grid, boundary)[:, :, variable]
    images = interior_square(truth, grid, boundary)[:, :, variable]
    k_cut = images.shape[-1] // 4
    out = {
        "rmse": weighted_rmse(prediction, truth, weight).mean(-1),  # [T], mean over variables
        "activity": activity(prediction, truth, climatology, weight)[:, variable],  # [T]
        "r_hi": high_wavenumber_ratio(images_hat[:, :, None], images[:, :, None], k_cut)[:, 0],
        "spectrum_last": isotropic_spectrum(images_hat[:, -1]).mean(0),
        "spectrum_truth_last": isotropic_spectrum(images[:, -1]).mean(0),
    }
    if energy is not None:
        out["latent_energy"] = energy
    return out


@torch.no_grad()
def layer_energy(model: GraphWeatherModel, windows: torch.Tensor) -> list[float]:
    """Latent Dirichlet energy after the encoder and after each processor layer (one step)."""
    mesh, _ = model.encode(windows[:, 0], windows[:, 1])
    if model.is_koopman:
        history = [mesh, model.process(mesh)[0]]
    else:
        history = model.process(mesh, keep_layers=True)[1]
    edges, n = model.graph.mesh_edges, model.graph.num_mesh
    return [dirichlet_energy(h, edges, n).mean().item() for h in history]


@torch.no_grad()
def ensemble_scores(
    model: GraphWeatherModel,
    windows: torch.Tensor,
    members: int,
    scheme: str,
    seed: int,
    ic_amplitude: float = 0.1,
    coefficient_amplitude: float = 0.1,
    phase_amplitude: float = 0.02,
) -> dict:
    """CRPS and spread/skill per lead. Schemes: ``ic`` (perturbed initial states, any model)
    and ``spectral`` (GraphMet: noise on the initial spectral coefficients scaled by their RMS
    per mode, plus a per-member phase offset of Lambda kept over the whole rollout)."""
    gen = torch.Generator().manual_seed(seed)
    initial, future = windows[:, 0], windows[:, 1:]
    forcing = future.repeat_interleave(members, 0)
    weight = model.graph.loss_weight
    if scheme == "ic":
        start = initial_condition_ensemble(initial, members, ic_amplitude, gen)
        forecast, _ = model.rollout(start, forcing)
    elif scheme == "spectral":
        if not model.is_koopman:
            raise TypeError("the spectral ensemble scheme needs the Koopman processor")
        start = initial.repeat_interleave(members, 0)
        processor = model.processor
        coefficients = processor.coefficients(
            model.encode(start, forcing[:, 0])[0], model.graph.basis
        )
        scale = coefficients.pow(2).mean((0, 2)).sqrt()[None, :, None]  # RMS per mode
        coefficient_noise = (
            coefficient_amplitude * scale * torch.randn(coefficients.shape, generator=gen)
        )
        lam = processor.operator.eigenvalues()
        phase_noise = phase_amplitude * torch.randn((len(start), *lam.shape), generator=gen)
        forecast, _ = model.rollout(
            start, forcing, {"coefficient_noise": coefficient_noise}, phase_noise=phase_noise
        )
    else:
        raise ValueError(f"unknown ensemble scheme {scheme!r}")
    ens = forecast.unflatten(0, (len(initial), members))  # [S, M, T, G, C]
    ratio, spread, skill = spread_skill(ens, future, weight)
    return {
        "crps": crps_ensemble(ens, future, weight).mean(-1),
        "spread_skill": ratio.mean(-1),
        "spread": spread.mean(-1),
        "skill": skill.mean(-1),
    }


@torch.no_grad()
def inference_cost(model: GraphWeatherModel, windows: torch.Tensor, members: int, repeats: int = 3):
    """Wall seconds and FLOPs (matmul-type ops counted by torch's FlopCounterMode) per forecast
    step per ensemble member, for an ensemble of ``members`` run as one batch."""
    state = windows[:1, 0].repeat_interleave(members, 0)
    forcing = windows[:1, 1].repeat_interleave(members, 0)
    model.step(state, forcing)  # warm-up
    with FlopCounterMode(display=False) as counter:
        model.step(state, forcing)
    start = time.perf_counter()
    for _ in range(repeats):
        model.step(state, forcing)
    seconds = (time.perf_counter() - start) / repeats / members
    return {
        "seconds_per_step_member": seconds,
        "flops_per_step_member": counter.get_total_flops() / members,
    }
