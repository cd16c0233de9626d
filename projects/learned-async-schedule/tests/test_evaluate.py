import numpy as np
import pytest
import torch

from async_schedule.evaluate import (
    feature_statistics,
    frechet_distance,
    inception_fid,
    precision_recall,
    write_adm_batch,
)
from papers_cli import UserError


def test_frechet_distance_matches_the_closed_form_for_two_gaussians():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=4), rng.normal(size=4)
    var1, var2 = rng.uniform(0.5, 2, size=4), rng.uniform(0.5, 2, size=4)
    closed = ((mu1 - mu2) ** 2).sum() + (var1 + var2 - 2 * np.sqrt(var1 * var2)).sum()
    rotation, _ = np.linalg.qr(rng.normal(size=(4, 4)))  # the distance is rotation invariant
    sigma1, sigma2 = rotation @ np.diag(var1) @ rotation.T, rotation @ np.diag(var2) @ rotation.T
    assert frechet_distance(mu1, sigma1, mu2, sigma2) == pytest.approx(closed, rel=1e-8)
    assert frechet_distance(mu1, sigma1, mu1, sigma1) == pytest.approx(0, abs=1e-8)


def test_frechet_distance_of_samples_converges_to_the_closed_form():
    rng = np.random.default_rng(1)
    a = rng.normal(0.0, 1.0, size=(200_000, 3))
    b = rng.normal(1.0, 2.0, size=(200_000, 3))
    closed = 3 * 1.0 + 3 * (1 + 4 - 2 * 2)  # |mu|^2 + Tr(S1 + S2 - 2 sqrt(S1 S2)) = 3 + 3
    assert frechet_distance(*feature_statistics(a), *feature_statistics(b)) == pytest.approx(
        closed, rel=0.02
    )


def test_precision_recall_identical_and_disjoint_sets():
    real = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
    assert precision_recall(real, real.clone()) == (1.0, 1.0)
    assert precision_recall(real, real + 100) == (0.0, 0.0)
    collapsed = real[:5].repeat(60, 1)  # mode collapse: precise, poor recall
    precision, recall = precision_recall(real, collapsed)
    assert precision == 1.0 and recall < 0.2


def test_adm_batch_has_the_reference_evaluator_layout(tmp_path):
    images = torch.rand(3, 3, 8, 8) * 2 - 1
    path = write_adm_batch(tmp_path / "samples.npz", images)
    with np.load(path) as batch:
        assert batch.files == ["arr_0"]
        assert batch["arr_0"].dtype == np.uint8 and batch["arr_0"].shape == (3, 8, 8, 3)


def test_fid_without_local_inception_weights_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="Inception"):
        inception_fid(str(tmp_path / "missing.pth"))
    with pytest.raises(UserError, match="--inception-weights"):
        inception_fid(None)
