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


class Split:
    def __init__(self, arrays):
        self.arrays = arrays

    def __len__(self):
        return len(next(iter(self.arrays.values())))


def test_evaluate_reads_each_metric_from_its_latent_and_target(monkeypatch):
    """evaluate() on latents whose answers are known: z_p^A = [params, PSF of A], z_p^B =
    [2 params, 0], z_s = the condition. Expected: PSF R^2 1 on A and 0 on B (mean 0.5), noise
    R^2 0, condition R^2 from z_s 1 and galaxy R^2 from it 0, probes within 1; across, a probe
    fit on A scores 2p (R^2 = 1 - E[p^2]/var p = 0) and one fit on B scores p/2 (0.75); seeing
    that widens A's blobs gives a size-PSF correlation near 1; views 10% wider than the truth a
    size error of 0.1."""
    import torch

    from counterfactual_instruments import evaluation

    rng = np.random.default_rng(0)

    def split(n):
        params = rng.normal(size=(n, 6))
        cond = {x: rng.normal(size=(n, 2)) for x in "AB"}
        psf_a = 2.0 + 0.5 * np.tanh(cond["A"][:, 0])  # blob width in pixels grows with seeing
        image_a = np.stack([np.repeat(gaussian(s, size=16)[None], 3, 0) for s in psf_a])
        sigma_b = 2.0 + 0.3 * np.arange(n) / n
        truth_b = np.stack([np.repeat(gaussian(s, g1=0.1)[None], 5, 0) for s in sigma_b])
        view_b = np.stack([np.repeat(gaussian(1.1 * s, g1=0.1)[None], 5, 0) for s in sigma_b])
        arrays = {
            "params": torch.tensor(params),
            "cond_A": torch.tensor(cond["A"]),
            "cond_B": torch.tensor(cond["B"]),
            "image_A": torch.tensor(image_a),
            "truth_B": torch.tensor(truth_b),
            "partner_ivar_B": torch.ones(truth_b.shape, dtype=torch.float64),
        }
        latents = {
            "zp_A": np.concatenate([params, cond["A"][:, :1]], 1),
            "zp_B": np.concatenate([2 * params, np.zeros((n, 1))], 1),
            "zs_A": cond["A"],
            "zs_B": cond["B"],
            "counterfactual_B": view_b,  # 10% wider, same shape
        }
        return Split(arrays), latents

    (train, train_z), (test, test_z) = split(400), split(60)
    data = type("Data", (), {"train_set": train, "test_set": test})()
    monkeypatch.setattr(evaluation, "encode", lambda m, d: train_z if d is train else test_z)
    metrics = evaluation.evaluate(None, data)

    mean = {k: float(np.mean(v)) for k, v in metrics.items()}
    assert mean["psf_r2"] == pytest.approx(0.5, abs=0.06)
    assert mean["noise_r2"] == pytest.approx(0.0, abs=0.1)
    assert mean["nuisance_r2"] == pytest.approx(0.25, abs=0.06)  # PSF on A only, of 2 columns
    assert mean["condition_r2_from_instrument"] == pytest.approx(1.0, abs=0.01)
    assert mean["intrinsic_r2_from_instrument"] == pytest.approx(0.0, abs=0.1)
    assert mean["probe_r2_within"] == pytest.approx(1.0, abs=0.01)
    assert mean["cross_probe_r2"] == pytest.approx(0.375, abs=0.12)
    np.testing.assert_allclose(
        metrics["transfer_gap"], metrics["probe_r2_within"] - metrics["cross_probe_r2"]
    )
    for k in (1, 5):  # both directions averaged
        expected = 0.5 * (
            recall_at_k(test_z["zp_A"], test_z["zp_B"], k)
            + recall_at_k(test_z["zp_B"], test_z["zp_A"], k)
        )
        np.testing.assert_array_equal(metrics[f"recall_at_{k}"], expected)
    assert mean["recall_at_5"] > mean["recall_at_1"]
    residual = test_z["counterfactual_B"] - test.arrays["truth_B"].numpy()  # eq. 2, ivar 1
    np.testing.assert_allclose(metrics["counterfactual_chi2"], (residual**2).mean((1, 2, 3)))
    np.testing.assert_allclose(metrics["counterfactual_size_error"], 0.1, rtol=0.05)
    assert metrics["counterfactual_shape_error"].max() < 0.02
    assert metrics["observed_size_psf_corr"] > 0.9
    assert all(len(np.atleast_1d(v)) in (1, 60) for v in metrics.values())


def diagonal(sigma_px=2.5, stretch=0.3, size=24):
    """A Gaussian elongated along the x = y diagonal: its shear is in g2 (g1 = 0)."""
    y, x = np.mgrid[:size, :size] - (size - 1) / 2
    u, v = (x + y) / np.sqrt(2), (x - y) / np.sqrt(2)
    return np.exp(-(((1 - stretch) * u) ** 2 + v**2) / (2 * sigma_px**2))


def test_shape_error_is_the_distance_between_both_shear_components():
    """A view sheared along one diagonal against a truth sheared along the other (g2 -> -g2),
    and one sheared in g1 against its transpose (g1 -> -g1): the error is |g_pred - g_true|
    with g = (g1, g2), by value from the two measurements."""
    views = np.stack([diagonal(), gaussian(2.5, g1=0.3)])[:, None].repeat(5, 1)
    truths = np.stack([np.fliplr(diagonal()), gaussian(2.5, g1=0.3).T])[:, None].repeat(5, 1)
    p, t = hsm_moments(views, 0.168), hsm_moments(truths, 0.168)
    assert abs(p[0, 2]) > 0.05 and abs(p[0, 1]) < 0.01  # the first pair lives in g2
    assert abs(p[1, 1]) > 0.05 and abs(p[1, 2]) < 0.01  # the second in g1
    np.testing.assert_allclose(t[:, 1:], -p[:, 1:], atol=0.01)  # each truth the mirror shear
    _, shape = shape_errors(views, truths)
    np.testing.assert_allclose(shape, [2 * abs(p[0, 2]), 2 * abs(p[1, 1])], rtol=0.02)


def test_wild_and_failed_measurements_count_as_the_cap():
    wide = gaussian(7.0)[None, None].repeat(5, 1)  # 3.5x the truth's size: a 250% error
    truth = gaussian(2.0)[None, None].repeat(5, 1)
    size, shape = shape_errors(wide, truth)
    assert size[0] == SIZE_ERROR_CAP and 0 <= shape[0] < SIZE_ERROR_CAP
    failed_size, failed_shape = shape_errors(np.zeros((1, 5, 24, 24)), truth)
    assert failed_size[0] == failed_shape[0] == SIZE_ERROR_CAP
