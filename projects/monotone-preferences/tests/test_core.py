import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from sklearn.isotonic import IsotonicRegression

from monotone_preferences.baselines import OLS
from monotone_preferences.core import (
    CrossFitRobust,
    IsotonicRegressor,
    MonotoneNetwork,
    NonNegativeLinear,
    advice_agreement,
    aggregation_weights,
    all_pair_edges,
    apply_directions,
    criterion_effects,
    enforce_order,
    excess_error,
    fold_ids,
    isotonic_qp,
    ordered_pairs,
    pool_ties,
    reduced_edges,
    sign_accuracy,
    top_k_precision,
    violation_rate,
)


def random_problem(n=40, d=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, d))
    return x, x.min(1) + 0.3 * rng.normal(size=n)


@pytest.mark.parametrize("d", [2, 3])
def test_isotonic_fit_satisfies_every_dominance_constraint(d):
    x, y = random_problem(60, d, seed=d)
    model = IsotonicRegressor().fit(x, y)
    theta = model.predict(x)
    pairs = all_pair_edges(x)
    assert len(pairs) > 50
    assert np.all(theta[pairs[:, 0]] <= theta[pairs[:, 1]] + 1e-12)
    assert np.std(theta) > 0.05  # not a constant (a constant satisfies every constraint)


def test_isotonic_matches_sklearn_in_one_dimension_with_ties():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 15, size=80).astype(float)[:, None]  # many ties
    y = np.sin(x[:, 0] / 3) + x[:, 0] / 5 + 0.5 * rng.normal(size=80)
    ours = IsotonicRegressor().fit(x, y).predict(x)
    reference = IsotonicRegression().fit(x[:, 0], y).predict(x[:, 0])
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def generic_qp(x, y):
    """Eq. 3 with all-pairs constraints, solved by SLSQP (no pooling, no reduction)."""
    pairs = all_pair_edges(x)
    constraints = [{"type": "ineq", "fun": lambda t, i=i, j=j: t[j] - t[i]} for i, j in pairs]
    result = minimize(
        lambda t: np.sum((y - t) ** 2),
        np.full(len(y), y.mean()),
        jac=lambda t: 2 * (t - y),
        constraints=constraints,
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 500},
    )
    return result.x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_isotonic_matches_a_generic_qp_on_small_cases(seed):
    x, y = random_problem(12, 2, seed)
    np.testing.assert_allclose(
        IsotonicRegressor().fit(x, y).predict(x), generic_qp(x, y), atol=1e-4
    )


def test_all_pair_edges_are_the_strict_dominance_pairs():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    edges = {tuple(e) for e in all_pair_edges(x).tolist()}
    assert edges == {(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)}  # no (i, i), no incomparable pair


def test_monotone_network_by_hand():
    """Forward pass against a hand computation: softplus weights, tanh between layers and a
    linear output (values outside [-1, 1]), one output per row."""
    net = MonotoneNetwork(2, hidden=2, layers=1)
    w1, b1 = torch.tensor([[1.0, 2.0], [0.5, 0.25]]), torch.tensor([0.1, -0.2])
    w2, b2 = torch.tensor([[3.0, 4.0]]), torch.tensor([1.5])
    with torch.no_grad():
        for raw, bias, w, b in zip(net.raw_weights, net.biases, (w1, w2), (b1, b2), strict=True):
            raw.copy_(torch.log(torch.expm1(w)))  # softplus(raw) = w
            bias.copy_(b)
    x = torch.tensor([[0.3, -0.4], [1.0, 2.0], [-1.0, 0.5]])
    expected = torch.tanh(x @ w1.T + b1) @ w2.T + b2
    out = net(x)
    assert out.shape == (3,)
    torch.testing.assert_close(out, expected.squeeze(-1))


def test_reduced_edges_of_a_chain_by_hand():
    x = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [2.0, 0.0]])
    edges = {tuple(e) for e in reduced_edges(x).tolist()}
    # 0 <= 1 <= 2 and 0 <= 3 <= 2; (0, 2) is implied by transitivity; 1 and 3 are incomparable
    assert edges == {(0, 1), (1, 2), (0, 3), (3, 2)}
    # the middle of a chain is row 0, and it is found in every blocking
    chain = np.array([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    for block in (1, 2, 3):
        assert {tuple(e) for e in reduced_edges(chain, block).tolist()} == {(1, 0), (0, 2)}
    empty = reduced_edges(np.zeros((0, 2)))
    assert empty.shape == (0, 2) and empty.dtype.kind == "i"


def test_isotonic_qp_pools_a_single_violated_pair_by_hand():
    """One edge theta_0 <= theta_1 against y = (2, 1) with weights (1, 3): the weighted mean."""
    theta = isotonic_qp(np.array([2.0, 1.0]), np.array([1.0, 3.0]), np.array([[0, 1]]))
    np.testing.assert_allclose(theta, [1.25, 1.25], atol=1e-6)
    assert theta[0] <= theta[1]


def test_reduced_edges_give_the_all_pairs_fit_and_blocking_changes_nothing():
    x, y = random_problem(80, 3, seed=5)
    reduced, every = reduced_edges(x), all_pair_edges(x)
    assert len(reduced) < len(every)
    assert {tuple(e) for e in reduced.tolist()} <= {tuple(e) for e in every.tolist()}
    weights = np.ones(len(y))
    np.testing.assert_allclose(
        isotonic_qp(y, weights, reduced), isotonic_qp(y, weights, every), atol=1e-5
    )
    np.testing.assert_array_equal(
        np.sort(reduced_edges(x, block=7), axis=0), np.sort(reduced, axis=0)
    )


def test_ties_are_pooled():
    x = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    y = np.array([0.0, 1.0, 2.0, 6.0, 5.0])
    unique, means, counts, inverse = pool_ties(x, y)
    assert counts.tolist() == [1, 3, 1] and means.tolist() == [0.0, 3.0, 5.0]
    np.testing.assert_array_equal(unique[inverse], x)
    # pooled mean 3 at the tie; the violation 3 vs 5 is none, so theta = (0, 3, 5)
    np.testing.assert_allclose(IsotonicRegressor().fit(x, y).predict(x), [0, 3, 3, 3, 5], atol=1e-6)
    # weighting matters: (1,1) x3 with mean 3 against (2,2) with 2 pools to (3*3 + 2) / 4
    y2 = np.array([0.0, 1.0, 2.0, 6.0, 2.0])
    fit = IsotonicRegressor().fit(x, y2).predict(x)
    np.testing.assert_allclose(fit[1:], 11 / 4, atol=1e-6)


def test_prediction_rule_midpoint_of_envelopes_and_clipping():
    x = np.array([[0.0, 0.0], [1.0, 1.0]])
    model = IsotonicRegressor().fit(x, np.array([1.0, 3.0]))
    new = np.array([[0.5, 0.5], [0.0, 0.0], [5.0, 5.0], [-1.0, -1.0], [0.5, -1.0], [1.0, 0.0]])
    # between: (1 + 3) / 2; at a fitted point: its theta; above / below the data: clipped;
    # (0.5, -1) is below (1, 1) only: lower envelope clipped to the minimum 1 -> (1 + 3) / 2;
    # (1, 0) is above (0, 0) and below (1, 1): (1 + 3) / 2
    np.testing.assert_allclose(model.predict(new), [2.0, 1.0, 3.0, 1.0, 2.0, 2.0])


def test_enforce_order_removes_small_violations():
    theta = enforce_order(np.array([1.0, 0.999, 0.5]), np.array([[0, 1], [1, 2]]))
    assert theta.tolist() == [1.0, 1.0, 1.0]


def test_nnls_keeps_weights_non_negative_with_a_free_intercept():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    y = 5.0 + 2.0 * x[:, 0] - 1.0 * x[:, 1] + 0.01 * rng.normal(size=200)
    model = NonNegativeLinear().fit(x, y)
    assert model.coef_[0] == pytest.approx(2.0, abs=0.05) and model.coef_[1] == 0.0
    assert model.intercept_ == pytest.approx(5.0, abs=0.1)


def test_cross_fitted_choice_picks_the_branch_with_lower_held_out_loss():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(200, 2))
    linear = x @ [1.0, 0.5] + 0.2 * rng.normal(size=200)
    step = 2.0 * (x.min(1) > 0.5) + 0.1 * rng.normal(size=200)
    for y, expected in ((linear, "linear"), (step, "isotonic")):
        robust = CrossFitRobust(folds=5, seed=0).fit(x, y)
        losses = robust.cv_losses_
        assert robust.chosen_ == expected == min(losses, key=losses.get)
        assert robust.weights_[expected] == 1.0
        np.testing.assert_allclose(robust.predict(x), robust.fitted_[expected].predict(x))


def test_cross_fitted_losses_are_held_out_losses_by_hand():
    x = np.arange(10.0)[:, None]
    y = np.arange(10.0)
    robust = CrossFitRobust(folds=2, seed=3).fit(x, y)
    assert robust.cv_losses_["linear"] == pytest.approx(0.0, abs=1e-12)  # a line fits exactly
    ids = fold_ids(10, 2, 3)
    manual = np.zeros(10)
    for k in range(2):
        model = IsotonicRegressor().fit(x[ids != k], y[ids != k])
        manual[ids == k] = (model.predict(x[ids == k]) - y[ids == k]) ** 2
    assert robust.cv_losses_["isotonic"] == pytest.approx(manual.mean())


def test_aggregation_weights_by_hand():
    weights = aggregation_weights({"linear": 0.5, "isotonic": 0.6}, n=10, rule="aggregate", beta=2)
    ratio = np.exp(-10 * 0.1 / (2.0 * 0.5))  # Eq. 6: the scale is beta times the best loss
    assert weights["isotonic"] == pytest.approx(ratio / (1 + ratio))
    assert weights["linear"] == pytest.approx(1 / (1 + ratio))
    assert aggregation_weights({"a": 2.0, "b": 1.0}, 10, "select", 1.0) == {"a": 0.0, "b": 1.0}


def test_aggregation_weights_stay_finite_at_large_n():
    """Eq. 6 is computed relative to the best loss, so a large n does not underflow both."""
    weights = aggregation_weights({"linear": 0.5, "isotonic": 0.5001}, 10_000, "aggregate", 1.0)
    assert weights["isotonic"] / weights["linear"] == pytest.approx(np.exp(-2.0))


def test_fewer_rows_than_folds_is_an_error():
    with pytest.raises(ValueError, match="folds"):
        CrossFitRobust(folds=5).fit(np.zeros((3, 2)), np.zeros(3))
    assert sorted(fold_ids(5, 5, 0)) == [0, 1, 2, 3, 4]  # as many rows as folds is fine


def test_cross_fitting_is_seeded_and_the_default_rule_selects():
    x, y = random_problem(60, 2, seed=3)
    first, second = CrossFitRobust().fit(x, y), CrossFitRobust().fit(x, y)
    assert first.cv_losses_ == second.cv_losses_
    assert CrossFitRobust(seed=1).fit(x, y).cv_losses_ != first.cv_losses_
    assert sorted(first.weights_.values()) == [0.0, 1.0]


@pytest.mark.parametrize("make", [NonNegativeLinear, IsotonicRegressor, CrossFitRobust])
def test_saved_state_restores_the_same_predictions(make):
    x, y = random_problem(80, 2, seed=5)
    fitted = make().fit(x, y)
    restored = make().set_state(fitted.get_state())
    queries = np.random.default_rng(6).uniform(-0.2, 1.2, size=(50, 2))
    np.testing.assert_array_equal(restored.predict(queries), fitted.predict(queries))
    if make is CrossFitRobust:
        assert restored.cv_losses_ == fitted.cv_losses_ and restored.chosen_ == fitted.chosen_


def test_directions_flip_and_reject_other_values():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(apply_directions(x, [1, -1]), [[1.0, -2.0], [3.0, -4.0]])
    assert apply_directions(np.array([[1, 2]]), [1, -1]).dtype == np.float64  # grades as ints
    for bad in ([1, 0], [1, 0.5], [1, 2]):
        with pytest.raises(ValueError, match="directions"):
            apply_directions(x, bad)
    with pytest.raises(ValueError, match="2 criteria"):
        apply_directions(x, [1])


def test_a_decreasing_criterion_is_learned_after_its_flip():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(150, 2))
    y = x[:, 0] - 2 * x[:, 1] + 0.05 * rng.normal(size=150)  # criterion 2 is "lower is better"
    flipped = apply_directions(x, [1, -1])
    fit = NonNegativeLinear().fit(flipped, y)
    assert fit.coef_[1] == pytest.approx(2.0, abs=0.1)
    assert NonNegativeLinear().fit(x, y).coef_[1] == 0.0  # unflipped, the constraint bites


def test_downstream_metrics_by_hand():
    truth = np.arange(10.0)
    assert top_k_precision(truth, truth, 0.2) == 1.0
    assert top_k_precision(-truth, truth, 0.2) == 0.0
    assert top_k_precision(np.r_[truth[:8], 0, 9], truth, 0.2) == 0.5
    # the default admits the best 10%: 2 of 20 here, 1 of 5 (at least one)
    twenty = np.arange(20.0)
    assert top_k_precision(np.r_[twenty[:18], 0, 19], twenty) == 0.5
    assert top_k_precision(np.array([0.0, 1, 3, 2, 4]), np.arange(5.0)) == 1.0
    # ties go to the lower index (a stable sort), in the prediction and in the truth
    tied = np.random.default_rng(3).integers(0, 3, 40).astype(float)  # top 4 by index: 0 5 6 16
    first = np.zeros(40)
    first[[0, 5, 6, 16]] = 1.0
    assert top_k_precision(tied, first) == 1.0
    assert top_k_precision(first, tied) == 1.0
    np.testing.assert_allclose(
        excess_error(np.array([1.0, 3.0]), np.array([2.0, 0.0]), 2.0), [0.5, 4.5]
    )
    true = np.array([[1.0, 0.1], [0.2, 1.0]])
    assert sign_accuracy(np.array([[1.0, -0.1], [1.0, -0.1]]), true) == 0.5
    assert advice_agreement(np.array([[2.0, 1.0], [2.0, 1.0]]), true) == 0.5
    assert advice_agreement(np.array([[1.0, 1.0], [0.0, 1.0]]), true) == 0.5  # a tie disagrees


def test_sign_accuracy_and_advice_by_hand_with_three_criteria():
    true = np.array([[1.0, -1.0, 0.5], [2.0, -1.0, 0.1]])  # mean effects +, -, +; best: 0, 0
    assert sign_accuracy(np.array([[1.0, 1.0, -1.0], [1.0, 1.0, -1.0]]), true) == pytest.approx(
        1 / 3
    )
    estimated = np.array([[3.0, 1.0, 0.0], [0.0, 1.0, 5.0]])  # row maxima differ: 3 and 5
    assert advice_agreement(estimated, true) == 0.5
    assert advice_agreement(np.array([[3.0, 3.0, 0.0], [9.0, 1.0, 1.0]]), true) == 0.5


def test_violation_rate_counts_only_drops_beyond_the_tolerance():
    x = np.zeros((4, 2))
    assert violation_rate(lambda z: np.zeros(len(z)), x, x) == 0.0  # flat is monotone
    assert violation_rate(lambda z: z[:, 0], x + 5e-10, x, tol=1e-9) == 0.0
    assert violation_rate(lambda z: z[:, 0], x + 2e-9, x, tol=1e-9) == 1.0
    assert violation_rate(lambda z: z[:, 0], x + 0.5, x, tol=0.5) == 0.0  # a drop of exactly tol


def test_ordered_pairs_step_up_by_a_share_of_each_criterion_spread():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=400), 100.0 * rng.normal(size=400)])
    low, high = ordered_pairs(x, 20_000, np.random.default_rng(1))
    step = high - low
    expected = 0.3 * x.std(0) * np.sqrt(2 / np.pi)  # E|N(0, 1)| = sqrt(2 / pi)
    np.testing.assert_allclose(step.mean(0), expected, rtol=0.03)
    assert np.corrcoef(step[:, 0], step[:, 1])[0, 1] == pytest.approx(0.0, abs=0.03)
    base_rows = {tuple(r) for r in low[:2000].tolist()}
    assert tuple(x[0]) in base_rows and len(base_rows) > 390  # every row can be a base point
    tiny = np.array([[0.0], [1e-3]])
    _, up = ordered_pairs(tiny, 2000, np.random.default_rng(2))
    assert up.max() < 0.01  # the step follows the spread even when it is small


def test_criterion_effects_and_violation_rate():
    x = np.random.default_rng(0).uniform(size=(50, 2))
    effects = criterion_effects(lambda z: 2 * z[:, 0] - z[:, 1], x, np.array([0.1, 0.1]))
    np.testing.assert_allclose(effects, np.tile([0.2, -0.1], (50, 1)), atol=1e-12)
    low, high = ordered_pairs(x, 300, np.random.default_rng(1))
    assert np.all(high >= low)
    assert violation_rate(lambda z: z.sum(1), low, high) == 0.0
    assert violation_rate(lambda z: -z.sum(1), low, high) > 0.99


@pytest.mark.parametrize("make", ["robust", "network"])
def test_robust_fit_and_network_stay_monotone_on_random_ordered_pairs(make):
    x, y = random_problem(150, 3, seed=4)
    if make == "robust":
        predict = CrossFitRobust(rule="aggregate", seed=0).fit(x, y).predict
    else:
        torch.manual_seed(0)
        net = MonotoneNetwork(3, 16)
        optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
        inputs, target = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
        for _ in range(30):
            optimizer.zero_grad()
            torch.mean((net(inputs) - target) ** 2).backward()
            optimizer.step()

        def predict(z):
            with torch.no_grad():
                return net(torch.tensor(z, dtype=torch.float32)).numpy()

    low, high = ordered_pairs(x, 3000, np.random.default_rng(2))
    assert violation_rate(predict, low, high, tol=1e-6) == 0.0
    assert np.std(predict(x)) > 0.01


def test_ols_flips_a_sign_on_a_correlated_example_that_monotone_fits_do_not():
    """A disjunctive bar on criteria 1-2 (negatively correlated with criterion 3, which has a
    small positive effect): OLS gives criterion 3 a negative weight; NNLS and robust do not."""
    from scipy.special import expit
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    cov = np.full((3, 3), -0.3) + 1.3 * np.eye(3)
    x = norm.cdf(rng.standard_normal((20000, 3)) @ np.linalg.cholesky(cov).T)
    f = expit(100 * (x[:, :2].max(1) - 0.95)) + 0.02 * x[:, 2]
    y = f + 0.05 * rng.normal(size=len(f))
    assert OLS().fit(x, y).coef_[2] < -0.01
    assert NonNegativeLinear().fit(x, y).coef_[2] >= 0.0
    effects = criterion_effects(CrossFitRobust(seed=0).fit(x[:800], y[:800]).predict, x[:500],
                                np.full(3, 0.1))  # fmt: skip
    assert effects[:, 2].mean() >= 0.0
