"""Value tests of ``AsyncDiffusionModule.generate``: the noise it draws, the time grid it
follows, the network it calls (EMA or not) and the guidance it applies, against an Euler
integration written out here, with a stub velocity whose values are known."""

import pytest
import torch
from torch import nn

from async_schedule.model import AsyncDiffusionModule


class KnownVelocity(nn.Module):
    """A velocity field with values that depend on every input, and on the labels (cond vs
    uncond), so that a swapped argument, a dropped label or a wrong guidance sign shows."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, lead, lag, t_lead, t_lag, labels):
        shift = 0.0 if labels is None else (labels.float() + 1).reshape(-1, 1, 1, 1)
        v_lead = self.scale * (-lead + shift + 3 * t_lead.reshape(-1, 1, 1, 1))
        v_lag = self.scale * (-0.5 * lag + 2 * shift * t_lag.reshape(-1, 1, 1, 1))
        return v_lead, v_lag


def tiny_module(**overrides) -> AsyncDiffusionModule:
    args = dict(width=32, depth=1, heads=2, lead_channels=8, lead_size=1, num_classes=10)
    return AsyncDiffusionModule(**{**args, **overrides})


def euler_by_hand(model, n, steps, seed, velocity, labels=None, scale=1.0):
    """The reference: the noise drawn in generate's order (lead first, then lag), then one
    Euler step per grid interval, each representation moved by its own time increment."""
    generator = torch.Generator().manual_seed(seed)
    h = model.hparams
    lead = torch.randn(n, h.lead_channels, h.lead_size, h.lead_size, generator=generator)
    lag = torch.randn(n, h.lag_channels, h.lag_size, h.lag_size, generator=generator)
    lead_times, lag_times = model.time_grid(steps)
    for i in range(steps):
        t0 = (lead_times[i].expand(n), lag_times[i].expand(n))
        good = velocity(lead, lag, *t0, labels)
        if scale != 1.0:
            bad = velocity(lead, lag, *t0, None)
            good = tuple(b + scale * (g - b) for g, b in zip(good, bad, strict=True))
        lead = lead + (lead_times[i + 1] - lead_times[i]) * good[0]
        lag = lag + (lag_times[i + 1] - lag_times[i]) * good[1]
    return lead, lag


@pytest.mark.parametrize(
    "schedule",
    [
        {"schedule": "synchronous"},
        {"schedule": "power", "power_exponent": 3.0, "sample_grid": "arclength"},
        {"schedule": "sfd", "sfd_delta": 0.5},
    ],
    ids=["synchronous", "power-arclength", "sfd"],
)
def test_unguided_sampling_is_the_euler_integration_of_the_ema_network(schedule):
    model = tiny_module(**schedule)
    model.ema.module = KnownVelocity()
    model.network = KnownVelocity(scale=-1.0)  # a different field: must not be used
    lead, lag = model.generate(5, 7, torch.Generator().manual_seed(3))
    ref_lead, ref_lag = euler_by_hand(model, 5, 7, 3, KnownVelocity())
    torch.testing.assert_close(lead, ref_lead)
    torch.testing.assert_close(lag, ref_lag)
    # use_ema=False samples the raw network instead
    raw = model.generate(5, 7, torch.Generator().manual_seed(3), use_ema=False)
    ref_raw = euler_by_hand(model, 5, 7, 3, KnownVelocity(scale=-1.0))
    torch.testing.assert_close(raw[1], ref_raw[1])
    assert not torch.allclose(raw[1], lag)


def test_classifier_free_guidance_extrapolates_from_the_unconditional_field():
    model = tiny_module(schedule="power", power_exponent=2.0)
    model.ema.module = KnownVelocity()
    labels = torch.tensor([0, 3, 9, 1])
    lead, lag = model.generate(4, 6, torch.Generator().manual_seed(1), labels, guidance_scale=2.5)
    ref = euler_by_hand(model, 4, 6, 1, KnownVelocity(), labels=labels, scale=2.5)
    torch.testing.assert_close(lead, ref[0])
    torch.testing.assert_close(lag, ref[1])
    # scale 1: the conditional field alone; the labels change the samples
    cond = model.generate(4, 6, torch.Generator().manual_seed(1), labels, guidance_scale=1.0)
    ref_cond = euler_by_hand(model, 4, 6, 1, KnownVelocity(), labels=labels)
    torch.testing.assert_close(cond[1], ref_cond[1])
    assert not torch.allclose(cond[1], lag)
    # the module's own guidance_scale is the default
    model.hparams.guidance_scale = 2.5
    default = model.generate(4, 6, torch.Generator().manual_seed(1), labels)
    torch.testing.assert_close(default[1], lag)


def test_autoguidance_extrapolates_from_the_guide_network():
    model = tiny_module(schedule="synchronous", num_classes=0)
    model.ema.module = KnownVelocity()
    guide = KnownVelocity(scale=0.5)
    lead, lag = model.generate(3, 5, torch.Generator().manual_seed(2), guidance_scale=3.0,
                               guide=guide)  # fmt: skip

    def guided(a, b, t_lead, t_lag, labels):
        good, bad = KnownVelocity()(a, b, t_lead, t_lag, labels), guide(a, b, t_lead, t_lag, labels)
        return tuple(w + 3.0 * (g - w) for g, w in zip(good, bad, strict=True))

    ref = euler_by_hand(model, 3, 5, 2, guided)
    torch.testing.assert_close(lead, ref[0])
    torch.testing.assert_close(lag, ref[1])


def test_time_grid_follows_the_sample_grid_setting():
    """``sample_grid`` picks the arc-length grid or the uniform tau grid for a convex schedule;
    SFD always keeps its own three-phase grid."""
    from async_schedule.core import arclength_time_grid, schedule_time_grid

    for grid, build in (("arclength", arclength_time_grid), ("uniform", schedule_time_grid)):
        model = tiny_module(schedule="power", power_exponent=4.0, sample_grid=grid)
        want = build(model.schedule, 9)
        for got, expected in zip(model.time_grid(9), want, strict=True):
            assert torch.equal(got, expected)
    arc = tiny_module(schedule="power", power_exponent=4.0, sample_grid="arclength")
    uniform = tiny_module(schedule="power", power_exponent=4.0, sample_grid="uniform")
    assert not torch.equal(arc.time_grid(9)[0], uniform.time_grid(9)[0])
    sfd = tiny_module(schedule="sfd", sfd_delta=0.5, sample_grid="arclength")
    for got, expected in zip(sfd.time_grid(9), sfd.schedule.time_grid(9), strict=True):
        assert torch.equal(got, expected)
