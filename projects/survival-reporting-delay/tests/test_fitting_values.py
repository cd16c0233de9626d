"""Value tests of the fitting machinery the default training path runs: the warm start against
lifelines' interval-censored fits, the M-step rows of Monte Carlo draws by hand, and fit_mcem's
schedule, stopping rule, averaging and trace with a scripted EM step. Written to close the
mutation lane's survivors in these functions (README, "Mutation lane")."""

import math

import numpy as np
import pytest
import torch
from lifelines import WeibullFitter

from survival_delay import fitting
from survival_delay.core import Cohort, JointModel, sample_posterior
from survival_delay.fitting import MCEMSchedule, MonteCarloRows, fit_mcem, warm_start

F64 = torch.float64


def _interval_cohort(seed: int = 0, n: int = 2000) -> Cohort:
    """No covariates; events Weibull(1.0, 1.4), delays Weibull(0.5, 1.2); exposure 1.5, window
    2.5. Reported events are known to a 0.25-wide interval (a fifth of them exactly), reported
    delays to a 0.5-wide one (a fifth exactly): widths large enough that ignoring them moves
    the fit well beyond the comparison's tolerance."""
    rng = np.random.default_rng(seed)
    t_true = 1.0 * rng.weibull(1.4, n)
    d_true = 0.5 * rng.weibull(1.2, n)
    exposure, window = 1.5, 2.5
    reported = (t_true < exposure) & (t_true + d_true < window)
    event_width = np.where(rng.random(n) < 0.2, 0.0, 0.25)
    delay_width = np.where(rng.random(n) < 0.2, 0.0, 0.5)
    event_time = np.where(event_width > 0, np.floor(t_true / 0.25) * 0.25, t_true)
    delay = np.where(delay_width > 0, np.floor(d_true / 0.5) * 0.5, d_true)

    def col(values):
        return torch.tensor(np.where(reported, values, np.nan), dtype=F64)

    return Cohort(
        torch.zeros(n, 0, dtype=F64),
        torch.full((n,), window, dtype=F64),
        torch.full((n,), exposure, dtype=F64),
        torch.as_tensor(reported),
        col(event_time),
        col(delay),
        torch.tensor(np.where(reported, event_width, 0.0), dtype=F64),
        torch.tensor(np.where(reported, delay_width, 0.0), dtype=F64),
    ).check()


def test_warm_start_is_the_interval_censored_event_fit_and_the_reported_delay_fit():
    """warm_start's theta maximises the event-only likelihood (reported events interval-censored
    on [T, T + w), or exact where w = 0; the rest right-censored at c'), its phi the reported
    delays' likelihood on [D, D + w) with no shift: both equal lifelines' fits of the same
    data. Catches a warm start that is skipped, drops either width, or shifts the delay fit."""
    cohort = _interval_cohort()
    rep = cohort.reported.numpy()
    start = warm_start(JointModel.build(0), cohort)

    t = np.where(rep, cohort.event_time.numpy(), cohort.exposure.numpy())
    upper = np.where(rep, t + cohort.event_width.numpy(), np.inf)
    events = WeibullFitter().fit_interval_censoring(t, upper)
    assert math.exp(start["theta"][0]) == pytest.approx(events.lambda_, rel=1e-4)
    assert math.exp(start["theta"][1]) == pytest.approx(events.rho_, rel=1e-4)

    d = cohort.delay.numpy()[rep]
    delays = WeibullFitter().fit_interval_censoring(d, d + cohort.delay_width.numpy()[rep])
    assert math.exp(start["phi"][0]) == pytest.approx(delays.lambda_, rel=1e-4)
    assert math.exp(start["phi"][1]) == pytest.approx(delays.rho_, rel=1e-4)
    assert start["gamma"].tolist() == [0.0]

    # Without reports there is nothing to fit: the default start comes back unchanged.
    none = Cohort(
        cohort.x[:3], cohort.window[:3], cohort.exposure[:3], torch.zeros(3, dtype=torch.bool),
        torch.full((3,), math.nan, dtype=F64), torch.full((3,), math.nan, dtype=F64),
    )  # fmt: skip
    assert {k: v.tolist() for k, v in warm_start(JointModel.build(0), none).items()} == {
        k: v.tolist() for k, v in fitting.default_start(JointModel.build(0), none).items()
    }


def test_monte_carlo_rows_of_imputed_events_by_hand():
    """Eq. (Q)'s rows from draws, every field by value and in float64 exactly: reported events
    exact with weight 1; each unreported subject censored at c' with weight #{Z = 0}/M; each
    Z = 1 draw an exact event at T^(m) with weight 1/M, and a delay row censored at c - T^(m)
    (0 if negative) with weight 1/M. No widths in the cohort: no width columns in the rows."""
    cohort = Cohort(
        torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=F64),
        torch.tensor([2.0, 2.0, 1.0, 0.5], dtype=F64),
        torch.tensor([1.5, 1.5, 1.0, 0.5], dtype=F64),
        torch.tensor([True, False, False, True]),
        torch.tensor([0.4, math.nan, math.nan, 0.1], dtype=F64),
        torch.tensor([0.3, math.nan, math.nan, 0.2], dtype=F64),
    ).check()
    draws = 3
    z = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 0, 1], [1, 0, 0]], dtype=torch.bool)
    t = torch.tensor(
        [[9.0, 9.0, 9.0], [0.5, 9.0, 1.25], [9.0, 9.0, 0.75], [9.0, 9.0, 9.0]], dtype=F64
    )
    rows = MonteCarloRows.build(cohort, z, t)
    third = 1 / draws

    def exactly(actual, expected):
        torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), rtol=0, atol=0)

    # event rows: reported 0 and 3, unreported 1 and 2 censored at c', then the draws Z = 1
    exactly(rows.event_time, [0.4, 0.1, 1.5, 1.0, 0.5, 1.25, 0.75])
    exactly(rows.event_flag, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    exactly(rows.event_weight, [1.0, 1.0, 1 / 3, 2 / 3, third, third, third])
    exactly(rows.event_x, [[1.0], [4.0], [2.0], [3.0], [2.0], [2.0], [3.0]])
    # delay rows: the reported delays, then each draw censored at c - T^(m)
    exactly(rows.delay_time, [0.3, 0.2, 1.5, 0.75, 0.25])
    exactly(rows.delay_flag, [1.0, 1.0, 0.0, 0.0, 0.0])
    exactly(rows.delay_weight, [1.0, 1.0, third, third, third])
    exactly(rows.delay_x, [[1.0], [4.0], [2.0], [2.0], [3.0]])
    assert rows.event_width is None and rows.delay_width is None


def test_an_unreported_subject_without_exposure_draws_no_event():
    """c' = 0: no time at risk, so Z = 0 and T = 0 on every draw, beside a subject that can."""
    cohort = Cohort(
        torch.zeros(2, 0, dtype=F64),
        torch.tensor([1.0, 1.0], dtype=F64),
        torch.tensor([0.0, 1.0], dtype=F64),
        torch.tensor([False, False]),
        torch.full((2,), math.nan, dtype=F64),
        torch.full((2,), math.nan, dtype=F64),
    ).check()
    model = JointModel.build(0)
    theta = torch.tensor([0.0, 0.0], dtype=F64)
    phi = torch.tensor([math.log(2.0), 0.0], dtype=F64)
    z, t = sample_posterior(model, theta, phi, cohort, 400, torch.Generator().manual_seed(0))
    assert not z[0].any() and (t[0] == 0).all()
    assert z[1].any() and bool(((t[1] > 0) & (t[1] < 1)).all())


class _ScriptedStep:
    """Stands in for mcem_iteration: moves theta by the next scripted change (phi by a tenth of
    it) and records the arguments fit_mcem passes."""

    def __init__(self, changes):
        self.changes, self.calls = list(changes), []

    def __call__(self, model, cohort, blocks, free, draws, generator, m_step_iter, reduce, prior):
        self.calls.append((draws, m_step_iter, reduce, prior, generator.initial_seed()))
        step = self.changes[len(self.calls) - 1]
        return {
            "theta": blocks["theta"] + step,
            "phi": blocks["phi"] - step / 10,
            "gamma": blocks["gamma"],
        }


def _start():
    return {
        "theta": torch.zeros(2, dtype=F64),
        "phi": torch.zeros(2, dtype=F64),
        "gamma": torch.zeros(1, dtype=F64),
    }


def test_fit_mcem_grows_the_sample_stops_after_calm_steps_at_full_size_and_averages(monkeypatch):
    """M_k = min(max, ceil(start * growth^k)); an iteration is calm when its largest change is
    below tol (strictly) at the full sample size; `patience` calm iterations in a row stop the
    chain; the estimate is the mean of the last `average_last` iterates; every argument reaches
    the EM step; the trace records (iteration, draws, max change)."""
    schedule = MCEMSchedule(start_draws=2, max_draws=4, growth=2.0, max_iter=10, tol=0.125,
                            patience=2, average_last=2, m_step_iter=7)  # fmt: skip
    # draws 2, 4, 4, ...: k=0 small (not at full size), k=1 calm, k=2 change == tol (not calm),
    # k=3 calm, k=4 calm -> stop after five iterations. Binary fractions: the changes are exact.
    step = _ScriptedStep([1.0, 0.0625, 0.125, 0.0625, 0.03125, 0.5, 0.5])
    monkeypatch.setattr(fitting, "mcem_iteration", step)
    reduce = object()
    result = fit_mcem(JointModel.build(0), None, _start(), ("theta", "phi"), schedule, seed=5,
                      reduce=reduce, gamma_prior_sd=0.3)  # fmt: skip
    assert result.converged is True and result.iterations == 5
    assert [c[0] for c in step.calls] == [2, 4, 4, 4, 4]
    assert all(c[1:] == (7, reduce, 0.3, 5) for c in step.calls)
    assert [row["iteration"] for row in result.trace] == [0, 1, 2, 3, 4]
    assert [row["draws"] for row in result.trace] == [2, 4, 4, 4, 4]
    changes = [row["max_change"] for row in result.trace]
    assert changes == [1.0, 0.0625, 0.125, 0.0625, 0.03125]
    assert set(result.trace[0]) == {"iteration", "draws", "max_change"}
    # The mean of the last two iterates: theta 1.25 and 1.28125, phi a tenth of it, negated.
    torch.testing.assert_close(result.blocks["theta"], torch.full((2,), 1.265625, dtype=F64))
    torch.testing.assert_close(result.blocks["phi"], torch.full((2,), -0.1265625, dtype=F64))


def test_fit_mcem_counts_calm_iterations_from_the_first_and_reports_a_chain_that_never_settles(
    monkeypatch,
):
    """With the full sample size from the start, the first iteration can already be calm (the
    count starts at 0); a chain that never settles runs max_iter iterations and reports
    converged False; the default seed is 0 and the default schedule is MCEMSchedule()."""
    schedule = MCEMSchedule(start_draws=3, max_draws=3, max_iter=6, tol=0.1, patience=2,
                            average_last=1)  # fmt: skip
    step = _ScriptedStep([0.01, 0.5, 0.01, 0.01])
    monkeypatch.setattr(fitting, "mcem_iteration", step)
    result = fit_mcem(JointModel.build(0), None, _start(), schedule=schedule)
    assert (result.converged, result.iterations) == (True, 4)
    assert step.calls[0][4] == 0  # the default seed
    torch.testing.assert_close(result.blocks["theta"], torch.full((2,), 0.53, dtype=F64))

    restless = _ScriptedStep([0.5] * 6)
    monkeypatch.setattr(fitting, "mcem_iteration", restless)
    result = fit_mcem(JointModel.build(0), None, _start(), schedule=schedule)
    assert result.converged is False and result.iterations == 6 and len(result.trace) == 6

    default = _ScriptedStep([0.0] * 40)
    monkeypatch.setattr(fitting, "mcem_iteration", default)
    result = fit_mcem(JointModel.build(0), None, _start())
    reference = MCEMSchedule()
    expected = [reference.draws(k) for k in range(result.iterations)]
    assert [c[0] for c in default.calls] == expected and default.calls[0][1] == 50


def test_both_m_steps_are_all_reduced_across_processes():
    """Under DDP every process holds a shard: the event M-step (theta's gradient) and the delay
    M-step (phi's) must both pass their objective and gradient through ``reduce``."""
    from survival_delay.simulate import Truth, simulate_study

    source, _ = simulate_study(3, Truth(), n_source=300, n_target=50, target_window=0.5)
    model = JointModel.build(1)
    shapes: list[tuple] = []

    def reduce(value):
        shapes.append(tuple(value.shape))
        return value

    start = fitting.default_start(model, source.cohort)
    generator = torch.Generator().manual_seed(0)
    fitting.mcem_iteration(model, source.cohort, start, ("theta", "phi"), 8, generator, 5, reduce)
    assert (3,) in shapes and (2,) in shapes  # theta = 2 baseline + 1 coefficient; phi = 2


def test_the_time_grid_defaults_to_no_shift_and_256_cells():
    from survival_delay.simulate import Truth, simulate_study

    source, _ = simulate_study(4, Truth(), n_source=60, n_target=20, target_window=0.5)
    model = JointModel.build(1)
    theta = torch.tensor([0.0, 0.2, 0.3], dtype=F64)
    phi = torch.tensor([-2.0, 0.0], dtype=F64)
    t, probs = model.posterior_time_grid(theta, phi, source.cohort)
    t0, probs0 = model.posterior_time_grid(theta, phi, source.cohort, 0.0, 256)
    assert probs.shape == (len(source.cohort), 256)
    torch.testing.assert_close(probs, probs0, rtol=0, atol=0)
    torch.testing.assert_close(t, t0, rtol=0, atol=0)


def test_interval_and_weighted_likelihoods_carry_the_cohort_shift():
    """With a shift (offset) every term shifts: an interval row is log(S(t) - S(t + w)), an exact
    event log f(t), a censored row log S(t), all at the same offset (Eqs. H4, H5)."""
    from survival_delay.hazards import PHComponent, make_family

    component = PHComponent(make_family("weibull"), 1)
    params = torch.tensor([0.1, 0.3, -0.4], dtype=F64)
    x = torch.tensor([[0.5], [-1.0], [2.0], [0.0]], dtype=F64)
    t = torch.tensor([0.3, 0.8, 1.1, 0.0], dtype=F64)
    width = torch.tensor([0.25, 0.0, 0.5, 0.1], dtype=F64)
    event = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=F64)
    weight = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=F64)
    offset = 0.7

    def log_s(times):
        return component.log_survival(params, times, x, offset)

    interval = torch.log(log_s(t).exp() - log_s(t + width).exp())
    rows = width > 0  # log_interval_prob is defined for a width > 0
    torch.testing.assert_close(
        component.log_interval_prob(params, t, width, x, offset)[rows], interval[rows]
    )
    exact = component.log_density(params, t, x, offset)
    per_row = torch.where(event > 0, torch.where(width > 0, interval, exact), log_s(t))
    expected = (weight * per_row).sum()
    actual = component.weighted_loglik(params, t, event, weight, x, offset, width)
    torch.testing.assert_close(actual, expected)


def test_the_sandwich_is_evaluated_at_the_fitted_shift():
    """V = A^-1 B A^-1 of Eq. (V) at blocks whose gamma is not 0, against scores and Hessian
    taken here by reverse-mode autograd of the per-subject log-likelihood at that gamma."""
    from survival_delay.simulate import Truth, simulate_study

    source, _ = simulate_study(5, Truth(), n_source=80, n_target=20, target_window=0.5)
    model = JointModel.build(1)
    cohort = source.cohort
    blocks = fitting.fit_direct(model, cohort)
    blocks = {**blocks, "gamma": torch.tensor([0.4], dtype=F64)}
    sizes = (len(blocks["theta"]), len(blocks["phi"]))

    def per_subject(vector):
        theta, phi = vector.split(sizes)
        return model.loglik(theta, phi, cohort, blocks["gamma"], per_subject=True)

    flat = torch.cat([blocks["theta"], blocks["phi"]])
    scores = torch.autograd.functional.jacobian(per_subject, flat)
    hessian = torch.autograd.functional.hessian(lambda v: per_subject(v).sum(), flat)
    a_inv = torch.linalg.inv(-hessian)
    expected = a_inv @ scores.T @ scores @ a_inv
    torch.testing.assert_close(fitting.sandwich_covariance(model, cohort, blocks), expected)


def test_the_time_of_day_posterior_defaults_to_no_shift():
    cohort = _interval_cohort(n=200)
    model = JointModel.build(0)
    theta = torch.tensor([0.0, 0.3], dtype=F64)
    phi = torch.tensor([-1.0, 0.1], dtype=F64)
    default = model.day_posterior(theta, phi, cohort)
    explicit = model.day_posterior(theta, phi, cohort, 0.0)
    assert len(default[0]) > 0
    for a, b in zip(default, explicit, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_exact_event_with_a_report_known_to_the_day_uses_the_report_interval():
    """Eq. (H5) in the marginal likelihood: a subject whose event time is exact but whose report
    is known only to an interval contributes log f_T(T) + log P(D in [D, D + w)), not f_D(D)."""
    cohort = _interval_cohort(n=400)
    rep = cohort.reported
    rows = (rep & (cohort.event_width == 0) & (cohort.delay_width > 0)).nonzero().squeeze(-1)
    assert len(rows) > 3
    model = JointModel.build(0)
    theta = torch.tensor([0.1, 0.3], dtype=F64)
    phi = torch.tensor([-0.6, 0.2], dtype=F64)
    per_subject = model.loglik(theta, phi, cohort, per_subject=True)
    sub = cohort.subset(rows)
    no_x = sub.x
    lower, upper = sub.delay, sub.delay + sub.delay_width
    expected = model.event.log_density(theta, sub.event_time, no_x) + torch.log(
        model.delay.cdf(phi, upper, no_x) - model.delay.cdf(phi, lower, no_x)
    )
    torch.testing.assert_close(per_subject[rows], expected)


def test_log_observed_is_the_density_at_width_0_and_the_interval_above_it_with_a_shift():
    from survival_delay.hazards import PHComponent, make_family

    component = PHComponent(make_family("weibull"), 1)
    params = torch.tensor([0.2, -0.1, 0.5], dtype=F64)
    x = torch.tensor([[1.0], [-0.5], [0.3]], dtype=F64)
    t = torch.tensor([0.4, 0.9, 0.2], dtype=F64)
    width = torch.tensor([0.0, 0.5, 0.003], dtype=F64)  # exact, half a unit, about a day
    offset = -0.3
    expected = torch.stack(
        [
            component.log_density(params, t, x, offset)[0],
            component.log_interval_prob(params, t, width, x, offset)[1],
            component.log_interval_prob(params, t, width, x, offset)[2],
        ]
    )
    torch.testing.assert_close(component.log_observed(params, t, width, x, offset), expected)


def test_time_of_day_nodes_after_a_short_report_window_carry_no_mass():
    """An event known to its day, reported the same day within a quarter day: nodes later than
    the report window's end are impossible, so their posterior weight is 0 and the subject's
    likelihood stays finite (Eqs. H6, E3)."""
    day = 1 / 365.25
    cohort = Cohort(
        torch.zeros(1, 0, dtype=F64),
        torch.tensor([2.0], dtype=F64),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([True]),
        torch.tensor([0.3], dtype=F64),
        torch.tensor([0.0], dtype=F64),
        torch.tensor([day], dtype=F64),
        torch.tensor([day / 4], dtype=F64),
    ).check()
    model = JointModel.build(0)
    theta = torch.tensor([0.0, 0.2], dtype=F64)
    phi = torch.tensor([math.log(0.5 * day), 0.0], dtype=F64)
    _, offset, weight = model.day_posterior(theta, phi, cohort)
    late = offset[0] >= day / 4
    assert late.any() and (weight[0][late] == 0).all() and weight[0][~late].sum() > 0.999
    assert torch.isfinite(model.loglik(theta, phi, cohort, per_subject=True)).all()


def _tiny_cohort(delays, exposure=(0.3, 0.5, 0.2), window=(1.0, 1.0, 1.0)) -> Cohort:
    reported = torch.tensor([not math.isnan(d) for d in delays])
    return Cohort(
        torch.zeros(len(delays), 0, dtype=F64),
        torch.tensor(window, dtype=F64),
        torch.tensor(exposure, dtype=F64),
        reported,
        torch.tensor([0.1 if r else math.nan for r in reported.tolist()], dtype=F64),
        torch.tensor(delays, dtype=F64),
    ).check()


def test_default_start_takes_its_time_scales_from_the_data():
    """Events start at the exponential law with mean 4 x the longest exposure, delays at the
    mean reported delay (a tenth of the longest exposure without reports), both floored at 1e-3."""
    model = JointModel.build(0)
    start = fitting.default_start(model, _tiny_cohort([0.2, math.nan, 0.4]))
    assert start["theta"].tolist() == pytest.approx([math.log(4 * 0.5), 0.0])
    assert start["phi"].tolist() == pytest.approx([math.log(0.3), 0.0])
    assert start["gamma"].tolist() == [0.0]
    no_reports = fitting.default_start(model, _tiny_cohort([math.nan] * 3))
    assert no_reports["phi"].tolist() == pytest.approx([math.log(0.05), 0.0])
    tiny = fitting.default_start(model, _tiny_cohort([math.nan] * 3, exposure=(0.0, 0.0, 0.0)))
    assert tiny["theta"].tolist() == pytest.approx([math.log(4e-3), 0.0])
    assert tiny["phi"].tolist() == pytest.approx([math.log(1e-3), 0.0])


def test_lbfgs_maximize_reaches_the_rosenbrock_optimum_in_one_call():
    """One call runs L-BFGS for up to ``max_iter`` (200) iterations with a strong-Wolfe line
    search: enough to solve the 2-D Rosenbrock valley from (-1.2, 1), which torch's own default
    of 20 iterations is not."""

    def objective(b):
        x, y = b["theta"][0], b["theta"][1]
        return -((1 - x) ** 2 + 100 * (y - x**2) ** 2)

    start = {"theta": torch.tensor([-1.2, 1.0], dtype=F64), "gamma": torch.zeros(1, dtype=F64)}
    fitted = fitting.lbfgs_maximize(objective, start, ("theta",))
    np.testing.assert_allclose(fitted["theta"].numpy(), [1.0, 1.0], atol=1e-6)
    assert fitted["gamma"].tolist() == [0.0]


def test_unreported_risk_and_ibnr_default_to_no_shift():
    model = JointModel.build(0)
    cohort = _tiny_cohort([0.2, math.nan, 0.4])
    start = fitting.default_start(model, cohort)
    theta, phi = start["theta"], start["phi"]
    zero = torch.zeros(1, dtype=F64)
    assert torch.equal(
        model.posterior_event_prob(theta, phi, cohort),
        model.posterior_event_prob(theta, phi, cohort, zero),
    )
    assert torch.equal(
        model.expected_ibnr(theta, phi, cohort), model.expected_ibnr(theta, phi, cohort, zero)
    )
    assert model.expected_ibnr(theta, phi, cohort, zero) < model.expected_ibnr(
        theta, phi, cohort, zero + 1.0
    )
