import numpy as np
import pytest
import torch

from seqrejectron.baselines import (
    DomainClassifierRule,
    EnsembleRule,
    NeverStop,
    NoveltyRule,
    OracleRule,
    RandomTimeRule,
    TableRule,
    ValidatorRule,
    per_state_stop_times,
    stop_rate,
)
from seqrejectron.core import INF
from seqrejectron.envs import Trajectory
from seqrejectron.experiment import episode_metrics
from seqrejectron.search import fit_bc


def traj(actions, expert, z=None, cost=0, feats=None):
    actions, expert = np.array(actions), np.array(expert)
    z = np.zeros(len(actions), int) if z is None else np.array(z)
    feats = np.eye(4, dtype=np.float32)[z] if feats is None else feats
    return Trajectory(feats=feats, z=z, expert=expert, actions=actions, cost=cost)


def test_oracle_stops_at_the_first_mistake():
    trajs = [traj([2, 2, 0, 1], [2, 2, 1, 1]), traj([0, 1], [0, 1])]
    assert OracleRule().stop_times(trajs).tolist() == [2, INF]


def test_table_rule_stops_where_a_table_differs_from_pihat():
    tables = np.array([[2, 2, 0, 1], [2, 1, 1, 1]])  # z -> action
    t = traj([2, 2, 0, 1], [2, 2, 0, 1], z=[0, 1, 2, 3])
    assert TableRule(tables[:1]).stop_times([t]).tolist() == [INF]
    assert TableRule(tables).stop_times([t]).tolist() == [1]  # table 1 says 1 at z = 1, pi-hat 2
    assert TableRule(tables[::-1]).stop_times([t]).tolist() == [1]  # any table, in any order


def test_sparse_cost_counts_only_episodes_run_to_the_end():
    trajs = [
        traj([2, 2, 0], [2, 2, 1], cost=1),
        traj([2, 2], [2, 2], cost=1),
        traj([0], [0], cost=0),
    ]
    outcome = episode_metrics(OracleRule(), trajs, trajs)
    assert outcome["test_cost"].tolist() == [0, 1, 0]  # the first is stopped before its failure
    assert outcome["test_executed"].tolist() == [0, 1, 1]
    assert outcome["train_stop"].tolist() == [1, 0, 0]
    assert episode_metrics(NeverStop(), trajs, trajs)["test_cost"].tolist() == [1, 1, 0]
    assert episode_metrics(NeverStop(), trajs, trajs)["test_dense_cost"].tolist() == [1, 0, 0]


def test_random_time_hazard_matches_the_target_rate():
    calibration = [traj([0] * n, [0] * n) for n in (5, 10, 20, 40) * 50]
    rule = RandomTimeRule(seed=0).calibrate(calibration, 0.2)
    lengths = np.array([len(t) for t in calibration])
    assert np.mean(1 - (1 - rule.hazard) ** lengths) == pytest.approx(0.2, abs=1e-6)
    assert stop_rate(rule, calibration) == pytest.approx(0.2, abs=0.06)


def test_novelty_is_the_distance_to_the_nearest_training_state():
    train = [traj([0, 0], [0, 0], feats=np.array([[0, 0], [3, 4]], np.float32))]
    rule = NoveltyRule(train, k=1)
    scores = rule.score(torch.tensor([[0.0, 0.0], [3.0, 0.0], [6.0, 8.0]]))
    np.testing.assert_allclose(scores, [0.0, 3.0, 5.0], atol=1e-6)
    calibration = [traj([0], [0], feats=np.array([[float(i), 0.0]], np.float32)) for i in range(10)]
    rule.calibrate(calibration, 0.3)
    assert stop_rate(rule, calibration) <= 0.3


def test_validator_rule_stops_where_a_validator_disagrees():
    pihat = torch.nn.Linear(4, 3)
    with torch.no_grad():
        pihat.weight.copy_(torch.eye(3, 4))
        pihat.bias.zero_()
    other = torch.nn.Linear(4, 3)
    with torch.no_grad():
        other.weight.copy_(torch.eye(3, 4)[[0, 2, 1]])  # swaps actions 1 and 2
        other.bias.zero_()
    t = traj([0, 0, 1], [0, 0, 1], z=[0, 0, 1])
    assert ValidatorRule(pihat, []).stop_times([t]).tolist() == [INF]
    assert ValidatorRule(pihat, [other]).stop_times([t]).tolist() == [2]
    assert ValidatorRule(pihat, [other, pihat]).stop_times([t]).tolist() == [2]  # any validator


def test_per_state_rules_stop_at_the_first_score_above_kappa():
    scores = [np.array([0.1, 0.9, 0.2, 0.95]), np.array([0.5, 0.4])]
    assert per_state_stop_times(scores, 0.5).tolist() == [1, INF]
    assert per_state_stop_times(scores, 0.3).tolist() == [1, 0]


def test_random_time_stops_are_reproducible_from_the_seed():
    calibration = [traj([0] * 20, [0] * 20) for _ in range(50)]
    first = RandomTimeRule(seed=3).calibrate(calibration, 0.5).stop_times(calibration)
    again = RandomTimeRule(seed=3).calibrate(calibration, 0.5).stop_times(calibration)
    assert first.tolist() == again.tolist() and (first < 20).any()


def test_stop_times_of_no_trajectories_are_an_empty_integer_array():
    tables = np.array([[0, 1]])
    for taus in (
        OracleRule().stop_times([]),
        TableRule(tables).stop_times([]),
        per_state_stop_times([], 0.5),
        NeverStop().stop_times([]),
    ):
        assert taus.shape == (0,) and taus.dtype == np.int64


class FixedTimes:
    def __init__(self, taus):
        self.taus = np.array(taus)

    def stop_times(self, trajs):
        return self.taus


def test_stop_rate_counts_stops_inside_the_trajectory_only():
    trajs = [traj([0] * 3, [0] * 3), traj([0] * 3, [0] * 3), traj([0] * 2, [0] * 2)]
    # a stop at t = len (after the last step) or INF is no stop; t = 0 and t = len - 1 are
    assert stop_rate(FixedTimes([3, INF, 1]), trajs) == pytest.approx(1 / 3)
    assert stop_rate(FixedTimes([0, 2, 2]), trajs) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        stop_rate(FixedTimes([0, 1]), trajs)  # one stop time per trajectory


def test_random_time_hazard_stays_below_the_rate_it_targets():
    # one-step trajectories: the expected stop rate is the hazard itself. The bisection keeps
    # only hazards whose expected rate is strictly below the target, so it ends just under 0.5
    calibration = [traj([0], [0]) for _ in range(4)]
    rule = RandomTimeRule(seed=0).calibrate(calibration, 0.5)
    assert 0.5 - 1e-12 < rule.hazard < 0.5


def linear(weight):
    layer = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight, dtype=torch.float32))
    return layer.eval()


def test_ensemble_score_is_the_fraction_of_members_that_differ_from_pihat():
    # pi-hat picks action 0 for x[0] > x[1], else 1; the members: a copy, one that always picks
    # 2, one that picks 1 for x[0] > x[1] and 0 otherwise
    pihat = linear([[1, -1], [-1, 1], [0, 0]])
    rule = EnsembleRule.__new__(EnsembleRule)
    rule.pihat = pihat
    rule.members = [pihat, linear([[0, 0], [0, 0], [1, 1]]), linear([[-1, 1], [1, -1], [0, 0]])]
    x = torch.tensor([[2.0, 1.0], [1.0, 3.0], [-1.0, -2.0]])
    # x[2]: pi-hat 0; the all-2 member picks 0 too (x sums negative: logits 0, 0, -3)
    np.testing.assert_allclose(rule.score(x), [2 / 3, 2 / 3, 1 / 3])


def test_ensemble_members_are_seeded_bootstrap_behaviour_clones():
    rng = np.random.default_rng(0)
    train = [
        traj(a, a, z=z)
        for z, a in ((rng.integers(4, size=5), rng.integers(3, size=5)) for _ in range(6))
    ]
    pihat = fit_bc(train, 4, 3, 0.1, seed=0)
    rule = EnsembleRule(pihat, train, members=2, hidden=4, steps=3, lr=0.1, seed=7)
    assert rule.pihat is pihat and len(rule.members) == 2
    for k, member in enumerate(rule.members):  # member k: seed 7 * 100 + k + 1, a bootstrap
        twin = fit_bc(train, 4, 3, 0.1, seed=701 + k, bootstrap=True)
        for p, q in zip(member.parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q)  # the same fit_bc call, seed and shapes: bit for bit
        assert not member.training
    unboot = fit_bc(train, 4, 3, 0.1, seed=701)
    assert not all(
        torch.equal(p, q)
        for p, q in zip(rule.members[0].parameters(), unboot.parameters(), strict=True)
    )
    # the members train with the rule's weight decay (pointmaze's (B) passes 1e-3)
    decayed = EnsembleRule(pihat, train, 1, 4, 3, 0.1, seed=7, weight_decay=0.5)
    twin = fit_bc(train, 4, 3, 0.1, seed=701, bootstrap=True, weight_decay=0.5)
    for p, q in zip(decayed.members[0].parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not all(
        torch.equal(p, r)
        for p, r in zip(decayed.members[0].parameters(), rule.members[0].parameters(), strict=True)
    )


def test_domain_classifier_separates_train_from_test_states():
    # train states near (0, 0), test states near (3, 3): the logit of "test" is positive on
    # test-like states and negative on train-like ones after a short full-batch fit
    rng = np.random.default_rng(0)

    def states(center, n):
        return (center + 0.3 * rng.standard_normal((n, 2))).astype(np.float32)

    train = [traj([0] * 8, [0] * 8, feats=states(0.0, 8)) for _ in range(3)]
    test = [traj([0] * 8, [0] * 8, feats=states(3.0, 8)) for _ in range(2)]
    rule = DomainClassifierRule(train, test, hidden=8, steps=60, lr=0.05, seed=0)
    assert rule.net[0].out_features == 8
    scores = rule.score(torch.tensor([[0.0, 0.0], [3.0, 3.0]]))
    assert scores[0] < -1 and scores[1] > 1
    again = DomainClassifierRule(train, test, hidden=8, steps=60, lr=0.05, seed=0)
    assert np.array_equal(
        again.score(torch.tensor([[1.5, 1.5]])), rule.score(torch.tensor([[1.5, 1.5]]))
    )


def test_domain_classifier_is_nonlinear_test_states_on_both_sides_of_train():
    """Test states at -3 and +3 around train states at 0 (one feature): no linear logit ranks
    both test clusters above the train cluster; the MLP's (a ReLU layer) does."""
    rng = np.random.default_rng(1)

    def states(center, n):
        return (center + 0.2 * rng.standard_normal((n, 1))).astype(np.float32)

    train = [traj([0] * 8, [0] * 8, feats=states(0.0, 8)) for _ in range(4)]
    test = [traj([0] * 8, [0] * 8, feats=states(c, 8)) for c in (-3.0, 3.0, -3.0, 3.0)]
    rule = DomainClassifierRule(train, test, hidden=16, steps=300, lr=0.05, seed=0)
    low, middle, high = rule.score(torch.tensor([[-3.0], [0.0], [3.0]]))
    assert low > middle + 1 and high > middle + 1
