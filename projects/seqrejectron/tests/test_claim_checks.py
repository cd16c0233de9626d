"""The re-specified claim's checks and tuning metric (issue 59), by value: the tuning score
ranks stopping everything below a useful stop rule; `flat_in_horizon` as registered fails a
control whose slope is 0.08 at a seed and passes the review's independent seeds; `beats_novelty`
and `sound_vs_bc` bound every seed."""

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
    assert TUNING_EXECUTED_WEIGHT == 0.1


def test_registered_weight_ranks_a_useful_stop_above_never_stopping():
    """(A)'s typical world (record 7f3db3a, seed-0 means): never-stopping BC costs 0.13 and runs
    every episode; a stop rule at cost 0.01 runs 0.7 of them. Weight 0.5 preferred never
    stopping (the third round's preview picked a Lambda with no validator); 0.1 does not, and
    stopping everything still loses to the useful stop."""
    never = outcome([1] * 13 + [0] * 87, [0], [1] * 100)
    useful = outcome([1] + [0] * 99, [0], [1] * 70 + [0] * 30)
    stop_all = outcome([0] * 100, [0], [0] * 100)
    assert tuning_score(never, 0.5) < tuning_score(useful, 0.5)
    weight = TUNING_EXECUTED_WEIGHT
    assert tuning_score(useful, weight) < min(
        tuning_score(never, weight), tuning_score(stop_all, weight)
    )


def test_horizon_slope_by_hand():
    # rates 0.1, 0.2, 0.3 at log2 horizons 1, 2, 3: slope 0.1 per doubling
    assert horizon_slope({2: 0.1, 4: 0.2, 8: 0.3}) == pytest.approx(0.1)


def spec():
    args = reproduce_parser("x", project_file=CLAIM_FILE).parse_args(
        ["--allow-dirty"]
    )  # a spec, not a run: no provenance needed
    return load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)


def fake_results(slopes: dict[str, list[float]], executed=None, test_cost=None) -> dict:
    """Results where every subject passes every check but ``beats_novelty`` (all execute every
    episode) unless ``executed`` says otherwise; ``flat_in_horizon``'s slope varies; ``executed``
    / ``test_cost``: {subject: per-seed shares} override (A)'s episodes."""
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
        for metric, override in (("test_executed", executed), ("test_cost", test_cost)):
            if override and subject in override:
                values[metric] = [np.full(n, share) for share in override[subject]]
        results[subject] = values
    return results


def test_flat_in_horizon_fails_a_slope_of_0_08_and_passes_flat_seeds():
    judged = judge(spec(), fake_results({"seqrejectron": [0.08, 0.079, 0.081]}))
    assert not judged.outcomes["seqrejectron"]["flat_in_horizon"].passed
    judged = judge(spec(), fake_results({"seqrejectron": [0.0, 0.01, 0.005]}))
    assert judged.outcomes["seqrejectron"]["flat_in_horizon"].passed
    # the review's independent seed set: every slope under the bar, the t interval was not
    judged = judge(spec(), fake_results({"seqrejectron": [0.0, 0.028, 0.0]}))
    assert judged.outcomes["seqrejectron"]["flat_in_horizon"].passed
    judged = judge(spec(), fake_results({"seqrejectron": [0.0, 0.08, 0.0]}))
    assert not judged.outcomes["seqrejectron"]["flat_in_horizon"].passed


@pytest.mark.parametrize(
    ("method", "novelty", "passes"),
    [
        ([0.6, 0.6, 0.6], [0.5, 0.55, 0.57], True),  # ahead by more than 0.02 at every seed
        ([0.6, 0.6, 0.6], [0.5, 0.59, 0.5], False),  # one seed ahead by only 0.01
        ([0.9, 0.9, 0.5], [0.5, 0.5, 0.55], False),  # a large mean lead, behind at one seed
    ],
)
def test_beats_novelty_needs_a_lead_of_0_02_at_every_seed(method, novelty, passes):
    executed = {"seqrejectron": method, "novelty": novelty}
    judged = judge(spec(), fake_results({}, executed=executed))
    assert judged.outcomes["seqrejectron"]["beats_novelty"].passed == passes


def test_sound_vs_bc_bounds_every_seed_not_the_t_interval():
    """BC's cost 0.124 / 0.236 / 0.077 (record 916c137) against a method at 0: each seed clears
    the 0.05 margin, the t interval over the three did not; a seed at 0.04 fails."""
    judged = judge(spec(), fake_results({}, test_cost={"bc": [0.124, 0.236, 0.077]}))
    assert judged.outcomes["seqrejectron"]["sound_vs_bc"].passed
    assert judged.outcomes["seqrejectron"]["sound_vs_bc"].advantage.low < 0
    judged = judge(spec(), fake_results({}, test_cost={"bc": [0.124, 0.236, 0.04]}))
    assert not judged.outcomes["seqrejectron"]["sound_vs_bc"].passed


def test_diagnosis_finds_worlds_whose_first_candidate_broke_train_agreement():
    """Record 7f3db3a, seed 1 at horizon 80: the candidate cut 0.385 of the test prefixes but
    disagreed on 0.04 > eps/2 of the train trajectories (rejected, no 'size'); accepted rounds,
    a cut under eps, and other subjects' rounds are not reported."""
    from seqrejectron.claim import rejected_worlds

    rounds = {
        "seqrejectron_seed1_H80": [{"score": 0.345, "cut": 0.385, "train": 0.04}],
        "seqrejectron_seed1_H40": [{"score": 0.1, "cut": 0.1, "train": 0.0, "size": 1}],
        "seqrejectron_seed2_H40": [{"score": 0.0, "cut": 0.04, "train": 0.03}],
        "seqrejectron_seed2_H80": [{"score": 0.0, "cut": 0.3, "train": 0.02}],
        "seqrejectron_exact_seed1_H80": [{"score": 0.3, "cut": 0.4, "train": 0.1}],
        "per_step_rejectron_seed1_H80": [{"score": 0.3, "cut": 0.4, "train": 0.1}],
    }
    record = {"evidence": {"rounds": rounds, "replication": {"rounds": {}}}}
    assert rejected_worlds(record, "", "seqrejectron", 0.05) == ["seed1_H80"]
    assert rejected_worlds(record, "replication.", "seqrejectron", 0.05) == []
    record["evidence"]["replication"]["rounds"] = rounds
    assert rejected_worlds(record, "replication.", "seqrejectron", 0.05) == ["seed1_H80"]
