import pytest
import torch

from graphmet.metrics import (
    activity,
    crps_ensemble,
    high_wavenumber_ratio,
    isotropic_spectrum,
    spread_skill,
    weighted_rmse,
)


def test_weighted_rmse_by_hand():
    truth = torch.zeros(1, 1, 3, 1)
    prediction = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1)
    w = torch.tensor([1.0, 1.0, 2.0])
    # (1 + 4 + 2*9) / 4 = 23/4
    assert weighted_rmse(prediction, truth, w).item() == pytest.approx((23 / 4) ** 0.5)


def test_activity_by_hand():
    clim = torch.tensor([10.0, 10.0, 10.0, 10.0]).view(4, 1)
    truth = (clim + torch.tensor([1.0, -1.0, 3.0, -3.0]).view(4, 1)).view(1, 1, 4, 1)
    w = torch.ones(4)
    # forecast anomalies half as large -> activity 0.5; a constant offset changes nothing
    half = clim + 0.5 * (truth - clim) + 7.0
    assert activity(half, truth, clim, w).item() == pytest.approx(0.5)
    assert activity(clim.expand_as(truth), truth, clim, w).item() == 0
    # weights: var_w with w = (1, 1, 0, 0) only sees the +-1 anomalies -> 1 vs 1
    w2 = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert activity(truth, truth, clim, w2).item() == pytest.approx(1.0)
    forecast = truth.clone()
    forecast[..., 0, 0] += 1.0  # anomalies (2, -1): var = 2.25 vs 1 -> 1.5
    assert activity(forecast, truth, clim, w2).item() == pytest.approx(1.5)


def test_crps_by_hand():
    truth = torch.ones(1, 1, 1, 1)
    members = torch.tensor([0.0, 2.0]).view(1, 2, 1, 1, 1)
    # E|X - y| = 1, E|X - X'| = (0 + 2 + 2 + 0) / 4 = 1 -> 1 - 0.5 = 0.5
    assert crps_ensemble(members, truth, torch.ones(1)).item() == pytest.approx(0.5)
    single = torch.tensor([3.0]).view(1, 1, 1, 1, 1)
    assert crps_ensemble(single, truth, torch.ones(1)).item() == pytest.approx(2.0)  # = MAE
    perfect = torch.ones(1, 4, 1, 1, 1)
    assert crps_ensemble(perfect, truth, torch.ones(1)).item() == 0


def test_spread_skill_by_hand():
    members = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1, 1)
    truth = torch.zeros(1, 1, 1, 1)
    ratio, spread, skill = spread_skill(members, truth, torch.ones(1))
    # unbiased variance of (1, 3) = 2; ensemble mean 2 -> skill 2; sqrt(3/2) sqrt(2) / 2
    assert spread.item() == pytest.approx(2**0.5)
    assert skill.item() == pytest.approx(2.0)
    assert ratio.item() == pytest.approx((3 / 2) ** 0.5 * 2**0.5 / 2)


def test_spectrum_and_high_wavenumber_ratio():
    n = 16
    y, x = torch.meshgrid(
        torch.arange(n) * 2 * torch.pi / n, torch.arange(n) * 2 * torch.pi / n, indexing="ij"
    )
    low, high = torch.cos(2 * x), torch.cos(6 * x + 5 * y)  # |k| = 2 and sqrt(61) ~ 7.8
    spec = isotropic_spectrum(low + high)
    assert spec.argmax().item() in (2, 8) and spec[2] > 0 and spec[8] > 0
    assert spec.sum() == pytest.approx(((low + high) ** 2).sum().item(), rel=1e-5)  # Parseval
    truth = (low + high)[None, None, None]
    assert high_wavenumber_ratio(truth, truth, 4).item() == pytest.approx(1.0)
    assert high_wavenumber_ratio(low[None, None, None], truth, 4).item() == pytest.approx(
        0, abs=1e-6
    )
    assert high_wavenumber_ratio(
        (low + 0.5 * high)[None, None, None], truth, 4
    ).item() == pytest.approx(0.25)


def test_activity_subtracts_a_non_constant_climatology():
    """Eq. M2 with a climatology that varies over the grid: a forecast halfway between the
    climatology and the truth has activity exactly 1/2; without subtracting the climatology
    the spatial pattern of the climatology would count as activity."""
    gen = torch.Generator().manual_seed(0)
    clim = 3 * torch.randn(50, 2, generator=gen)  # [G, C]
    truth = clim + torch.randn(4, 3, 50, 2, generator=gen)
    forecast = clim + 0.5 * (truth - clim)
    w = torch.ones(50)
    torch.testing.assert_close(activity(forecast, truth, clim, w), torch.full((3, 2), 0.5))
    assert (activity(clim.expand_as(truth), truth, clim, w) == 0).all()


def test_hann_taper_removes_the_edge_leakage_of_a_non_periodic_window():
    """A smooth ramp is not periodic on its window: untapered, the jump between opposite edges
    puts energy at high k; tapered, almost none is left there."""

    n = 16
    ramp = torch.linspace(0, 1, n)[None, :].expand(n, n) + torch.linspace(0, 1, n)[:, None]
    raw = isotropic_spectrum(ramp)
    tapered = isotropic_spectrum(ramp, taper=True)
    high = slice(n // 4, None)
    assert raw[high].sum() / raw.sum() > 0.03
    assert tapered[high].sum() / tapered.sum() < 0.1 * (raw[high].sum() / raw.sum())
