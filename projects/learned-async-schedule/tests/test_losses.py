"""Value tests of the LightningModule's training path without data or a trainer: the loss a
batch gets (``_losses``: the time draw, the per-representation noise, the label dropout, the
network call, Eq. 5), the lead / lag times and weights of each schedule (``times``), and the
probe's speed term in ``training_step``. Stub velocity fields with known values stand in for
the network, so a swapped argument, a wrong time or a dropped weight shows."""

import pytest
import torch
from torch import nn

from async_schedule.baselines import SFDShiftedPath
from async_schedule.core import (
    corrected_lag_weight,
    interpolate,
    joint_flow_matching_loss,
    sample_global_time,
    schedule_corrected_weight,
)
from async_schedule.model import AsyncDiffusionModule


class LabelAwareVelocity(nn.Module):
    def forward(self, lead, lag, t_lead, t_lag, labels):
        shift = 0.0 if labels is None else (labels.float() + 1).reshape(-1, 1, 1, 1)
        # the lead velocity also reads the texture and its time, as the DiT does: the lead
        # loss then depends on f, so the probe's gradient has a lead part
        texture = lag.mean(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)
        v_lead = 0.5 * lead + shift + t_lead.reshape(-1, 1, 1, 1) + 0.3 * t_lag.reshape(-1, 1, 1, 1)
        v_lead = v_lead + 0.2 * texture
        v_lag = -lag + 2 * t_lag.reshape(-1, 1, 1, 1) + 0.1 * shift
        return v_lead, v_lag


def batch(n=6):
    g = torch.Generator().manual_seed(11)
    return {
        "lead": torch.randn(n, 8, 1, 1, generator=g),
        "lag": torch.randn(n, 1, 16, 16, generator=g),
        "label": torch.arange(n) % 10,
    }


def module(**overrides):
    args = dict(width=32, depth=1, heads=2, lead_channels=8, lead_size=1)
    model = AsyncDiffusionModule(**{**args, **overrides})
    model.network = LabelAwareVelocity()
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {"schedule": "learned", "schedule_init": 0.0},  # a lagging f, corrected weight
        {"schedule": "power", "power_exponent": 3.0, "corrected": False},
        {"schedule": "sfd", "sfd_delta": 0.5, "lead_loss_weight": 0.25},
        {"schedule": "synchronous", "num_classes": 10, "label_dropout": 0.5},
    ],
    ids=["learned", "power-uncorrected", "sfd", "conditional"],
)
def test_losses_are_eq5_on_the_schedules_times_and_fresh_noise(overrides):
    model = module(**overrides)
    data, h = batch(), model.hparams
    torch.manual_seed(5)
    got = model._losses(data, drop_labels=True)
    torch.manual_seed(5)  # the same draws in the same order, written out
    tau = sample_global_time(6, None, h.time_loc, h.time_scale, h.uniform_share)
    t_lead, t_lag, weight = model.times(tau)
    x_lead, u_lead = interpolate(data["lead"], torch.randn_like(data["lead"]), t_lead)
    x_lag, u_lag = interpolate(data["lag"], torch.randn_like(data["lag"]), t_lag)
    labels = None
    if h.num_classes:
        drop = torch.rand(6) < h.label_dropout
        labels = torch.where(drop, h.num_classes, data["label"])
        assert bool(drop.any()) and not bool(drop.all())  # the dropout acts on this draw
    v_lead, v_lag = LabelAwareVelocity()(x_lead, x_lag, t_lead, t_lag, labels)
    want = joint_flow_matching_loss(v_lead, v_lag, u_lead, u_lag, weight, h.lead_loss_weight)
    for key in ("loss", "loss_lead", "loss_lag"):
        torch.testing.assert_close(got[key], want[key])
    # validation keeps the labels
    if h.num_classes:
        torch.manual_seed(5)
        kept = model._losses(data, drop_labels=False)
        assert not torch.allclose(kept["loss"], got["loss"])


def test_times_and_weights_of_each_schedule():
    tau = torch.tensor([0.0, 0.2, 0.5, 0.9, 1.0])
    learned = module(schedule="learned", schedule_init=0.0)
    t_lead, t_lag, weight = learned.times(tau)
    assert torch.equal(t_lead, tau)
    with torch.no_grad():
        torch.testing.assert_close(t_lag, learned.schedule(tau))
        torch.testing.assert_close(weight, corrected_lag_weight(tau, learned.schedule))
    assert bool((t_lag[1:-1] < tau[1:-1]).all())  # the texture lags
    assert module(schedule="learned", corrected=False).times(tau)[2] is None
    sfd = module(schedule="sfd", sfd_delta=0.5)
    s_lead, s_lag, s_weight = sfd.times(tau)
    path = SFDShiftedPath(0.5)
    want_lead, want_lag = path.times(tau)
    assert torch.equal(s_lead, want_lead) and torch.equal(s_lag, want_lag)
    torch.testing.assert_close(
        s_weight, schedule_corrected_weight(tau, want_lag, path.lag_speed(tau))
    )
    assert float(s_weight[1]) == 0.0  # texture held at noise: no weight


class Logs:
    """Records what ``self.log`` / ``self.log_dict`` receive (no trainer here)."""

    def __init__(self, model, monkeypatch):
        self.values, self.kwargs = {}, {}

        def log(name, value, **kwargs):
            self.values[name], self.kwargs[name] = value, kwargs

        def log_dict(values, **kwargs):
            for name, value in values.items():
                log(name, value, **kwargs)

        monkeypatch.setattr(model, "log", log)
        monkeypatch.setattr(model, "log_dict", log_dict)


def test_probe_step_adds_the_speed_term_and_the_main_stage_does_not(monkeypatch):
    model = module(
        schedule="learned", schedule_init=0.0, probe_steps=5, speed_weight=0.3,
        num_classes=10, label_dropout=0.5,
    )  # fmt: skip
    logs = Logs(model, monkeypatch)
    data = batch()
    torch.manual_seed(2)
    probing = model.training_step(data, 0)
    torch.manual_seed(2)
    plain = model._losses(data, drop_labels=True)  # training drops labels (CFG)
    speed = model.schedule.kinetic_excess()
    torch.testing.assert_close(probing, plain["loss"] + 0.3 * speed)
    assert float(speed.detach()) > 0.01  # the term is not zero here
    torch.testing.assert_close(logs.values["schedule/speed"], speed)
    for key in ("loss", "loss_lead", "loss_lag"):
        torch.testing.assert_close(logs.values[f"train/{key}"], plain[key])
        assert logs.kwargs[f"train/{key}"] == {"prog_bar": False}
    torch.manual_seed(2)
    kept = model._losses(data, drop_labels=False)["loss"]
    assert not torch.allclose(kept, plain["loss"])  # so the step did drop labels
    model.probing = False
    logs.values.clear()
    torch.manual_seed(2)
    torch.testing.assert_close(model.training_step(data, 0), plain["loss"])
    torch.testing.assert_close(logs.values["schedule/speed"], speed.detach())  # still logged


def test_probe_diagnostics_split_the_schedule_gradient(monkeypatch):
    """With probe_diagnostics, the step keeps the gradients on the a_k of the lag term (the
    loss less the weighted lead term) and of the speed penalty, computed by hand here; without
    the probe nothing is kept."""
    model = module(
        schedule="learned", schedule_init=0.0, probe_steps=5, probe_diagnostics=True,
        speed_weight=0.3, lead_loss_weight=0.5,
    )  # fmt: skip
    Logs(model, monkeypatch)
    data = batch()
    torch.manual_seed(4)
    model.training_step(data, 0)
    lag_part, speed_part = model._partial_gradients
    torch.manual_seed(4)
    losses = model._losses(data, drop_labels=True)
    a = model.schedule.raw_increments
    lag_term = losses["loss"] - 0.5 * losses["loss_lead"]
    (want_lag,) = torch.autograd.grad(lag_term, a, retain_graph=True)
    (want_speed,) = torch.autograd.grad(0.3 * model.schedule.kinetic_excess(), a)
    torch.testing.assert_close(lag_part, want_lag)
    torch.testing.assert_close(speed_part, want_speed)
    assert float(want_lag.abs().sum()) > 0 and float(want_speed.abs().sum()) > 0
    (lead_part,) = torch.autograd.grad(losses["loss_lead"], a)
    assert float(lead_part.abs().sum()) > 1e-4  # the lead term reaches f: the split matters
    # the step's loss still backpropagates after the diagnostic gradients (retain_graph)
    model.schedule.raw_increments.grad = None
    torch.manual_seed(4)
    model.training_step(data, 0).backward()
    assert model.schedule.raw_increments.grad is not None
    # the main stage: no probe, no diagnostic gradients, even with the flag on
    model.probing, model._partial_gradients = False, None
    torch.manual_seed(4)
    model.training_step(data, 0)
    assert model._partial_gradients is None


def test_times_at_a_non_default_time_density_and_the_sfd_switch():
    """The corrected weights use the module's own time density (loc, scale, uniform share),
    for the convex family and for SFD; SFD without the correction has no weight."""
    density = {"time_loc": 0.5, "time_scale": 0.7, "uniform_share": 0.2}
    tau = torch.tensor([0.1, 0.4, 0.8])
    kwargs = {"loc": 0.5, "scale": 0.7, "uniform_share": 0.2}
    learned = module(schedule="learned", schedule_init=0.0, **density)
    with torch.no_grad():
        want = corrected_lag_weight(tau, learned.schedule, **kwargs)
    torch.testing.assert_close(learned.times(tau)[2], want)
    sfd = module(schedule="sfd", sfd_delta=0.3, **density)
    path = SFDShiftedPath(0.3)
    want = schedule_corrected_weight(tau, path.times(tau)[1], path.lag_speed(tau), **kwargs)
    torch.testing.assert_close(sfd.times(tau)[2], want)
    assert module(schedule="sfd", sfd_delta=0.3, corrected=False).times(tau)[2] is None


def test_losses_draw_times_from_the_modules_density():
    """A non-default uniform share changes the time draw, hence the loss (same seed)."""
    data = batch()
    losses = []
    for share in (0.1, 0.9):
        model = module(schedule="synchronous", uniform_share=share)
        torch.manual_seed(8)
        losses.append(model._losses(data, drop_labels=True)["loss"])
        torch.manual_seed(8)
        tau = sample_global_time(6, None, 0.0, 1.0, share)
        torch.manual_seed(8)
        assert torch.equal(model._losses(data, drop_labels=True)["loss"], losses[-1])
        assert tau.shape == (6,)
    assert not torch.allclose(losses[0], losses[1])


def test_build_schedule_per_kind():
    """synchronous is tau^1 whatever power_exponent says; power uses its exponent; frozen
    builds the given slopes in float64 (slopes that float32 would merge are kept apart)."""
    from async_schedule.baselines import PowerSchedule
    from async_schedule.core import ConvexSchedule

    sync = module(schedule="synchronous", power_exponent=3.0).schedule
    assert isinstance(sync, PowerSchedule) and sync.exponent == 1.0
    power = module(schedule="power", power_exponent=3.0).schedule
    assert isinstance(power, PowerSchedule) and power.exponent == 3.0
    slopes = [0.5, 0.5 + 1e-9, 1.0, 2.0]  # strictly increasing only in float64
    frozen = module(schedule="frozen", frozen_slopes=slopes).schedule
    assert isinstance(frozen, ConvexSchedule) and frozen.bins == 3
    with torch.no_grad():
        got = frozen.normalised_slopes().double()
    want = torch.tensor(slopes, dtype=torch.float64)
    torch.testing.assert_close(got / got[0], want / want[0], rtol=1e-5, atol=1e-6)
