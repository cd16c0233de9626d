import math

import pytest
import torch
from scipy import stats

from async_schedule.baselines import POWER_GRID, PowerSchedule, SFDShiftedPath
from async_schedule.core import (
    ConvexSchedule,
    average_schedules,
    corrected_lag_weight,
    detect_stable_window,
    global_time_density,
    guided_velocity,
    interpolate,
    joint_flow_matching_loss,
    sample_global_time,
    sample_joint_ode,
    schedule_corrected_weight,
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
