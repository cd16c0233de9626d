"""Value tests of hazards.py that the mutation lane asked for (issue 51): the fits' starting
points, the piecewise family at its cuts and with cuts float32 cannot hold, the log-normal's
cumulative hazard at t = 0, the PH component's default offset, and the family lookup's error."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from survival_delay.hazards import PHComponent, make_family

F64 = torch.float64
TIMES = torch.tensor([0.05, 0.4, 1.0, 2.7, 9.0], dtype=F64)


@pytest.mark.parametrize("name", ["weibull", "gompertz", "piecewise"])
def test_event_families_start_at_the_exponential_law_of_the_time_scale(name):
    """Every event family's starting point is the exponential law with mean ``time_scale``
    (Weibull shape 1, Gompertz slope 0, equal piecewise rates), in float64."""
    family = make_family(name)
    for time_scale in (0.3, 2.0):
        start = family.init_baseline(time_scale)
        assert start.dtype == F64
        np.testing.assert_allclose(
            family.cumhaz0(TIMES, start).numpy(), (TIMES / time_scale).numpy(), rtol=1e-12
        )
        np.testing.assert_allclose(
            family.log_hazard0(TIMES, start).numpy(), -math.log(time_scale), rtol=1e-12
        )


def test_lognormal_starts_at_median_time_scale_and_unit_log_sd():
    family = make_family("lognormal")
    start = family.init_baseline(2.0)
    assert start.dtype == F64
    survival = torch.exp(-family.cumhaz0(TIMES, start)).numpy()
    np.testing.assert_allclose(survival, stats.lognorm(s=1.0, scale=2.0).sf(TIMES.numpy()))


def test_ph_component_start_is_the_baseline_start_and_zero_coefficients():
    comp = PHComponent(make_family("weibull"), 3)
    params = comp.init_params(2.0)
    assert params.dtype == F64
    assert params.tolist() == [math.log(2.0), 0.0, 0.0, 0.0, 0.0]


def test_piecewise_hazard_at_a_cut_is_the_next_piece_rate():
    """Eq. (P)'s pieces are [s_k, s_{k+1}): a time exactly on a cut (day-resolution data put
    times on whole-day cuts) takes the rate of the piece that starts there."""
    family = make_family("piecewise", cuts=(1.0, 2.0, 5.0))
    b = torch.tensor([-1.0, -0.5, 0.2, -2.0], dtype=F64)
    t = torch.tensor([0.0, 0.999, 1.0, 2.0, 4.0, 5.0, 7.0], dtype=F64)
    assert family.log_hazard0(t, b).tolist() == [-1.0, -1.0, -0.5, 0.2, 0.2, -2.0, -2.0]


def test_piecewise_cuts_are_kept_in_the_times_precision():
    """A cut at 0.1 (not exact in float32) is used in float64 with float64 times: the
    cumulative hazard matches Eq. (P) by hand to rounding, not to float32's 1.5e-9 of the cut."""
    family = make_family("piecewise", cuts=(0.1, 0.3))
    rates = torch.tensor([1000.0, 1.0, 10.0], dtype=F64)
    t = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.7], dtype=F64)
    cut1, cut2 = 0.1, 0.3
    expected = [
        1000.0 * min(v, cut1) + 1.0 * max(min(v, cut2) - cut1, 0.0) + 10.0 * max(v - cut2, 0.0)
        for v in t.tolist()
    ]
    np.testing.assert_allclose(family.cumhaz0(t, rates.log()).numpy(), expected, rtol=1e-14)


def test_lognormal_cumulative_hazard_is_zero_at_time_zero_even_when_wide():
    """H0(0) = 0 by definition; with a wide log-normal (sigma = e^3) the clamped log-time alone
    would give H0(0) = -log Phi(1.4...) ~ 0.08."""
    family = make_family("lognormal")
    b = torch.tensor([0.0, 3.0], dtype=F64)
    t = torch.tensor([0.0, 1.0], dtype=F64)
    cumhaz = family.cumhaz0(t, b)
    assert cumhaz[0].item() == 0.0
    assert cumhaz[1].item() == pytest.approx(math.log(2.0))


def test_ph_component_offset_defaults_to_zero():
    comp = PHComponent(make_family("weibull"), 2)
    params = torch.tensor([0.5, 0.2, 0.7, -0.4], dtype=F64)
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=F64)
    t = torch.tensor([0.8, 1.5], dtype=F64)
    lp = x @ torch.tensor([0.7, -0.4], dtype=F64)
    assert torch.equal(comp.linear_predictor(params, x), lp)
    np.testing.assert_allclose(
        comp.log_hazard(params, t, x).numpy(),
        (comp.family.log_hazard0(t, params[:2]) + lp).numpy(),
        rtol=1e-14,
    )


def test_unknown_family_names_itself_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown hazard family 'weibul'.*'gompertz'.*'weibull'"):
        make_family("weibul")
