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
    validators, rounds = hellinger_search(pihat, train, test, epsilon=0.05, seed=0)
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
