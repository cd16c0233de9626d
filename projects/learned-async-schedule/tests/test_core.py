import inspect
import math

import numpy as np
import pytest
import torch
from scipy import stats

from async_schedule.baselines import POWER_GRID, PowerSchedule, SFDShiftedPath
from async_schedule.core import (
    ConvexSchedule,
    arclength_time_grid,
    average_schedules,
    corrected_lag_weight,
    detect_stable_window,
    fit_schedule_to_path,
    global_time_density,
    guided_velocity,
    interpolate,
    joint_flow_matching_loss,
    path_chamfer,
    path_hausdorff,
    sample_global_time,
    sample_joint_ode,
    schedule_corrected_weight,
    schedule_path,
    schedule_time_grid,
)

GRID = torch.linspace(0, 1, 2001, dtype=torch.float64)


def random_schedule(seed: int, bins: int = 8) -> ConvexSchedule:
    schedule = ConvexSchedule(bins)
    with torch.no_grad():
        schedule.raw_increments.copy_(
            3 * torch.randn(bins, generator=torch.Generator().manual_seed(seed))
        )
    return schedule


def assert_convex_monotone_bijection(f: torch.Tensor) -> None:
    """f sampled on GRID: exact end points, strictly increasing, non-negative second differences."""
    assert f[0].item() == 0.0 and f[-1].item() == 1.0
    assert (torch.diff(f) > 0).all()
    assert (torch.diff(f, n=2) >= -1e-12).all()


@pytest.mark.parametrize("seed", range(8))
def test_schedule_is_a_convex_monotone_bijection_for_random_parameters(seed):
    schedule = random_schedule(seed)
    with torch.no_grad():
        f = schedule(GRID)
    assert_convex_monotone_bijection(f)
    assert (f <= GRID + 1e-12).all()  # the leading property f(tau) <= tau
    s = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.allclose(schedule(schedule.inverse(s)), s, atol=1e-10)
        assert torch.allclose(schedule.inverse(schedule(s)), s, atol=1e-8)


def test_family_spans_identity_and_strongly_lagging_shapes():
    identity, lagging = ConvexSchedule(8, init_increment=-30.0), ConvexSchedule(8, -30.0)
    with torch.no_grad():
        lagging.raw_increments[-1] = (
            1000.0  # f' jumps in the last bin: semantics first, then texture
        )
        assert torch.allclose(identity(GRID), GRID, atol=1e-9)
        assert lagging(torch.tensor([0.875], dtype=torch.float64)).item() < 0.02


def test_derivative_matches_autograd_and_float64_gradcheck():
    schedule = random_schedule(3).double()
    tau = torch.rand(50, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(schedule(tau).sum(), tau)
    assert torch.allclose(grad, schedule.derivative(tau.detach()), atol=1e-10)
    assert torch.autograd.gradcheck(
        lambda a: _f_of(a, tau.detach()),
        (schedule.raw_increments.detach().clone().requires_grad_(),),
    )


def _f_of(raw: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    schedule = ConvexSchedule(raw.numel()).double()
    return torch.func.functional_call(schedule, {"raw_increments": raw}, (tau,))


def test_kinetic_excess_closed_form_matches_quadrature_and_vanishes_at_identity():
    schedule = random_schedule(5).double()
    with torch.no_grad():
        quadrature = torch.trapezoid(schedule.derivative(GRID) ** 2, GRID) - 1
        assert schedule.kinetic_excess().item() == pytest.approx(quadrature.item(), abs=1e-6)
        assert schedule.kinetic_excess().item() > 0
        assert abs(ConvexSchedule(8, -30.0).double().kinetic_excess().item()) < 1e-9


def test_time_density_matches_the_sampler_and_the_logit_normal_formula():
    x = torch.tensor([0.1, 0.5, 0.8], dtype=torch.float64)
    logit_normal = stats.norm.pdf(stats.logistic.ppf(x.numpy())) / (x * (1 - x)).numpy()
    expected = 0.9 * torch.from_numpy(logit_normal) + 0.1
    assert torch.allclose(global_time_density(x), expected, atol=1e-12)
    tau = sample_global_time(200_000, torch.Generator().manual_seed(0)).double()
    shares = torch.histc(tau, bins=10, min=0, max=1) / len(tau)
    edges = torch.linspace(0, 1, 11, dtype=torch.float64)
    cdf = torch.from_numpy(stats.norm.cdf(stats.logistic.ppf(edges.numpy())))
    expected_shares = 0.9 * torch.diff(cdf) + 0.1 * 0.1
    assert torch.allclose(shares, expected_shares, atol=3e-3)


def test_corrected_weight_matches_its_formula_and_is_finite_at_the_ends():
    schedule = random_schedule(1).double()
    with torch.no_grad():
        tau = torch.tensor([0.0, 0.2, 0.7, 1.0], dtype=torch.float64)
        weight = corrected_lag_weight(tau, schedule)
        formula = (
            global_time_density(schedule(tau)) * schedule.derivative(tau) / global_time_density(tau)
        )
        assert torch.allclose(weight, formula)
        assert torch.isfinite(weight).all()
        ends = schedule.derivative(torch.tensor([0.0, 1.0], dtype=torch.float64))
        assert torch.allclose(weight[[0, -1]], ends)  # p(0) = p(1) = rho, so w = f' there


def test_correction_keeps_the_lag_noise_level_weights_fixed():
    """E_tau~p[w(tau) h(f(tau))] = E_t~p[h(t)] for any h: f only re-pairs lead and lag times."""
    schedule = random_schedule(2).double()
    h = lambda t: torch.cos(5 * t) + t**2  # noqa: E731
    with torch.no_grad():
        p = global_time_density(GRID)
        corrected = torch.trapezoid(
            p * corrected_lag_weight(GRID, schedule) * h(schedule(GRID)), GRID
        )
        uncorrected = torch.trapezoid(p * h(schedule(GRID)), GRID)
    reference = torch.trapezoid(p * h(GRID), GRID)
    assert corrected.item() == pytest.approx(reference.item(), abs=2e-3)
    assert abs(uncorrected.item() - reference.item()) > 0.05


def test_loss_weights_only_the_lagging_term():
    v = [torch.randn(4, 2, 3, 3) for _ in range(4)]
    plain = joint_flow_matching_loss(*v)
    doubled = joint_flow_matching_loss(*v, lag_weight=torch.full((4,), 2.0))
    assert doubled["loss"].item() == pytest.approx(plain["loss"].item() + plain["loss_lag"].item())
    assert doubled["loss_lead"] == plain["loss_lead"]


def test_interpolant_ends_and_target():
    x, eps = torch.randn(3, 1, 2, 2), torch.randn(3, 1, 2, 2)
    x_t, u = interpolate(x, eps, torch.tensor([0.0, 1.0, 0.5]))
    assert torch.equal(x_t[0], eps[0]) and torch.equal(x_t[1], x[1])
    assert torch.allclose(u, x - eps)


def test_stable_window_is_found_and_falls_back():
    moving = torch.linspace(0, 1, 60)[:, None] * torch.ones(1, 5)
    settled = torch.cat([moving, torch.ones(40, 5)])
    start = detect_stable_window(settled, lag=5, threshold=1e-3)
    assert 55 <= start <= 60  # curves from ~60 on are constant (the lag spans the boundary)
    assert detect_stable_window(torch.linspace(0, 1, 100)[:, None], lag=5, threshold=1e-3) == 70


def test_window_average_is_a_valid_member_and_the_pointwise_mean():
    members = [random_schedule(seed).double() for seed in range(5)]
    slopes = torch.stack([m.normalised_slopes().detach() for m in members])
    average = average_schedules(slopes).double()
    with torch.no_grad():
        mean_curve = torch.stack([m(GRID) for m in members]).mean(0)
        assert isinstance(average, ConvexSchedule)
        assert torch.allclose(average(GRID), mean_curve, atol=1e-6)
        assert_convex_monotone_bijection(average(GRID))
        assert (average.raw_increments.isfinite()).all()


def test_baselines_lead_and_stay_in_range():
    for p in POWER_GRID:
        f = PowerSchedule(p)(GRID)
        assert_convex_monotone_bijection(f)
        assert torch.allclose(PowerSchedule(p).inverse(f), GRID, atol=1e-6)
    lead, lag = SFDShiftedPath(0.3).times(GRID)
    assert (lag <= lead).all() and lead.max() == 1 and lag.min() == 0
    lead_grid, lag_grid = SFDShiftedPath(0.3).time_grid(13)
    assert lead_grid[0] == 0 and lag_grid[-1] == 1 and (lead_grid[-3:] == 1).all()
    with pytest.raises(ValueError, match="p >= 1"):
        PowerSchedule(0.5)


@pytest.mark.parametrize("path", ["learned", "sfd"])
@pytest.mark.parametrize("method", ["euler", "heun"])
def test_joint_ode_reaches_the_data_with_the_exact_velocity(path, method):
    """For a single data point x* the exact velocity is (x* - x_t) / (1 - t) (its limit at t = 1
    is x* - eps, the constant speed of the straight path); the joint sampler must land on x* for
    both representations along their own time grids."""
    targets = torch.randn(2, 4, 2, 2), torch.randn(2, 1, 4, 4)
    noises = torch.randn(2, 4, 2, 2), torch.randn(2, 1, 4, 4)

    def exact(x, target, noise, t):
        t = t.reshape(-1, 1, 1, 1)
        return torch.where(t < 1, (target - x) / (1 - t).clamp(min=1e-9), target - noise)

    def velocity(a, b, t_lead, t_lag):
        return exact(a, targets[0], noises[0], t_lead), exact(b, targets[1], noises[1], t_lag)

    grid = (
        SFDShiftedPath(0.3).time_grid(13)
        if path == "sfd"
        else schedule_time_grid(random_schedule(0), 12)
    )
    lead, lag = sample_joint_ode(velocity, *noises, *grid, method)
    assert torch.allclose(lead, targets[0], atol=1e-4) and torch.allclose(
        lag, targets[1], atol=1e-4
    )


def test_guidance_interpolates_and_extrapolates():
    good, bad = (torch.ones(2), torch.ones(3)), (torch.zeros(2), torch.zeros(3))
    assert torch.equal(guided_velocity(good, bad, 1.0)[0], good[0])
    assert torch.equal(guided_velocity(good, bad, 2.0)[1], 2 * good[1])
    assert math.isclose(guided_velocity(good, bad, 0.0)[0].sum().item(), 0.0)


def synthetic_lag_loss(t_lag: torch.Tensor, t_lead: torch.Tensor) -> torch.Tensor:
    """A smooth stand-in for E[l_lag | t_lag, t_lead]: falls as the lead gets cleaner."""
    return (1 + torch.sin(3 * t_lag)) * torch.exp(-2 * (t_lead - t_lag)) + t_lead**2


def corrected_objective(schedule: ConvexSchedule, tau: torch.Tensor) -> torch.Tensor:
    """E_tau~p[w(tau) l(f(tau), tau)] by quadrature over tau, through the code path training
    uses (corrected_lag_weight, the schedule's forward): differentiable in the a_k."""
    p = global_time_density(tau)
    weight = corrected_lag_weight(tau, schedule)
    return torch.trapezoid(p * weight * synthetic_lag_loss(schedule(tau), tau), tau)


def reference_objective(schedule: ConvexSchedule, t: torch.Tensor) -> torch.Tensor:
    """int pi(t) l(t, f^{-1}(t)) dt by quadrature over the lag time (no autograd)."""
    with torch.no_grad():
        return torch.trapezoid(
            global_time_density(t) * synthetic_lag_loss(t, schedule.inverse(t)), t
        )


def test_corrected_objective_gradient_matches_the_quadrature_gradient():
    """d/da_k of the corrected objective equals the finite-difference gradient of
    int pi(t) l(t, f^{-1}(t)) dt: the weight's dependence on f (its f' factor) carries part of
    the schedule gradient, so a detached weight fails this test."""
    schedule = random_schedule(5).double()
    tau = torch.linspace(0, 1, 20001, dtype=torch.float64)
    t = torch.linspace(0, 1, 4001, dtype=torch.float64)
    value = corrected_objective(schedule, tau)
    (gradient,) = torch.autograd.grad(value, schedule.raw_increments)
    assert value.item() == pytest.approx(reference_objective(schedule, t).item(), rel=1e-4)
    numeric = torch.zeros_like(gradient)
    h = 1e-4
    for k in range(schedule.bins):
        with torch.no_grad():
            schedule.raw_increments[k] += h
            up = reference_objective(schedule, t)
            schedule.raw_increments[k] -= 2 * h
            down = reference_objective(schedule, t)
            schedule.raw_increments[k] += h
        numeric[k] = (up - down) / (2 * h)
    assert numeric.abs().max() > 1e-3  # the synthetic loss does depend on the pairing
    assert torch.allclose(gradient, numeric, rtol=2e-2, atol=2e-4)
    # the same objective with the weight detached: its gradient is wrong
    p = global_time_density(tau)
    detached = corrected_lag_weight(tau, schedule).detach()
    wrong = torch.trapezoid(p * detached * synthetic_lag_loss(schedule(tau), tau), tau)
    (wrong_gradient,) = torch.autograd.grad(wrong, schedule.raw_increments)
    assert not torch.allclose(wrong_gradient, numeric, rtol=2e-2, atol=2e-4)


def test_sfd_correction_keeps_the_lag_noise_level_weights_fixed():
    """SFD's path with the corrected weight pi(t_lag) t_lag' / p(tau): the marginal weight of
    each texture time is the reference density, as for the convex family."""
    path = SFDShiftedPath(0.3)
    h = lambda t: torch.cos(5 * t) + t**2  # noqa: E731
    fine = torch.linspace(0, 1, 200_001, dtype=torch.float64)
    _, t_lag = path.times(fine)
    weight = schedule_corrected_weight(fine, t_lag, path.lag_speed(fine))
    corrected = torch.trapezoid(global_time_density(fine) * weight * h(t_lag), fine)
    reference = torch.trapezoid(global_time_density(fine) * h(fine), fine)
    assert corrected.item() == pytest.approx(reference.item(), abs=2e-3)
    assert (weight[fine < 0.3 / 1.3 - 1e-6] == 0).all()  # the texture is held at noise there


def test_relative_stable_window_needs_f_to_stop_moving():
    """A slow steady drift is below any small absolute threshold but not below a share of the
    total movement; a settled tail is stable under both rules."""
    drift = torch.linspace(0, 0.02, 100)[:, None] * torch.ones(1, 3)  # 0.002 per 10 steps
    assert detect_stable_window(drift, lag=10, threshold=0.01) == 0  # absolute: all stable
    assert detect_stable_window(drift, lag=10, threshold=0.1, relative=True) == 70  # fallback
    settled = torch.cat([drift, torch.full((50, 3), 0.02)])
    assert 85 <= detect_stable_window(settled, lag=10, threshold=0.1, relative=True) <= 100


# ----------------------------------------------------------------- value tests (mutation lane)


def test_schedule_defaults_bins_and_errors():
    assert ConvexSchedule().bins == 8  # Eq. 3's K in the README
    single = ConvexSchedule(bins=1, init_increment=0.0).double()  # one bin: a quadratic f
    with torch.no_grad():
        assert_convex_monotone_bijection(single(GRID))
    with pytest.raises(ValueError, match="^a schedule needs at least one bin, got bins=0$"):
        ConvexSchedule(bins=0)


def test_schedules_clamp_times_outside_the_unit_interval():
    """Every schedule reads tau outside [0, 1] as the nearest end: f = 0 / 1, f' = the end slopes,
    the SFD path at its start / end (a bisection or an ODE step may overshoot slightly)."""
    outside = torch.tensor([-0.5, 1.5], dtype=torch.float64)
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
    learned = random_schedule(3).double()
    with torch.no_grad():
        assert torch.equal(learned(outside), ends)
        assert torch.allclose(learned.derivative(outside), learned.derivative(ends))
    for p in (1.5, 3.0):
        power = PowerSchedule(p)
        assert torch.equal(power(outside), ends) and torch.equal(power.inverse(outside), ends)
        assert torch.equal(power.derivative(outside), power.derivative(ends))
    lead, lag = SFDShiftedPath(0.3).times(outside)
    assert torch.equal(lead, ends) and torch.equal(lag, ends)


def test_from_normalised_slopes_rejects_invalid_slopes():
    for bad in ([-1.0, -2.0, -3.0], [1.0, 1.0, 2.0], [1.0, 0.5, 2.0]):
        with pytest.raises(
            ValueError, match="^knot slopes must be positive and strictly increasing$"
        ):
            ConvexSchedule.from_normalised_slopes(torch.tensor(bad))


def test_time_sampler_and_density_at_a_shifted_logit_normal():
    """Eq. 4 with loc = 0.5, scale = 0.7: the sampler's histogram and the density agree, and
    the density matches scipy's logit-normal; the same generator gives the same draws."""
    density = {"loc": 0.5, "scale": 0.7, "uniform_share": 0.2}
    x = torch.tensor([0.1, 0.5, 0.8], dtype=torch.float64)
    z = (stats.logistic.ppf(x.numpy()) - 0.5) / 0.7
    logit_normal = stats.norm.pdf(z) / (0.7 * (x * (1 - x)).numpy())
    expected = 0.8 * torch.from_numpy(logit_normal) + 0.2
    assert torch.allclose(global_time_density(x, **density), expected, atol=1e-12)
    tau = sample_global_time(200_000, torch.Generator().manual_seed(1), **density).double()
    edges = torch.linspace(0, 1, 11, dtype=torch.float64)
    cdf = torch.from_numpy(stats.norm.cdf((stats.logistic.ppf(edges.numpy()) - 0.5) / 0.7))
    shares = torch.histc(tau, bins=10, min=0, max=1) / len(tau)
    assert torch.allclose(shares, 0.8 * torch.diff(cdf) + 0.2 * 0.1, atol=3e-3)
    again = sample_global_time(1000, torch.Generator().manual_seed(7), **density)
    assert torch.equal(again, sample_global_time(1000, torch.Generator().manual_seed(7), **density))


def test_corrected_weights_use_the_given_time_density():
    density = {"loc": -0.4, "scale": 1.3, "uniform_share": 0.05}
    schedule = random_schedule(4).double()
    tau = torch.tensor([0.1, 0.45, 0.9], dtype=torch.float64)
    with torch.no_grad():
        f, slope = schedule(tau), schedule.derivative(tau)
        expected = global_time_density(f, **density) * slope / global_time_density(tau, **density)
        assert torch.allclose(corrected_lag_weight(tau, schedule, **density), expected)
        assert torch.allclose(schedule_corrected_weight(tau, f, slope, **density), expected)
        assert not torch.allclose(corrected_lag_weight(tau, schedule), expected)


def test_joint_loss_values_by_hand():
    """Per-representation mean squared velocity error per sample; the lag term weighted per
    sample; total = lead_weight * lead + mean(w * lag)."""
    v_lead = torch.full((2, 3, 1, 1), 1.0)
    u_lead = torch.tensor([2.0, 3.0]).reshape(2, 1, 1, 1).expand(2, 3, 1, 1)  # errors 1 and 2
    v_lag = torch.full((2, 1, 2, 2), 2.0)
    u_lag = torch.tensor([[[[3.0, 3.0], [3.0, 3.0]]], [[[5.0, 5.0], [5.0, 3.0]]]])
    weight = torch.tensor([0.5, 2.0])
    out = joint_flow_matching_loss(v_lead, v_lag, u_lead, u_lag, weight, lead_weight=3.0)
    lead = (1.0 + 4.0) / 2
    lag_per_sample = torch.tensor([1.0, (9 * 3 + 1) / 4])
    assert out["loss_lead"].item() == pytest.approx(lead)
    assert out["loss_lag"].item() == pytest.approx(lag_per_sample.mean().item())
    assert out["loss"].item() == pytest.approx(3.0 * lead + (weight * lag_per_sample).mean().item())
    plain = joint_flow_matching_loss(v_lead, v_lag, u_lead, u_lag)  # lead weight 1, no w
    assert plain["loss"].item() == pytest.approx(lead + lag_per_sample.mean().item())


def test_stable_window_edge_cases():
    one = torch.zeros(1, 2)
    assert detect_stable_window(one, lag=10, threshold=0.1) == 0  # fallback of a 1-step probe
    assert detect_stable_window(torch.zeros(3, 2), lag=10, threshold=0.1) == 2  # last 30%
    # a jump at the very last step: nothing at the end is stable -> the fallback
    jump = torch.cat([torch.zeros(19, 1), torch.ones(1, 1)])
    assert detect_stable_window(jump, lag=1, threshold=0.5) == 14
    # a change equal to the threshold is not stable; only the last pair is -> window of 2
    steps = torch.tensor([0.0, 0.5, 1.0, 1.5, 1.5])[:, None]
    assert detect_stable_window(steps, lag=1, threshold=0.5) == 3
    # relative: a share of the largest distance from the *first* curve (0.85 here, threshold
    # 0.085): the 0.07 steps after the first jump are stable. Measured from the second curve
    # (0.5) they would not be; an offset keeps the level itself out of the rule.
    curves = torch.tensor([0.0, 0.5, 0.57, 0.64, 0.71, 0.78, 0.85, 0.85])[:, None] + 5.0
    assert detect_stable_window(curves, lag=1, threshold=0.1, relative=True) == 1
    assert detect_stable_window(curves, lag=1, threshold=0.06, relative=True) == 6


def test_guidance_values_and_matching_representations():
    good, bad = (
        (torch.tensor([3.0, -1.0]), torch.tensor([2.0])),
        (torch.tensor([1.0, 1.0]), torch.tensor([-2.0])),
    )
    lead, lag = guided_velocity(good, bad, 2.5)
    assert torch.allclose(lead, torch.tensor([1.0 + 2.5 * 2.0, 1.0 - 2.5 * 2.0]))
    assert torch.allclose(lag, torch.tensor([-2.0 + 2.5 * 4.0]))
    with pytest.raises(ValueError):
        guided_velocity(good, (*bad, torch.zeros(1)), 2.0)


@pytest.mark.parametrize("method", ["euler", "heun"])
def test_joint_ode_steps_by_hand(method):
    """Two steps on distinct grids: v_lead = -2 x_lead (Heun multiplies by 1 + lh + (lh)^2 / 2),
    v_lag = t_lag (Heun integrates it by the trapezoid rule, which needs the next lag time). The
    last step is Euler for both methods."""
    lead_times = torch.tensor([0.0, 0.5, 1.0])
    lag_times = torch.tensor([0.0, 0.2, 1.0])

    def velocity(a, b, t_lead, t_lag):
        return -2 * a, t_lag.reshape(-1, 1, 1, 1).expand_as(b)

    x_lead, x_lag = torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 2, 2)
    lead, lag = sample_joint_ode(velocity, x_lead, x_lag, lead_times, lag_times, method)
    euler_step = 1 - 2 * 0.5
    first = 1 - 1.0 + 1.0**2 / 2 if method == "heun" else euler_step
    assert lead.flatten()[0].item() == pytest.approx(first * euler_step)
    first_lag = 0.2 * (0.0 + 0.2) / 2 if method == "heun" else 0.0
    assert torch.allclose(lag, torch.full_like(lag, first_lag + 0.8 * 0.2))


def test_joint_ode_default_is_euler_and_bad_methods_are_named():
    def velocity(a, b, t_lead, t_lag):
        return -2 * a, -2 * b

    grid = torch.tensor([0.0, 0.5, 1.0])
    x = torch.ones(1, 1, 1, 1)
    default = sample_joint_ode(velocity, x, x, grid, grid)
    assert torch.equal(default[0], sample_joint_ode(velocity, x, x, grid, grid, "euler")[0])
    with pytest.raises(ValueError, match="^unknown ODE method 'rk4'; use 'euler' or 'heun'$"):
        sample_joint_ode(velocity, x, x, grid, grid, "rk4")


def test_time_grids_have_steps_plus_one_points():
    lead, lag = schedule_time_grid(PowerSchedule(2.0), 5)
    assert torch.allclose(lead, torch.linspace(0, 1, 6)) and torch.allclose(lag, lead**2)
    sfd_lead, sfd_lag = SFDShiftedPath(0.5).time_grid(6)
    u = 1.5 * torch.linspace(0, 1, 7, dtype=torch.float64)
    assert torch.allclose(sfd_lead, u.clamp(0, 1).float())
    assert torch.allclose(sfd_lag, (u - 0.5).clamp(0, 1).float())


def test_baseline_defaults_derivative_and_errors():
    with torch.no_grad():
        assert torch.equal(PowerSchedule()(GRID), GRID)  # the default is synchronous
    assert SFDShiftedPath().delta == 0.3  # SFD's published offset
    tau = torch.linspace(0.05, 0.95, 19, dtype=torch.float64, requires_grad=True)
    for p in (1.0, 1.5, 3.0):
        (autograd,) = torch.autograd.grad(PowerSchedule(p)(tau).sum(), tau)
        assert torch.allclose(PowerSchedule(p).derivative(tau.detach()), autograd)
    for delta in (0.0, 1.0):
        with pytest.raises(
            ValueError, match=rf"^the SFD offset D must lie in \(0, 1\), got {delta}$"
        ):
            SFDShiftedPath(delta)


def test_path_distances_by_hand():
    """Two horizontal segments 0.5 apart: Hausdorff 0.5, chamfer 2 x 0.25; a path is at
    distance 0 from itself; a point set that covers only half of the other is as far as the
    uncovered end (the distance is symmetric)."""
    x = torch.linspace(0, 1, 11, dtype=torch.float64)
    low, high = torch.stack([x, 0 * x], 1), torch.stack([x, 0 * x + 0.5], 1)
    assert float(path_hausdorff(low, high)) == pytest.approx(0.5)
    assert float(path_chamfer(low, high)) == pytest.approx(0.5)
    assert float(path_hausdorff(low, low)) == 0.0
    half = low[:6]  # x in [0, 0.5]
    assert float(path_hausdorff(low, half)) == pytest.approx(0.5)
    assert float(path_hausdorff(half, low)) == pytest.approx(0.5)
    # chamfer, one-sided cover: from `low` to `half` the points x = 0.6..1.0 are 0.1..0.5 away
    # (mean square 0.11 over 11 points: 0.01 + ... + 0.25 = 0.55), back from `half` all are 0
    assert float(path_chamfer(low, half)) == pytest.approx(0.55 / 11)
    assert float(path_chamfer(half, low)) == pytest.approx(0.55 / 11)
    # (tau, f(tau)) of the identity member is the diagonal
    diagonal = schedule_path(ConvexSchedule(8, -30.0), 5)
    torch.testing.assert_close(diagonal[:, 1], diagonal[:, 0], rtol=0, atol=1e-9)


def test_fit_recovers_a_member_and_approaches_a_path_outside_the_family():
    """Fitting a member's own path gives that path back; fitting SFD's shifted path (outside
    the family) gets much closer than the start, and the fit is a valid member (f(0) = 0,
    f(1) = 1, convex), deterministic."""
    target_member = random_schedule(3)
    with torch.no_grad():
        target = schedule_path(target_member)
    fitted = fit_schedule_to_path(target, steps=400)
    assert float(path_hausdorff(schedule_path(fitted), target)) < 0.01
    sfd = torch.stack(SFDShiftedPath(0.7).times(torch.linspace(0, 1, 401, dtype=torch.float64)), 1)
    with torch.no_grad():
        start = float(path_hausdorff(schedule_path(ConvexSchedule(8, -3.0)), sfd))
    member = fit_schedule_to_path(sfd, steps=400)
    reached = float(path_hausdorff(schedule_path(member), sfd))
    assert start > 0.45 and reached < 0.2
    again = fit_schedule_to_path(sfd, steps=400)
    assert torch.equal(again.raw_increments, member.raw_increments)
    f = schedule_path(member)[:, 1]
    assert float(f[0]) == 0.0 and float(f[-1]) == pytest.approx(1.0, abs=1e-12)
    assert bool((torch.diff(f, 2) >= -1e-12).all())  # convex
    assert not member.raw_increments.requires_grad
    # the claim's in-family member relies on the defaults: 8 bins, Adam at 0.5, from a = -3
    defaults = inspect.signature(fit_schedule_to_path).parameters
    assert member.bins == 8 and defaults["lr"].default == 0.5
    assert defaults["init_increment"].default == -3.0 and defaults["steps"].default == 3000
    explicit = fit_schedule_to_path(sfd, bins=8, steps=400, lr=0.5, init_increment=-3.0)
    assert torch.equal(explicit.raw_increments, member.raw_increments)
    # a float32 target path gives the float64 fit of the same points
    single = fit_schedule_to_path(sfd.float(), steps=400)
    torch.testing.assert_close(single.raw_increments, member.raw_increments, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", [PowerSchedule(1.0), PowerSchedule(5.0), random_schedule(2)])
def test_arclength_grid_moves_the_faster_representation_equally_at_every_step(schedule):
    """Every step of the arc-length grid covers the same stretch of the path's L-infinity
    length (int max(1, f') dtau, measured here on a fine grid), the whole length over the
    steps; it runs from (0, 0) to (1, 1) on the schedule; for the identity it is the uniform
    grid."""
    lead, lag = arclength_time_grid(schedule, 12)
    assert lead.shape == lag.shape == (13,)
    assert float(lead[0]) == float(lag[0]) == 0.0 and float(lead[-1]) == float(lag[-1]) == 1.0
    with torch.no_grad():
        torch.testing.assert_close(lag, schedule(lead.double()).float())
        fine = torch.linspace(0, 1, 100_001, dtype=torch.float64)
        pieces = torch.maximum(fine.diff(), schedule(fine).diff())
    cumulative = np.concatenate([[0.0], np.cumsum(pieces.numpy())])
    length = cumulative[-1]
    covered = np.diff(np.interp(lead.double().numpy(), fine.numpy(), cumulative))
    np.testing.assert_allclose(covered, length / 12, rtol=2e-3)
    if isinstance(schedule, PowerSchedule) and schedule.exponent == 1.0:
        torch.testing.assert_close(lead, torch.linspace(0, 1, 13), rtol=0, atol=1e-6)
    else:  # a lagging path is longer: the texture's last stretch gets more than one step
        assert length > 1.05 and int((lag.diff() > 0.5).sum()) == 0
