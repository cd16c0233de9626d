import numpy as np
import pytest
from sklearn.linear_model import RidgeCV
from sklearn.metrics import r2_score

from counterfactual_instruments.evaluation import (
    RIDGE_ALPHAS,
    SIZE_ERROR_CAP,
    hsm_moments,
    probe_scores,
    recall_at_k,
    shape_errors,
)


def test_probe_scores_average_to_the_r2_by_hand():
    rng = np.random.default_rng(0)
    x_train, x_test = rng.normal(size=(200, 5)), rng.normal(size=(100, 5))
    w = rng.normal(size=(5, 2))
    y_train = x_train @ w + 0.5 * rng.normal(size=(200, 2))
    y_test = x_test @ w + 0.5 * rng.normal(size=(100, 2))
    scores = probe_scores(x_train, y_train, x_test, y_test)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-8
    probe = RidgeCV(alphas=RIDGE_ALPHAS).fit((x_train - mean) / std, y_train)
    expected = r2_score(y_test, probe.predict((x_test - mean) / std), multioutput="uniform_average")
    assert scores.shape == (100,) and scores.mean() == pytest.approx(expected, abs=1e-9)
    # one target column: the in-sample R^2 of a least-squares probe with intercept is >= 0
    one = probe_scores(x_train, y_train[:, :1], x_train, y_train[:, :1])
    assert one.shape == (200,) and 0.5 < one.mean() <= 1.0
    # a latent unrelated to the target explains nothing
    assert probe_scores(rng.normal(size=(200, 5)), y_train, x_test, y_test).mean() < 0.05


def test_recall_at_k_by_hand():
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    queries = np.array([[1.0, 0.1], [1.0, 0.0], [1.0, 1.0]])
    # query 0 is nearest key 0; query 1 is nearest key 0 (key 1 is third); query 2 hits key 2
    np.testing.assert_array_equal(recall_at_k(queries, keys, 1), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(recall_at_k(queries, keys, 2), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(recall_at_k(queries, keys, 3), [1.0, 1.0, 1.0])


def gaussian(sigma_px, size=24, g1=0.0):
    y, x = np.mgrid[:size, :size] - (size - 1) / 2
    x2 = x * (1 - g1)  # a stretch along x: g1 < 0 elongates along x
    return np.exp(-(x2**2 + y**2) / (2 * sigma_px**2))


def test_hsm_size_and_failures():
    images = np.stack([gaussian(2.0), gaussian(3.0), np.zeros((24, 24))])[:, None]
    moments = hsm_moments(np.repeat(images, 2, axis=1), pixel_scale=0.5)
    assert moments[0, 0] == pytest.approx(1.0, rel=0.02) and moments[1, 0] == pytest.approx(
        1.5, rel=0.02
    )
    assert np.isnan(moments[2]).all()  # an empty image cannot be measured
    size, shape = shape_errors(images[:2].repeat(5, 1), images[[1, 0]].repeat(5, 1))
    np.testing.assert_allclose(size, [abs(1.0 - 1.5) / 1.5, abs(1.5 - 1.0) / 1.0], rtol=0.05)
    failed, _ = shape_errors(np.zeros((1, 5, 24, 24)), images[:1].repeat(5, 1))
    assert failed[0] == SIZE_ERROR_CAP
