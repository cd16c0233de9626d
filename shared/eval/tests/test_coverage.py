"""The coverage harness (claim protocol v3): intervals cover a known mean at about the nominal
rate whether seeds or items dominate the noise, and a check whose truth sits exactly on its bar
passes no more often than the nominal one-sided rate.

Each case draws 200 experiments of 3 seeds x 100 items from a known mean with a fixed seed, so
the numbers below are the same on every run; the tolerances cover a binomial standard error of
about 0.015 at 200 repetitions (the review measured 0.99 and 0.815 for the bootstrap alone).
"""

from __future__ import annotations

import numpy as np
import pytest

from papers_eval import contrast_interval, judge, load_claim_spec

REPETITIONS, N_SEEDS, N_ITEMS, TRUTH = 200, 3, 100, 0.5
NOMINAL, TOLERANCE = 0.95, 0.04


def experiment(rng: np.random.Generator, seed_sd: float, item_sd: float) -> list[np.ndarray]:
    return [
        TRUTH + seed_sd * rng.standard_normal() + item_sd * rng.standard_normal(N_ITEMS)
        for _ in range(N_SEEDS)
    ]


@pytest.mark.parametrize(
    ("regime", "seed_sd", "item_sd"),
    [("items dominate", 0.02, 1.0), ("seeds dominate", 0.5, 1.0), ("balanced", 0.1, 1.0)],
)
def test_per_item_intervals_cover_at_about_the_nominal_rate(regime, seed_sd, item_sd):
    rng = np.random.default_rng(2026)
    covered = []
    for r in range(REPETITIONS):
        interval = contrast_interval(
            [(1.0, experiment(rng, seed_sd, item_sd))], n_resamples=500, seed=r
        )
        covered.append(interval.low <= TRUTH <= interval.high)
    coverage = float(np.mean(covered))
    assert abs(coverage - NOMINAL) <= TOLERANCE, f"{regime}: coverage {coverage}"


def test_paired_differences_cover_at_about_the_nominal_rate():
    """Two methods on the same items of each seed; the true difference is 0.1."""
    rng = np.random.default_rng(7)
    covered = []
    for r in range(REPETITIONS):
        shared = experiment(rng, 0.3, 1.0)
        a = [s + 0.1 + 0.2 * rng.standard_normal(N_ITEMS) for s in shared]
        b = [s + 0.2 * rng.standard_normal(N_ITEMS) for s in shared]
        interval = contrast_interval([(1.0, a), (-1.0, b)], n_resamples=500, seed=r)
        covered.append(interval.low <= 0.1 <= interval.high)
    assert abs(float(np.mean(covered)) - NOMINAL) <= TOLERANCE


def test_a_truth_on_the_bar_passes_at_most_at_the_nominal_one_sided_rate(tmp_path):
    """The review counted 9/200 false passes for the bootstrap alone (nominal 5/200)."""
    import yaml

    path = tmp_path / "claim.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "claim": "c",
                "method": "m",
                "controls": {"negative": ["n"], "positive": ["p"]},
                "seeds": [0, 1, 2],
                "checks": [{"name": "below", "metric": "e", "goal": "lower", "threshold": TRUTH}],
            }
        )
    )
    spec = load_claim_spec(path, subjects=["m", "n", "p"], metrics=["e"])
    rng = np.random.default_rng(11)
    passes = 0
    for _ in range(REPETITIONS):
        results = {s: {"e": experiment(rng, 0.3, 1.0)} for s in ("m", "n", "p")}
        passes += judge(spec, results, n_resamples=500).outcomes["m"]["below"].passed
    assert passes <= 10  # 2.5% of 200 is 5; 10 leaves room for the binomial spread
