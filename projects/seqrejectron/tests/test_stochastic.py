import numpy as np
import pytest
import torch

from seqrejectron.envs import Layout, expert_policy
from seqrejectron.experiment import episode_metrics
from seqrejectron.search import fit_bc
from seqrejectron.stochastic import (
    HellingerStopRule,
    hellinger_search,
    sampling_policy,
    step_divergences,
)


@pytest.mark.slow  # about a minute on 2 shared cores
def test_cumulative_hellinger_stop_is_calibrated_and_cuts_test_cost():
    torch.manual_seed(0)
    train_env = Layout(9, 2, 80, layout_seed=9)
    test_env = train_env.with_shift("wind", 0.3)
    train = [train_env.rollout(expert_policy, s) for s in range(80)]
    test = [test_env.rollout(expert_policy, 1000 + s) for s in range(80)]
    pihat = fit_bc(train, 64, 300, 0.01, seed=0)
    # Lambda 5: with coordinate features (issue 59) Lambda 20 finds no validator on this world
    validators, rounds = hellinger_search(pihat, train, test, epsilon=0.05, seed=0, lam=5.0)
    assert validators and rounds[0]["gain"] > 0.05 and rounds[0]["nll_increase"] <= 0.05
    # the validators diverge from pi-hat more on test states than on train states
    x_train = torch.from_numpy(np.concatenate([t.feats for t in train]))
    x_test = torch.from_numpy(np.concatenate([t.feats for t in test]))
    assert (
        step_divergences(pihat, validators, x_test).mean()
        > 2 * step_divergences(pihat, validators, x_train).mean()
    )

    def sampled(env, offset, n):
        return [env.rollout(sampling_policy(pihat, offset + s), offset + s) for s in range(n)]

    calibration, held_out_p, held_out_q = (
        sampled(train_env, 2000, 100),
        sampled(train_env, 3000, 100),
        sampled(test_env, 4000, 100),
    )
    rule = HellingerStopRule(pihat, validators).calibrate(calibration, 0.05)
    taus = rule.stop_times(calibration)
    assert np.mean([tau < len(t) for tau, t in zip(taus, calibration, strict=True)]) <= 0.05
    outcome = episode_metrics(rule, held_out_p, held_out_q)
    assert outcome["train_stop"].mean() <= 0.15
    never = np.mean([t.cost for t in held_out_q])
    assert outcome["test_cost"].mean() < never


def test_hellinger_stop_is_zero_for_pihat_itself_and_calibrated_otherwise():
    from seqrejectron.core import INF
    from seqrejectron.envs import Trajectory

    torch.manual_seed(0)
    pihat = torch.nn.Linear(4, 3)
    x = torch.randn(50, 4)
    assert np.all(step_divergences(pihat, [pihat], x) < 1e-6)
    assert np.all(step_divergences(pihat, [], x) == 0)
    other = torch.nn.Linear(4, 3)
    d = step_divergences(pihat, [other, pihat], x)
    assert np.all(d > 0) and np.all(d <= 1)

    def traj(n, seed):
        feats = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed)).numpy()
        zeros = np.zeros(n, int)
        return Trajectory(feats=feats, z=zeros, expert=zeros, actions=zeros, cost=0)

    calibration = [traj(5 + s % 7, s) for s in range(100)]
    rule = HellingerStopRule(pihat, [other]).calibrate(calibration, 0.1)
    taus = rule.stop_times(calibration)
    assert np.mean([tau < len(t) for tau, t in zip(taus, calibration, strict=True)]) <= 0.1
    assert np.mean([tau < len(t) for tau, t in zip(taus, calibration, strict=True)]) >= 0.05
    assert (
        HellingerStopRule(pihat, [])
        .calibrate(calibration, 0.1)
        .stop_times(calibration[:3])
        .tolist()
        == [INF] * 3
    )
