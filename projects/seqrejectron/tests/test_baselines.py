import numpy as np
import pytest
import torch

from seqrejectron.baselines import (
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
