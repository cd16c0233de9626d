"""The re-specified claim's checks and tuning metric (issue 59), by value: the tuning score
ranks stopping everything below a useful stop rule, and `flat_in_horizon` as registered fails a
control whose slope is 0.08 at every seed."""

import numpy as np
import pytest

from papers_cli import reproduce_parser
from papers_eval import judge, load_claim_spec
from seqrejectron.claim import CLAIM_FILE, METRICS, SUBJECTS, horizon_slope
from seqrejectron.experiment import TUNING_EXECUTED_WEIGHT, tuning_score


def outcome(cost, stop, executed):
    return {
        "test_cost": np.array(cost, float),
        "train_stop": np.array(stop, float),
        "test_executed": np.array(executed, float),
    }


def test_tuning_score_sees_over_stopping():
    """Four test episodes, two of which pi-hat fails: stopping all of them no longer ties with
    the best stop (the old cost + stop scored both 0)."""
    stop_all = tuning_score(outcome([0, 0, 0, 0], [0, 0], [0, 0, 0, 0]), 0.5)
    never = tuning_score(outcome([1, 1, 0, 0], [0, 0], [1, 1, 1, 1]), 0.5)
    oracle = tuning_score(outcome([0, 0, 0, 0], [0, 0], [0, 0, 1, 1]), 0.5)
    false_alarm = tuning_score(outcome([0, 0, 0, 0], [1, 0], [0, 0, 1, 1]), 0.5)
    assert (stop_all, never, oracle, false_alarm) == pytest.approx((0.0, 0.0, -0.25, 0.25))
    assert TUNING_EXECUTED_WEIGHT == 0.5


def test_horizon_slope_by_hand():
    # rates 0.1, 0.2, 0.3 at log2 horizons 1, 2, 3: slope 0.1 per doubling
    assert horizon_slope({2: 0.1, 4: 0.2, 8: 0.3}) == pytest.approx(0.1)


def spec():
    args = reproduce_parser("x", project_file=CLAIM_FILE).parse_args(
        ["--allow-dirty"]
    )  # a spec, not a run: no provenance needed
    return load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)


def fake_results(slopes: dict[str, list[float]]) -> dict:
    """Results where every subject passes every check but ``flat_in_horizon``'s slope varies."""
    n = 30
    base = {
        "train_stop": [np.zeros(n)] * 3,
        "test_cost": [np.zeros(n)] * 3,
        "test_executed": [np.ones(n)] * 3,
        "b_train_stop": [np.zeros(n)] * 3,
        "b_test_cost": [np.zeros(n)] * 3,
        "b_test_executed": [np.ones(n)] * 3,
        "val_tuning_score": [0.0, 0.0, 0.0],
    }
    results = {}
    for subject in SUBJECTS:
        values = dict(base)
        if subject == "bc":
            values["test_cost"] = [np.ones(n)] * 3
            values["b_test_cost"] = [np.ones(n)] * 3
        values["horizon_slope"] = slopes.get(subject, [0.01, 0.02, 0.015])
        results[subject] = values
    return results


def test_flat_in_horizon_fails_a_slope_of_0_08_and_passes_flat_seeds():
    judged = judge(spec(), fake_results({"seqrejectron": [0.08, 0.079, 0.081]}))
    assert not judged.outcomes["seqrejectron"]["flat_in_horizon"].passed
    judged = judge(spec(), fake_results({"seqrejectron": [0.0, 0.01, 0.005]}))
    assert judged.outcomes["seqrejectron"]["flat_in_horizon"].passed
