import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from lifelines import (
    LogNormalFitter,
    PiecewiseExponentialFitter,
    WeibullAFTFitter,
    WeibullFitter,
)
from scipy import integrate, stats

from survival_delay.core import Cohort, JointModel, sample_posterior
from survival_delay.fitting import (
    MCEMSchedule,
    MonteCarloRows,
    delta_method_se,
    e_step_rows,
    fit_direct,
    fit_mcem,
    flatten_blocks,
    lbfgs_maximize,
    sandwich_covariance,
    unflatten_blocks,
)
from survival_delay.hazards import PHComponent, make_family
from survival_delay.simulate import Truth, simulate_cohort, simulate_study
from survival_delay.transfer import fit_joint, transfer, two_step_covariance

F64 = torch.float64
BASELINES = {
    "weibull": torch.tensor([math.log(2.0), math.log(1.5)], dtype=F64),
    "gompertz": torch.tensor([math.log(0.3), 0.7], dtype=F64),
    "piecewise": torch.tensor([-1.0, -0.5, 0.2, -2.0], dtype=F64),
    "lognormal": torch.tensor([0.3, math.log(0.8)], dtype=F64),
}


@pytest.mark.parametrize("name", list(BASELINES))
def test_cumulative_hazard_is_the_integral_of_the_hazard(name):
    family = make_family(name)
    b = BASELINES[name]
    grid = torch.linspace(1e-6, 3.0, 200_001, dtype=F64)
    hazard = family.log_hazard0(grid, b).exp()
    integral = torch.cumulative_trapezoid(hazard, grid)
    closed = family.cumhaz0(grid[1:], b) - family.cumhaz0(grid[:1], b)
    assert torch.allclose(integral[::1000], closed[::1000], atol=2e-4, rtol=1e-4)


def test_closed_forms_of_weibull_gompertz_lognormal():
    t = torch.tensor([0.1, 0.7, 2.5], dtype=F64)
    weibull = make_family("weibull").cumhaz0(t, BASELINES["weibull"])
    assert torch.allclose(weibull, (t / 2.0) ** 1.5)
    gompertz = make_family("gompertz").cumhaz0(t, BASELINES["gompertz"])
    assert torch.allclose(gompertz, 0.3 * (torch.exp(0.7 * t) - 1) / 0.7)
    survival = torch.exp(-make_family("lognormal").cumhaz0(t, BASELINES["lognormal"]))
    expected = stats.lognorm(s=0.8, scale=math.exp(0.3)).sf(t.numpy())
    np.testing.assert_allclose(survival.numpy(), expected, rtol=1e-10)
    log_f = make_family("lognormal").log_hazard0(t, BASELINES["lognormal"]) + torch.log(survival)
    np.testing.assert_allclose(
        log_f.exp().numpy(), stats.lognorm(s=0.8, scale=math.exp(0.3)).pdf(t.numpy())
    )


def test_gompertz_near_zero_slope_keeps_the_series_value_and_its_gradient():
    """Gompertz H0 = a t expm1(ct)/(ct) uses 1 + ct/2 for |ct| < 1e-6 (Eq. G). Pinned by value
    against math.expm1 (exact in float64 here) on both sides of the switch, at c = 0 (the limit
    a t) and by its gradient in c at c = 0, which is a t^2 / 2."""
    family = make_family("gompertz")
    t = torch.tensor([0.5, 1.0, 1.9], dtype=F64)
    for c in (0.0, 4e-7, -4e-7, 5e-6, -5e-6):
        b = torch.tensor([math.log(0.3), c], dtype=F64)
        expected = [0.3 * v * (math.expm1(c * v) / (c * v) if c else 1.0) for v in t.tolist()]
        np.testing.assert_allclose(family.cumhaz0(t, b).numpy(), expected, rtol=1e-13)
    b = torch.tensor([math.log(0.3), 0.0], dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(family.cumhaz0(t, b).sum(), b)
    assert grad[1].item() == pytest.approx(0.3 * t.square().sum().item() / 2, rel=1e-12)


def test_proportional_hazards_scale_the_cumulative_hazard():
    comp = PHComponent(make_family("weibull"), 2)
    params = torch.tensor([0.5, 0.2, 0.7, -0.4], dtype=F64)
    x = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=F64)
    t = torch.tensor([0.8, 0.8], dtype=F64)
    h = comp.cumhaz(params, t, x, offset=0.3)
    assert torch.allclose(h[0] / h[1], torch.exp(torch.tensor(0.7 - 0.8, dtype=F64)))
    assert torch.allclose(comp.cdf(params, t, x), 1 - torch.exp(-comp.cumhaz(params, t, x)))


def _fit_event_only(comp, t, event, weight, x):
    start = {"theta": comp.init_params(float(t.mean())), "gamma": torch.zeros(1, dtype=F64)}

    def objective(b):
        return comp.weighted_loglik(b["theta"], t, event, weight, x) / len(t)

    return lbfgs_maximize(objective, start, ("theta",), max_iter=500)["theta"]


def _censored_sample(rng, n=600):
    t_true = 2.0 * rng.weibull(1.4, n)
    cens = rng.uniform(0.5, 4.0, n)
    t = np.minimum(t_true, cens)
    return t, (t_true <= cens).astype(float), rng.integers(1, 4, n).astype(float)


def test_weighted_weibull_fit_matches_lifelines():
    t, e, w = _censored_sample(np.random.default_rng(0))
    comp = PHComponent(make_family("weibull"), 0)
    theta = _fit_event_only(
        comp, torch.tensor(t), torch.tensor(e), torch.tensor(w), torch.zeros(len(t), 0, dtype=F64)
    )
    ref = WeibullFitter().fit(t, e, weights=w)
    assert math.exp(theta[0]) == pytest.approx(ref.lambda_, rel=1e-4)
    assert math.exp(theta[1]) == pytest.approx(ref.rho_, rel=1e-4)


def test_lognormal_and_piecewise_fits_match_lifelines():
    t, e, _ = _censored_sample(np.random.default_rng(1))
    none = torch.zeros(len(t), 0, dtype=F64)
    ones = torch.ones(len(t), dtype=F64)
    theta = _fit_event_only(
        PHComponent(make_family("lognormal"), 0), torch.tensor(t), torch.tensor(e), ones, none
    )
    ref = LogNormalFitter().fit(t, e)
    assert theta[0].item() == pytest.approx(ref.mu_, abs=1e-4)
    assert math.exp(theta[1]) == pytest.approx(ref.sigma_, rel=1e-4)
    cuts = (0.5, 1.0, 2.0)
    theta = _fit_event_only(
        PHComponent(make_family("piecewise", cuts), 0), torch.tensor(t), torch.tensor(e), ones, none
    )
    ref = PiecewiseExponentialFitter(breakpoints=list(cuts)).fit(t, e)
    np.testing.assert_allclose(1 / theta.exp().numpy(), ref.params_.to_numpy(), rtol=1e-3)


def test_weibull_ph_regression_matches_lifelines_aft():
    """No delays: Weibull PH == Weibull AFT with beta_PH = -rho beta_AFT."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(800)
    t_true = 2.0 * (rng.exponential(size=800) * np.exp(-0.6 * x)) ** (1 / 1.3)
    cens = rng.uniform(0.5, 5.0, 800)
    t, e = np.minimum(t_true, cens), (t_true <= cens).astype(float)
    comp = PHComponent(make_family("weibull"), 1)
    theta = _fit_event_only(
        comp, torch.tensor(t), torch.tensor(e), torch.ones(800, dtype=F64), torch.tensor(x[:, None])
    )
    ref = WeibullAFTFitter().fit(pd.DataFrame({"t": t, "e": e, "x": x}), "t", "e")
    rho = math.exp(ref.params_.loc[("rho_", "Intercept")])
    assert math.exp(theta[1]) == pytest.approx(rho, rel=1e-3)
    assert math.exp(theta[0]) == pytest.approx(
        math.exp(ref.params_.loc[("lambda_", "Intercept")]), rel=1e-3
    )
    assert theta[2].item() == pytest.approx(-rho * ref.params_.loc[("lambda_", "x")], rel=1e-3)


def _one_subject(window, exposure, x=0.3):
    return Cohort(
        torch.tensor([[x]], dtype=F64),
        torch.tensor([window], dtype=F64),
        torch.tensor([exposure], dtype=F64),
        torch.tensor([False]),
        torch.tensor([math.nan], dtype=F64),
        torch.tensor([math.nan], dtype=F64),
    )


def test_quadrature_of_the_unreported_probability_matches_monte_carlo():
    truth = Truth()
    model = JointModel.build(1)
    theta, phi = truth.theta(), truth.phi()
    rng = np.random.default_rng(3)
    for window, exposure in ((0.3, 0.3), (1.2, 1.0)):
        log_s, log_i = model.log_unreported_terms(theta, phi, 0.0, _one_subject(window, exposure))
        n = 400_000
        lp = 0.5 * 0.3
        t = truth.alpha * (rng.exponential(size=n) * np.exp(-lp)) ** (1 / truth.rho)
        d = truth.delay_scale * rng.weibull(truth.delay_shape, n)
        mc_i = np.mean((t <= exposure) & (t + d > window))
        assert math.exp(log_i.item()) == pytest.approx(mc_i, abs=4 * math.sqrt(mc_i / n) + 1e-4)
        assert math.exp(log_s.item()) == pytest.approx(np.mean(t > exposure), abs=0.003)


@pytest.mark.parametrize(
    ("window", "exposure", "gamma"), [(0.4, 0.4, 0.0), (0.45, 0.3, 0.0), (0.45, 0.3, 1.5)]
)
def test_e_step_sampler_matches_the_analytic_posterior(window, exposure, gamma):
    """(0.45, 0.3): the reporting window c runs past the exposure end c' (a lapse), so the
    posterior weight of t is S_D(c - t), not S_D(c' - t); a wrong lag moves the whole CDF.
    gamma = 1.5: a target's shift changes the shape of the event density, not only pi."""
    truth = Truth()
    model = JointModel.build(1)
    theta, phi = truth.theta(), truth.phi()
    cohort = _one_subject(window, exposure)
    generator = torch.Generator().manual_seed(0)
    z, t = sample_posterior(model, theta, phi, cohort, 40_000, generator, gamma)
    pi = model.posterior_event_prob(theta, phi, cohort, gamma).item()
    assert z.double().mean().item() == pytest.approx(pi, abs=4 * math.sqrt(pi * (1 - pi) / 40_000))
    # pi by its definition (Eq. E1) with I (Eq. M2) integrated by scipy: c, not c', in S_D.
    lp = 0.5 * 0.3 + gamma

    def f_t(v):
        h = (v / truth.alpha) ** truth.rho * math.exp(lp)
        return truth.rho / v * h * math.exp(-h) if v > 0 else 0.0

    integral = integrate.quad(lambda v: f_t(v) * math.exp(-(window - v) / 0.15), 0, exposure)[0]
    survival = math.exp(-((exposure / truth.alpha) ** truth.rho) * math.exp(lp))
    assert pi == pytest.approx(integral / (survival + integral), rel=1e-4)  # 32 nodes
    # Analytic posterior CDF of T given Z = 1 (Eq. E2) by fine numerical integration.
    grid = torch.linspace(0, exposure, 20_001, dtype=F64)
    x = cohort.x.expand(len(grid), 1)
    density = (
        model.event.log_density(theta, grid, x, gamma)
        + model.delay.log_survival(phi, window - grid, x)
    ).exp()
    cdf = torch.cumulative_trapezoid(density, grid)
    cdf = torch.cat([cdf.new_zeros(1), cdf / cdf[-1]]).numpy()
    draws = t[0].numpy()
    result = stats.kstest(draws, lambda v: np.interp(v, grid.numpy(), cdf))
    assert result.statistic < 0.012  # 40k draws: the KS 1% critical value is ~0.008 + grid error


def _join(a, b):
    return None if a is None else torch.cat([a, b])


def test_e_step_leaves_reported_subjects_out_and_draws_each_subject_apart():
    """Reported subjects get Z = 0 and T = 0; two identical unreported subjects get their own
    time draws (T given Z = 1 is drawn for every draw; the within-cell jitter per subject)."""
    truth = Truth()
    model = JointModel.build(1)
    twins = _one_subject(0.45, 0.3).subset([0, 0])
    reported = _one_subject(0.45, 0.3)
    reported.reported[:] = True
    reported.event_time[:], reported.delay[:] = 0.1, 0.05
    fields = Cohort.__dataclass_fields__
    cohort = Cohort(*(_join(getattr(twins, f), getattr(reported, f)) for f in fields))
    z, t = sample_posterior(
        model, truth.theta(), truth.phi(), cohort, 2000, torch.Generator().manual_seed(1)
    )
    assert not z[2].any() and bool((t[2] == 0).all())
    assert bool((t[:2] > 0).all()) and bool((t[0] != t[1]).all())


def test_marginal_loglik_gradient_matches_finite_differences():
    sim = simulate_cohort(60, (0.0, 2.0), Truth(), 0.0, np.random.default_rng(4))
    model = JointModel.build(1)
    theta = Truth().theta().clone().requires_grad_()
    phi = Truth().phi().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: model.loglik(a, b, sim.cohort), (theta, phi))


@pytest.mark.parametrize("event_family", ["weibull", "gompertz", "piecewise"])
def test_direct_fit_recovers_the_truth_roughly(event_family):
    sim = simulate_cohort(2000, (0.5, 3.0), Truth(), 0.0, np.random.default_rng(5))
    model = JointModel.build(1, event_family, cuts=(0.5, 1.0, 2.0))
    fit = fit_direct(model, sim.cohort)
    risk = model.timely_risk(fit["theta"], sim.cohort.x, 1.0).mean().item()
    assert risk == pytest.approx(float(sim.true_risk.mean()), abs=0.04)
    assert math.exp(fit["phi"][0]) == pytest.approx(0.15, rel=0.15)


def test_mcem_agrees_with_the_direct_fit():
    sim = simulate_cohort(1000, (0.3, 2.0), Truth(), 0.0, np.random.default_rng(6))
    model = JointModel.build(1)
    direct = fit_direct(model, sim.cohort)
    mcem = fit_mcem(model, sim.cohort, schedule=MCEMSchedule(max_draws=300), seed=0)
    for block in ("theta", "phi"):
        assert torch.allclose(mcem.blocks[block], direct[block], atol=0.02), block
    assert mcem.converged


def test_fit_joint_dispatches_to_each_estimator_with_its_prior():
    sim = simulate_cohort(400, (0.3, 2.0), Truth(), 0.0, np.random.default_rng(8))
    model = JointModel.build(1)
    schedule = MCEMSchedule(max_draws=50, max_iter=3)
    via = fit_joint(model, sim.cohort, "mcem", schedule=schedule, seed=4)
    direct = fit_mcem(model, sim.cohort, schedule=schedule, seed=4).blocks
    for block in ("theta", "phi"):
        torch.testing.assert_close(via[block], direct[block])
    fitted = fit_direct(model, sim.cohort)
    # a baseline scale 0.3 too long, so the level shift gamma has a non-zero MLE to shrink
    theta = fitted["theta"] + torch.tensor([0.3, 0.0, 0.0], dtype=F64)
    start = {**fitted, "theta": theta, "gamma": torch.full((1,), 0.0, dtype=F64)}
    gammas = []
    for sd in (None, 0.05):
        shifted = fit_joint(model, sim.cohort, "direct", start, ("gamma",), gamma_prior_sd=sd)
        alone = fit_direct(model, sim.cohort, start, ("gamma",), gamma_prior_sd=sd)
        torch.testing.assert_close(shifted["gamma"], alone["gamma"])
        gammas.append(float(shifted["gamma"]))
    assert gammas[0] > 0.2 and 0 < gammas[1] < 0.5 * gammas[0]  # the prior shrinks it
    # MCEM receives the start, the free blocks and the prior too
    via = fit_joint(model, sim.cohort, "mcem", start, ("gamma",), schedule, 4, 0.05)
    direct = fit_mcem(model, sim.cohort, start, ("gamma",), schedule, 4, gamma_prior_sd=0.05)
    torch.testing.assert_close(via["gamma"], direct.blocks["gamma"])
    torch.testing.assert_close(via["theta"], theta)
    assert 0 < float(via["gamma"]) < 0.5 * gammas[0]
    torch.testing.assert_close(fit_joint(model, sim.cohort)["theta"], fitted["theta"])  # direct
    with pytest.raises(ValueError, match="fitting method"):
        fit_joint(model, sim.cohort, "newton")


def test_transfer_by_mcem_passes_its_schedule_seeds_and_prior_to_both_stages(monkeypatch):
    """Stage 1 fits (theta, phi) with the run's schedule and seed; stage 2 fits gamma alone from
    the source estimate with gamma = 0, the same schedule, seed + 1 (its own Monte Carlo draws)
    and the N(0, s^2) prior of Eq. (T1)."""
    import survival_delay.transfer as transfer_module

    calls = []

    def recording_fit_joint(model, cohort, method, start=None, free=("theta", "phi"),
                            schedule=None, seed=0, gamma_prior_sd=None):  # fmt: skip
        calls.append(dict(method=method, start=start, free=free, schedule=schedule, seed=seed,
                          prior=gamma_prior_sd, n=len(cohort)))  # fmt: skip
        theta = torch.tensor([0.1, 0.2, 0.3], dtype=F64)
        phi = torch.tensor([0.4, 0.5], dtype=F64)
        gamma = torch.full((1,), 0.25 if free == ("gamma",) else 0.0, dtype=F64)
        return {"theta": theta, "phi": phi, "gamma": gamma}

    monkeypatch.setattr(transfer_module, "fit_joint", recording_fit_joint)
    source, target = simulate_study(1, Truth(gamma=0.5), n_source=60, n_target=30)
    schedule = MCEMSchedule(max_draws=50, max_iter=3)
    fit = transfer(JointModel.build(1), source.cohort, target.cohort, 1.0, "mcem",
                   schedule=schedule, seed=11, gamma_prior_sd=0.7)  # fmt: skip
    first, second = calls
    assert first == dict(method="mcem", start=None, free=("theta", "phi"), schedule=schedule,
                         seed=11, prior=None, n=60)  # fmt: skip
    assert second["free"] == ("gamma",) and second["schedule"] is schedule
    assert second["seed"] == 12 and second["prior"] == 0.7 and second["n"] == 30
    assert float(second["start"]["gamma"]) == 0.0
    torch.testing.assert_close(second["start"]["theta"], fit.source["theta"])
    assert float(fit.target["gamma"]) == 0.25


def test_transfer_estimates_the_shift_and_the_ibnr_count():
    truth = Truth(gamma=0.5)
    source, target = simulate_study(7, truth, n_source=3000, n_target=3000, target_window=0.5)
    model = JointModel.build(1)
    fit = transfer(model, source.cohort, target.cohort, 1.0)
    assert float(fit.target["gamma"]) == pytest.approx(0.5, abs=0.2)
    assert fit.mean_risk == pytest.approx(float(target.true_risk.mean()), abs=0.05)
    assert fit.ibnr == pytest.approx(target.ibnr, rel=0.3)


def test_bad_cohort_is_rejected():
    cohort = _one_subject(0.3, 0.5)
    with pytest.raises(ValueError, match="exposure"):
        cohort.check()


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"window": torch.tensor([1.0, 1.0], dtype=F64)}, r"Cohort\.window must have shape \[1\]"),
        ({"delay": torch.zeros(2, dtype=F64)}, r"Cohort\.delay must have shape \[1\]"),
        ({"event_width": torch.tensor([-1.0], dtype=F64)}, r"event_width must have shape .* >= 0"),
        ({"delay_width": torch.zeros(3, dtype=F64)}, r"delay_width must have shape \[1\]"),
        ({"exposure": torch.tensor([-0.1], dtype=F64)}, r"^need 0 <= exposure \(c'\) <= window"),
        ({"event_time": torch.tensor([-0.1], dtype=F64)}, "^reported subjects need non-negative"),
        ({"delay": torch.tensor([-0.1], dtype=F64)}, "^reported subjects need non-negative"),
        ({"delay": torch.tensor([math.nan], dtype=F64)}, "^reported subjects need non-negative"),
        ({"event_time": torch.tensor([0.6], dtype=F64)}, "^a reported event lies outside"),
        ({"delay": torch.tensor([0.9], dtype=F64)}, "report after tau$"),
    ],
)
def test_each_inconsistency_in_a_cohort_is_named(edit, message):
    """A reported subject (T = 0.2, D = 0.3, c' = 0.5, c = 1) made inconsistent one way at a
    time: every rule of ``Cohort.check`` fires with its own message, and the clean one passes."""
    reported = Cohort(
        torch.tensor([[0.3]], dtype=F64),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([0.5], dtype=F64),
        torch.tensor([True]),
        torch.tensor([0.2], dtype=F64),
        torch.tensor([0.3], dtype=F64),
    )
    assert reported.check() is reported
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(reported, **edit).check()


def test_a_cohort_on_its_boundaries_is_consistent():
    """Exact times (width 0), an event on the exposure end, a report exactly at tau, and an
    unreported subject with no exposure (c' = 0) are all legal."""
    one = torch.ones(1, dtype=F64)
    zero = torch.zeros(1, dtype=F64)
    nan = torch.full((1,), math.nan, dtype=F64)
    on_the_edges = Cohort(
        torch.zeros(1, 1, dtype=F64), one, 0.5 * one, torch.tensor([True]), 0.5 * one, 0.5 * one,
        zero, zero,
    )  # fmt: skip
    on_the_edges.check()
    Cohort(torch.zeros(1, 1, dtype=F64), one, zero, torch.tensor([False]), nan, nan).check()


def test_a_subject_without_exposure_has_no_unreported_mass_and_a_finite_gradient():
    """c' = 0: I = 0 exactly (log I = -inf), S_T(0) = 1, and the log-likelihood's gradient
    stays finite (the placeholder keeps log(1 - S) away from log 0)."""
    cohort = Cohort(
        torch.zeros(2, 1, dtype=F64),
        torch.tensor([1.0, 1.0], dtype=F64),
        torch.tensor([0.0, 0.6], dtype=F64),
        torch.zeros(2, dtype=torch.bool),
        torch.full((2,), math.nan, dtype=F64),
        torch.full((2,), math.nan, dtype=F64),
    )
    model = JointModel.build(1)
    theta = Truth().theta().requires_grad_()
    log_s, log_i = model.log_unreported_terms(theta, Truth().phi(), 0.0, cohort)
    assert float(log_i[0]) == -math.inf and float(log_s[0]) == 0.0 and math.isfinite(log_i[1])
    (grad,) = torch.autograd.grad(model.loglik(theta, Truth().phi(), cohort), theta)
    assert bool(torch.isfinite(grad).all())


def test_the_skip_bound_uses_the_smallest_lag_so_a_light_delay_tail_keeps_its_quadrature(
    monkeypatch,
):
    """Eq. (M2b) bounds I with S_D at the smallest lag c - c'. With a light-tailed delay
    (S_D(d) = exp(-(d / 0.2)^3)) a subject whose window ends 0.1 after its exposure has I
    comparable to S_T(c'), while S_D at a larger lag (1: e^-125; c + c' = 4.1: far less) would
    call it negligible; each subject's log I must equal the full quadrature's."""
    import survival_delay.core as core

    exposure = torch.tensor([2.0, 2.0, 1.0], dtype=F64)
    cohort = Cohort(
        torch.zeros(3, 1, dtype=F64),
        exposure + torch.tensor([0.1, 0.15, 60.0], dtype=F64),
        exposure,
        torch.zeros(3, dtype=torch.bool),
        torch.full((3,), math.nan, dtype=F64),
        torch.full((3,), math.nan, dtype=F64),
    )
    model = JointModel.build(1)
    theta = torch.tensor([0.0, 0.0, 0.0], dtype=F64)  # exponential events, rate 1
    phi = torch.tensor([math.log(0.2), math.log(3.0)], dtype=F64)  # Weibull delay, 0.2, rho 3
    log_s, log_i = model.log_unreported_terms(theta, phi, 0.0, cohort)
    monkeypatch.setattr(core, "NEGLIGIBLE", 1e9)  # quadrature for everyone
    full_s, full_i = model.log_unreported_terms(theta, phi, 0.0, cohort)
    assert bool((full_i[:2] > full_s[:2] - 4).all())  # I is a few % of S_T or more there
    torch.testing.assert_close(log_i[:2], full_i[:2], rtol=1e-12, atol=0)
    assert full_i[2] < full_s[2] - 40 and log_i[2] >= full_i[2]  # skipped: the bound stands in
    torch.testing.assert_close(torch.logaddexp(log_s, log_i), torch.logaddexp(full_s, full_i))


def test_the_cross_covariance_of_eq_t4_is_the_refit_sensitivity_times_the_source_covariance():
    """Cov(gamma_hat, eta_S) = (d gamma_hat / d eta) V_S by the implicit function theorem; the
    sensitivity is measured by refitting Eq. (T1) at source parameters moved by +-h."""
    model, source, target, fit, source_cov, cov = _transfer_with_covariance(800, 400)
    eta = flatten_blocks(fit.source, ("theta", "phi"))
    h = 1e-4
    sensitivity = []
    for j in range(len(eta)):
        moved = []
        for sign in (1.0, -1.0):
            vector = eta.clone()
            vector[j] += sign * h
            blocks = unflatten_blocks(vector, fit.source, ("theta", "phi"))
            refit = transfer(model, source.cohort, target.cohort, 1.0, source_blocks=blocks)
            moved.append(float(refit.target["gamma"]))
        sensitivity.append((moved[0] - moved[1]) / (2 * h))
    expected = torch.tensor(sensitivity, dtype=F64) @ source_cov
    assert expected.abs().max() > 1e-3  # the source's uncertainty does reach gamma here
    torch.testing.assert_close(cov[-1, :-1], expected, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(cov[:-1, -1], expected, rtol=1e-3, atol=1e-6)


def _reported_subject(t, d, width, x=0.3):
    return Cohort(
        torch.tensor([[x]], dtype=F64),
        torch.tensor([5.0], dtype=F64),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([True]),
        torch.tensor([t], dtype=F64),
        torch.tensor([d], dtype=F64),
        torch.tensor([width], dtype=F64),
        torch.tensor([width], dtype=F64),
    )


@pytest.mark.parametrize("delay_family", ["weibull", "lognormal"])
@pytest.mark.parametrize(("t", "d"), [(0.0, 0.0), (0.0, 0.2), (0.4, 0.0), (0.4, 0.2)])
def test_interval_censored_likelihood_matches_numerical_integration(delay_family, t, d):
    """Day-resolution times (Eq. H6): the reported subject's term of Eq. (M1) is the
    probability that the event falls in its day [t, t + w) and the report in its day
    [t + d, t + d + w): a double integral of f_T(s) f_D(v) over that region, finite at T = 0
    and D = 0 (ties with enrolment and same-day reports). The separable product
    P(T in day) P(D in [d, d + w)) is a different number (the old, biased likelihood)."""
    model = JointModel.build(1, delay_family=delay_family)
    theta = torch.tensor([math.log(2.0), math.log(1.4), 0.5], dtype=F64)
    phi = torch.tensor([math.log(0.05), math.log(0.9)], dtype=F64)
    width = 1 / 365.25
    cohort = _reported_subject(t, d, width)
    ll = model.loglik(theta, phi, cohort).item()

    def density(component, params):
        def f(v):
            tv = torch.tensor([v], dtype=F64)
            x = cohort.x if component.n_coef else torch.zeros(1, 0, dtype=F64)
            return component.log_density(params, tv, x).exp().item()

        return f

    f_t, f_d = density(model.event, theta), density(model.delay, phi)

    def cdf_d(v):  # F_D, closed form (tested against scipy above); 0 below 0
        no_x = torch.zeros(1, 0, dtype=F64)
        return model.delay.cdf(phi, torch.tensor([max(v, 0.0)], dtype=F64), no_x).item()

    joint = integrate.quad(
        lambda s: f_t(s) * (cdf_d(t + d + width - s) - cdf_d(t + d - s)),
        t,
        t + width,
        epsabs=0,
        epsrel=1e-10,
    )[0]
    assert math.isfinite(ll)
    # 32 Gauss-Legendre nodes against adaptive quadrature: f_T ~ s^0.4 at T = 0 and
    # F_D ~ v^0.9 at D = 0 are not smooth at the day's edge, so agreement is ~1e-6, not 1e-12
    assert ll == pytest.approx(math.log(joint), abs=1e-4)
    p_t = integrate.quad(f_t, t, t + width, epsabs=0, epsrel=1e-10)[0]
    p_d = integrate.quad(f_d, d, d + width, epsabs=0, epsrel=1e-10)[0]
    assert abs(ll - math.log(p_t * p_d)) > 1e-3


def test_interval_rows_of_the_m_step_give_the_interval_likelihood():
    """The M-step's weighted rows (Eq. H4 with widths) reproduce Eq. (H5) for reported rows."""
    comp = PHComponent(make_family("lognormal"), 0)
    params = torch.tensor([math.log(0.05), math.log(0.9)], dtype=F64)
    t = torch.tensor([0.0, 0.01, 0.2], dtype=F64)
    width = torch.full((3,), 1 / 365.25, dtype=F64)
    x = torch.zeros(3, 0, dtype=F64)
    rows = comp.weighted_loglik(
        params, t, torch.ones(3, dtype=F64), torch.ones(3, dtype=F64), x, 0.0, width
    )
    direct = comp.log_interval_prob(params, t, width, x).sum()
    assert rows.item() == pytest.approx(direct.item(), rel=1e-12)


def test_chunked_e_step_keeps_every_row_and_one_chunk_is_the_unchunked_sampler():
    sim = simulate_cohort(500, (0.0, 1.5), Truth(), 0.0, np.random.default_rng(8))
    model = JointModel.build(1)
    blocks = {"theta": Truth().theta(), "phi": Truth().phi(), "gamma": torch.zeros(1, dtype=F64)}
    whole = e_step_rows(model, blocks, sim.cohort, 30, torch.Generator().manual_seed(1), 10_000)
    z, t = sample_posterior(
        model, blocks["theta"], blocks["phi"], sim.cohort, 30, torch.Generator().manual_seed(1)
    )
    reference = MonteCarloRows.build(sim.cohort, z, t)
    # one chunk of all 500 subjects is the same call on the same shapes: bit for bit
    assert torch.equal(whole.event_time, reference.event_time)
    chunked = e_step_rows(model, blocks, sim.cohort, 30, torch.Generator().manual_seed(1), 64)
    n, n_rep = len(sim.cohort), int(sim.cohort.reported.sum())
    # one row per subject (reported exact / unreported censored) plus the imputed events
    assert (chunked.event_flag == 0).sum() == n - n_rep
    assert chunked.event_weight[chunked.event_flag == 0].sum().item() == pytest.approx(
        reference.event_weight[reference.event_flag == 0].sum().item(), rel=0.05
    )


def test_sandwich_variance_matches_the_bootstrap():
    """Eq. (V) against the nonparametric bootstrap on a simulated cohort (40 resamples: the
    bootstrap SE itself is uncertain by about 11%, hence the 30% band)."""
    truth = Truth()
    model = JointModel.build(1)
    sim = simulate_cohort(1500, (0.0, 3.0), truth, 0.0, np.random.default_rng(1))
    fit = fit_direct(model, sim.cohort)
    cov = sandwich_covariance(model, sim.cohort, fit)
    generator = torch.Generator().manual_seed(0)
    draws, risks = [], []
    risk = lambda b: model.timely_risk(b["theta"], sim.cohort.x, 1.0).mean()  # noqa: E731
    for _ in range(40):
        index = torch.randint(1500, (1500,), generator=generator)
        b = fit_direct(model, sim.cohort.subset(index), fit)
        draws.append(torch.cat([b["theta"], b["phi"]]))
        risks.append(risk(b).item())
    boot = torch.stack(draws).std(0)
    np.testing.assert_allclose(cov.diag().sqrt().numpy(), boot.numpy(), rtol=0.3)
    assert delta_method_se(risk, fit, cov) == pytest.approx(np.std(risks, ddof=1), rel=0.3)
    # the sandwich is not the naive inverse information under a wrong lag: it is symmetric PD
    assert torch.allclose(cov, cov.T) and bool((torch.linalg.eigvalsh(cov) > 0).all())


def test_misspecified_event_law_sandwich_matches_bootstrap_inverse_information_does_not():
    """Eq. (V) where it matters: events from an unobserved two-group mixture of exponentials
    (30% with a 80x shorter scale), fitted as one Weibull. The Weibull shape is then
    misspecified and its inverse-information SE is about 1.6x the bootstrap's, while the sandwich
    stays within the bootstrap's own ~11% noise (40 resamples: 25% band)."""
    from survival_delay.simulate import observe

    rng = np.random.default_rng(0)
    n = 1500
    x = rng.binomial(1, 0.5, n).astype(float)
    scale = np.where(rng.binomial(1, 0.3, n) > 0, 0.1, 8.0)
    t = scale * rng.exponential(size=n) * np.exp(-0.5 * x)
    window = rng.uniform(0.5, 3.0, n)
    cohort = observe(x[:, None], t, 0.15 * rng.weibull(1.0, n), window, np.minimum(window, 1.0))
    model = JointModel.build(1)
    fit = fit_direct(model, cohort)
    free = ("theta", "phi")
    sandwich_se = sandwich_covariance(model, cohort, fit, free).diag().sqrt()

    def loglik(vector):
        b = unflatten_blocks(vector, fit, free)
        return model.loglik(b["theta"], b["phi"], cohort)

    hessian = torch.autograd.functional.hessian(loglik, flatten_blocks(fit, free))
    inverse_information_se = torch.linalg.inv(-hessian).diag().sqrt()
    generator = torch.Generator().manual_seed(0)
    draws = []
    for _ in range(40):
        index = torch.randint(n, (n,), generator=generator)
        b = fit_direct(model, cohort.subset(index), fit)
        draws.append(torch.cat([b["theta"], b["phi"]]))
    bootstrap_se = torch.stack(draws).std(0)
    log_rho = 1  # theta = (log alpha, log rho, beta), then phi
    assert sandwich_se[log_rho].item() == pytest.approx(bootstrap_se[log_rho].item(), rel=0.25)
    assert inverse_information_se[log_rho] > 1.4 * bootstrap_se[log_rho]
    assert sandwich_se[log_rho] < 0.75 * inverse_information_se[log_rho]
    np.testing.assert_allclose(sandwich_se.numpy(), bootstrap_se.numpy(), rtol=0.3)


def _transfer_with_covariance(n_source: int, n_target: int):
    """A transfer fit (gamma = 0.5, target window 0.5) with its source sandwich and Eq. (T4)."""
    source, target = simulate_study(
        3, Truth(gamma=0.5), n_source=n_source, n_target=n_target, target_window=0.5
    )
    model = JointModel.build(1)
    fit = transfer(model, source.cohort, target.cohort, 1.0)
    source_cov = sandwich_covariance(model, source.cohort, fit.source)
    cov = two_step_covariance(model, target.cohort, fit.target, source_cov)
    return model, source, target, fit, source_cov, cov


def test_two_step_variance_of_the_transfer_matches_a_two_stage_bootstrap():
    """Eq. (T4) against a bootstrap that resamples the source and the target and refits both
    stages (40 resamples, the 30% band of the test above). The source's uncertainty must count:
    here it carries about a quarter of Var(gamma_hat) (0.039 with it, 0.029 without)."""
    model, source, target, fit, source_cov, cov = _transfer_with_covariance(1200, 600)
    free = ("theta", "phi", "gamma")
    risk = lambda b: model.timely_risk(b["theta"], target.cohort.x, 1.0, b["gamma"]).mean()  # noqa: E731
    generator = torch.Generator().manual_seed(0)
    gammas, risks = [], []
    for _ in range(40):
        s_index = torch.randint(len(source.cohort), (len(source.cohort),), generator=generator)
        t_index = torch.randint(len(target.cohort), (len(target.cohort),), generator=generator)
        s_blocks = fit_direct(model, source.cohort.subset(s_index), fit.source)
        boot = transfer(
            model, source.cohort, target.cohort.subset(t_index), 1.0, source_blocks=s_blocks
        )
        gammas.append(float(boot.target["gamma"]))
        risks.append(float(risk(boot.target)))
    assert math.sqrt(cov[-1, -1]) == pytest.approx(np.std(gammas, ddof=1), rel=0.3)
    assert delta_method_se(risk, fit.target, cov, free) == pytest.approx(
        np.std(risks, ddof=1), rel=0.3
    )
    target_only = two_step_covariance(model, target.cohort, fit.target, 0 * source_cov)
    assert cov[-1, -1] > 1.2 * target_only[-1, -1]
    # the target-only part by hand: sum of squared gamma scores over the squared curvature of
    # Eq. (T1), the N(0, 1) prior's -1 included
    gamma = fit.target["gamma"].clone().requires_grad_()
    per_subject = model.loglik(
        fit.target["theta"], fit.target["phi"], target.cohort, gamma, per_subject=True
    )
    scores = torch.stack([torch.autograd.grad(v, gamma, retain_graph=True)[0] for v in per_subject])
    (grad,) = torch.autograd.grad(per_subject.sum(), gamma, create_graph=True)
    (curvature,) = torch.autograd.grad(grad.sum(), gamma)
    expected = scores.square().sum() / (curvature - 1.0).square()
    torch.testing.assert_close(target_only[-1, -1], expected.squeeze())
    assert torch.allclose(cov, cov.T) and bool((torch.linalg.eigvalsh(cov) > 0).all())


def test_negligible_unreported_mass_bound_leaves_the_likelihood_unchanged(monkeypatch):
    """Eq. (M2b): subjects whose window runs far past the exposure end skip the quadrature;
    the log-likelihood and its gradient equal the full quadrature's (delay-free-like data)."""
    import survival_delay.core as core

    rng = np.random.default_rng(9)
    n = 400
    exposure = rng.uniform(0.2, 2.0, n)
    window = exposure + np.where(rng.random(n) < 0.5, 50.0, rng.uniform(0, 0.3, n))
    cohort = Cohort(
        torch.tensor(rng.standard_normal((n, 1))),
        torch.tensor(window),
        torch.tensor(exposure),
        torch.zeros(n, dtype=torch.bool),
        torch.full((n,), math.nan, dtype=F64),
        torch.full((n,), math.nan, dtype=F64),
    )
    model = JointModel.build(1)
    theta = Truth().theta().requires_grad_()
    phi = Truth().phi()

    def value_and_grad():
        ll = model.loglik(theta, phi, cohort)
        (grad,) = torch.autograd.grad(ll, theta)
        return ll.item(), grad

    fast = value_and_grad()
    monkeypatch.setattr(core, "NEGLIGIBLE", 1e9)  # quadrature for everyone
    full = value_and_grad()
    assert fast[0] == pytest.approx(full[0], rel=1e-14)
    assert torch.allclose(fast[1], full[1], rtol=1e-12)


def test_build_honours_cuts_delay_covariates_and_quadrature_nodes():
    model = JointModel.build(2, "piecewise", cuts=(0.5, 2.0), delay_covariates=True, quad_nodes=8)
    assert model.event.family.cuts == (0.5, 2.0) and model.event.n_params == 3 + 2
    assert model.delay.n_coef == 2 and model.delay.n_params == 2 + 2
    assert model.quad_nodes == 8 and model.quadrature(torch.ones(1, dtype=F64))[0].shape == (1, 8)
    assert JointModel.build(2).delay.n_coef == 0


def test_timely_risk_and_the_time_grid_stay_in_float64_for_any_feature_count():
    """Eq. (R1) at a horizon float32 cannot hold (0.1), three subjects with two features, against
    the Weibull closed form; Eq. (E2)'s grid midpoints exactly (k + 1/2) / G of c'."""
    model = JointModel.build(2)
    theta = torch.tensor([math.log(2.0), math.log(1.5), 0.4, -0.3], dtype=F64)
    x = torch.tensor([[0.0, 0.0], [1.0, 0.5], [-1.0, 2.0]], dtype=F64)
    risk = model.timely_risk(theta, x, 0.1, gamma=0.2)
    expected = 1 - torch.exp(-torch.exp(0.2 + x @ theta[2:]) * (0.1 / 2.0) ** 1.5)
    assert risk.dtype == F64 and risk.shape == (3,)
    torch.testing.assert_close(risk, expected, rtol=1e-13, atol=0)
    cohort = _one_subject(1.3, 0.7)
    mids, probs = JointModel.build(1).posterior_time_grid(
        Truth().theta(), Truth().phi(), cohort, cells=10
    )
    hand = 0.7 * (torch.arange(10, dtype=F64) + 0.5) / 10
    torch.testing.assert_close(mids[0], hand, rtol=1e-15, atol=0)
    assert probs.shape == (1, 10) and float(probs.sum()) == pytest.approx(1.0, abs=1e-12)


def test_posterior_draws_on_a_coarse_grid_stay_inside_the_exposure():
    """The E-step sampler with G = 16 cells: the cell index is scaled by the same G, so every
    drawn event time lies in [0, c'] and the cells are all reachable."""
    cohort = _one_subject(1.25, 1.2)
    model = JointModel.build(1)
    z, t = sample_posterior(
        model, Truth().theta(), Truth().phi(), cohort, 4000, torch.Generator().manual_seed(0),
        cells=16,
    )  # fmt: skip
    drawn = t[z]
    assert drawn.numel() > 100 and float(drawn.min()) >= 0 and float(drawn.max()) <= 1.2
    assert float(drawn.max()) > 1.2 * 15 / 16  # the last cell is reached


def test_a_usable_estimator_that_cannot_compute_falls_back_to_source_only(monkeypatch):
    """target-only's joint fit can diverge on the few reports of a short window (NaN
    parameters); the rival then reports the source-only estimate and says so, rather than a NaN
    that would leave the claim's paired comparison without an estimate."""
    from survival_delay import baselines
    from survival_delay.experiments import estimate_all, source_fits

    source, target = simulate_study(5, Truth(), n_source=600, n_target=200, target_window=0.5)
    model = JointModel.build(1)
    fits = source_fits(model, source.cohort, mcem=False)
    subjects = ("target_only", "source_only", "ipw")
    fine = estimate_all(model, source.cohort, target.cohort, 1.0, fits, subjects=subjects)
    assert "target_only_fell_back" not in fine and math.isfinite(fine["target_only"])

    def diverged(model, cohort):
        nan = torch.full((3,), math.nan, dtype=F64)
        return {"theta": nan, "phi": nan[:2], "gamma": torch.zeros(1, dtype=F64)}

    monkeypatch.setattr(baselines, "target_only", diverged)
    out = estimate_all(model, source.cohort, target.cohort, 1.0, fits, subjects=subjects)
    assert out["target_only"] == out["source_only"] == fine["source_only"]
    assert out["target_only_fell_back"] == 1.0 and out["ipw"] == fine["ipw"]


def _day_cohort(delay_width: bool) -> Cohort:
    """Two covariates; subjects: 0 an event known to its day reported the same day, 1 the same
    reported 3 days later (0.5 day later when the report time is exact), 2 an exact event
    reported 2 days later, 3 unreported."""
    day = 1 / 365.25
    d1 = 3 * day if delay_width else 0.5 * day
    return Cohort(
        torch.tensor([[0.3, -1.0], [1.2, 0.4], [-0.5, 0.0], [0.0, 1.0]], dtype=F64),
        torch.tensor([2.0, 2.0, 2.0, 0.6], dtype=F64),
        torch.tensor([1.0, 1.0, 1.0, 0.6], dtype=F64),
        torch.tensor([True, True, True, False]),
        torch.tensor([0.2, 0.0, 0.35, math.nan], dtype=F64),
        torch.tensor([0.0, d1, 2 * day, math.nan], dtype=F64),
        torch.tensor([day, day, 0.0, 0.0], dtype=F64),
        torch.tensor([day, day, day, 0.0], dtype=F64) if delay_width else None,
    ).check()


@pytest.mark.parametrize("delay_width", [True, False])
def test_the_time_of_day_e_step_rows_by_value(delay_width):
    """Eq. (E3) rows of MonteCarloRows.build, by hand: an event known to its day becomes one
    event row per Gauss-Legendre node u_k, exact at T + u_k, and one delay row, on
    [(D - u_k)^+, D + w - u_k) when the report is known to the day (exact at D - u_k
    otherwise, nodes with D - u_k <= 0 dropped), each weighted by u's posterior
    p_k ~ w_k f_T(T + u_k) P_D(row). The exact event keeps its single rows, with its width."""
    model = JointModel.build(2)
    theta = torch.tensor([math.log(2.0), math.log(1.3), 0.4, -0.3], dtype=F64)
    phi = torch.tensor([math.log(0.01), math.log(0.8)], dtype=F64)
    gamma = torch.tensor([0.6], dtype=F64)
    cohort = _day_cohort(delay_width)
    day = model.day_posterior(theta, phi, cohort, gamma)
    assert day[0].tolist() == [0, 1]
    z = torch.zeros(4, 3, dtype=torch.bool)
    rows = MonteCarloRows.build(cohort, z, torch.zeros(4, 3, dtype=F64), day)

    width = 1 / 365.25
    nodes, weights = np.polynomial.legendre.leggauss(model.quad_nodes)
    u = torch.as_tensor(width / 2 * (nodes + 1))
    expected_t, expected_w, expected_d, expected_dw, expected_x = [], [], [], [], []
    for i in (0, 1):
        x = cohort.x[i : i + 1].expand(len(u), -1)
        t, d = cohort.event_time[i].item(), cohort.delay[i].item()
        f_t = model.event.log_density(theta, t + u, x, gamma).exp()
        no_x = torch.zeros(len(u), 0, dtype=F64)
        if delay_width:
            lower, upper = (d - u).clamp_min(0), d + width - u
            p_d = model.delay.cdf(phi, upper, no_x) - model.delay.cdf(phi, lower, no_x)
            row_d, row_w = lower, upper - lower
        else:
            lag = d - u
            p_d = torch.where(
                lag > 0, model.delay.log_density(phi, lag.clamp_min(1e-12), no_x).exp(), 0.0
            )
            row_d, row_w = lag, torch.zeros_like(lag)
        p = torch.as_tensor(weights) * f_t * p_d
        keep = p > 0
        expected_t.append((t + u)[keep])
        expected_w.append((p / p.sum())[keep])
        expected_d.append(row_d[keep])
        expected_dw.append(row_w[keep])
        expected_x.append(x[keep])
    if not delay_width:
        assert 0 < len(expected_t[1]) < len(u)  # a report half a day on: later nodes ruled out
    n_day = sum(len(e) for e in expected_t)
    # event rows: the exact event, the day nodes, then the unreported subject censored at c'
    torch.testing.assert_close(rows.event_time[0], cohort.event_time[2])
    torch.testing.assert_close(rows.event_time[1 : 1 + n_day], torch.cat(expected_t))
    torch.testing.assert_close(rows.event_weight[1 : 1 + n_day], torch.cat(expected_w))
    torch.testing.assert_close(rows.event_x[1 : 1 + n_day], torch.cat(expected_x))
    assert rows.event_time[1 + n_day].item() == 0.6 and rows.event_flag[1 + n_day] == 0
    assert rows.event_width is None  # every event row is exact
    # delay rows: the exact event's delay with its day width, then the day nodes
    torch.testing.assert_close(rows.delay_time[1 : 1 + n_day], torch.cat(expected_d))
    torch.testing.assert_close(rows.delay_weight[1 : 1 + n_day], torch.cat(expected_w))
    torch.testing.assert_close(rows.delay_x[1 : 1 + n_day], torch.cat(expected_x))
    assert len(rows.delay_time) == 1 + n_day
    if delay_width:
        assert rows.delay_width[0].item() == pytest.approx(width)
        torch.testing.assert_close(rows.delay_width[1:], torch.cat(expected_dw))
    else:
        assert rows.delay_width is None or bool((rows.delay_width == 0).all())


def test_a_report_known_to_the_day_keeps_its_width_when_the_event_time_is_exact():
    """Only the report is known to the day (no event widths): the delay rows keep their width."""
    cohort = dataclasses.replace(_day_cohort(True), event_width=None)
    z = torch.zeros(4, 2, dtype=torch.bool)
    rows = MonteCarloRows.build(cohort, z, torch.zeros(4, 2, dtype=F64))
    torch.testing.assert_close(rows.delay_width, cohort.delay_width[:3])


def test_the_e_step_passes_the_cohort_shift_to_both_posteriors():
    """e_step_rows under gamma != 0 is the sampler and the time-of-day posterior under that
    gamma (one chunk: bit for bit), not under gamma = 0."""
    model = JointModel.build(2)
    cohort = _day_cohort(True)
    blocks = {
        "theta": torch.tensor([math.log(2.0), math.log(1.3), 0.4, -0.3], dtype=F64),
        "phi": torch.tensor([math.log(0.01), math.log(0.8)], dtype=F64),
        "gamma": torch.tensor([0.9], dtype=F64),
    }
    rows = e_step_rows(model, blocks, cohort, 50, torch.Generator().manual_seed(3))
    args = (model, blocks["theta"], blocks["phi"], cohort, 50, torch.Generator().manual_seed(3))
    z, t = sample_posterior(*args, blocks["gamma"])
    day = model.day_posterior(blocks["theta"], blocks["phi"], cohort, blocks["gamma"])
    reference = MonteCarloRows.build(cohort, z, t, day)
    assert torch.equal(rows.event_weight, reference.event_weight)
    assert torch.equal(rows.event_time, reference.event_time)
    z0, t0 = sample_posterior(*args)
    day0 = model.day_posterior(blocks["theta"], blocks["phi"], cohort)
    at_zero = MonteCarloRows.build(cohort, z0, t0, day0)
    assert not torch.equal(rows.event_weight[:40], at_zero.event_weight[:40])
