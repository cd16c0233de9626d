"""Identifiability metrics by value."""

import numpy as np
import pytest

from tcwm.metrics import LinearProbe, affine_r2, mcc, mean_canonical_correlation


def test_affine_r2_is_one_for_an_affine_map_and_near_zero_for_noise():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(500, 3))
    u = s @ rng.normal(size=(3, 3)) + 2.0
    assert affine_r2(u[:400], s[:400], u[400:], s[400:]) == pytest.approx(1.0, abs=1e-6)
    noise = rng.normal(size=(500, 3))
    assert abs(affine_r2(noise[:400], s[:400], noise[400:], s[400:])) < 0.05


def test_mcc_is_one_for_a_scaled_permutation_and_lower_for_a_rotation():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2000, 2))
    assert mcc(s[:, ::-1] * [3.0, -0.5] + 1.0, s) == pytest.approx(1.0)
    angle = np.pi / 4
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    assert mcc(s @ rotation, s) == pytest.approx(np.cos(angle), abs=0.03)


def test_canonical_correlation_is_invariant_to_affine_maps_and_penalises_missing_factors():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2000, 3))
    mixed = s @ rng.normal(size=(3, 3)) - 1.0
    assert mean_canonical_correlation(mixed, s) == pytest.approx(1.0, abs=1e-6)
    # u carries only two of three factors: two canonical correlations of 1, one missing
    assert mean_canonical_correlation(s[:, :2], s) == pytest.approx(2 / 3, abs=1e-6)


def test_the_linear_probe_reads_a_linear_target():
    rng = np.random.default_rng(0)
    latents = rng.normal(size=(300, 4, 2))
    target = latents.reshape(300, -1) @ rng.normal(size=(8, 2))
    probe = LinearProbe(ridge=1e-6).fit(latents[:200], target[:200])
    assert probe.r2(latents[200:], target[200:]) == pytest.approx(1.0, abs=1e-6)
