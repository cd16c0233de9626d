"""Value tests through the path the claim's rollouts and trainings use: the halting rule of
``core.adaptive_act`` as ``claim.Pair.run`` rolls it out, the source of the halting targets in
``AicModule.losses``, and the random-halting control's generator."""

import dataclasses

import numpy as np
import pytest
import torch

from aic import claim
from aic.core import AICPolicy, count_flops, flops_per_decision
from aic.model import AicModule
from aic.tasks import Episode, get_task, obs_shape


def grid_policy(k_max: int = 4) -> AICPolicy:
    torch.manual_seed(0)
    task = get_task("lava-crossing")
    return AICPolicy("grid", obs_shape(task), task.n_actions, "discrete", "conv", 8, k_max).eval()


def prescribed_head(policy: AICPolicy, values: list[float]) -> None:
    """The halting head's value after step k is values[k-1], for every state."""
    policy.halt_head = lambda z, k, signals: z.new_full((z.shape[0],), values[k - 1])


def lite_pair(policy: AICPolicy, episodes: int = 3, seed: int = 0) -> claim.Pair:
    """A claim.Pair holding only what its rollouts need (no training)."""
    p = claim.Pair.__new__(claim.Pair)
    # episodes cut at 12 decisions: the rule is what is tested, not the policy (untrained)
    p.task = dataclasses.replace(get_task("lava-crossing"), max_eval_steps=12)
    p.seed, p.aic, p.k_max = seed, policy, policy.k_max
    p.settings, p.cache = {"episodes": episodes}, {}
    episode = Episode(p.task, 0)
    p.flops = count_flops(policy, torch.from_numpy(episode.policy_obs()[None]))
    episode.close()
    return p


def test_claim_rollout_halts_at_the_first_value_strictly_below_the_price():
    """u = (0.9, 0.5, 0.2, 0.1) at price 0.5: step 2 ties the price and does not halt, step 3
    is the first strictly below, so every decision of every episode runs exactly 3 steps and
    pays 3 x (core + feature + halting head) + one readout."""
    policy = grid_policy()
    prescribed_head(policy, [0.9, 0.5, 0.2, 0.1])
    p = lite_pair(policy, episodes=2)
    row = p.run("test", "aic", 0.5)
    assert row["decision_mean_steps"] == 3.0
    np.testing.assert_array_equal(row["mean_steps"], 3.0)
    expected = flops_per_decision(p.flops, 3, "readout_halt")
    np.testing.assert_allclose(row["flops_per_decision"], expected)


def test_claim_rollout_stops_at_k_max_when_computing_always_pays():
    policy = grid_policy()
    prescribed_head(policy, [0.9, 0.8, 0.7, 0.6])
    row = lite_pair(policy, episodes=2).run("test", "aic", 0.5)
    assert row["decision_mean_steps"] == 4.0


def test_claim_rollout_acts_on_the_readout_of_the_step_it_halts_at():
    """The action taken is the argmax of pi_K for K the halting step (here 2), not pi_1 or pi_4."""
    policy = grid_policy()
    prescribed_head(policy, [0.9, 0.1, 0.1, 0.1])
    task = get_task("lava-crossing")
    episodes = [Episode(task, s) for s in range(6)]
    obs = torch.from_numpy(np.stack([e.policy_obs() for e in episodes]))
    for e in episodes:
        e.close()
    act = claim.Pair.rule(lite_pair(policy), "aic", 0.5)[0]
    readouts, steps = act(obs, torch.zeros(64, 3))
    table = policy(obs)["actions"]
    assert steps.tolist() == [2] * 6
    torch.testing.assert_close(readouts, table[:, 1], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(readouts, table[:, 0]) and not torch.allclose(readouts, table[:, 3])


def fixed_forward(module: AicModule) -> tuple:
    """A policy output with known readouts: the greedy action after step k is action k-1, the
    critic reads Q = (0.1, 0.3, 0.5), the halting head predicts 0 everywhere."""
    actions = torch.tensor([[[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0]]])
    out = {
        "actions": actions,
        "halt": torch.zeros(1, 3),
        "features": torch.zeros(1, 3, 8),
        "q": torch.tensor([[0.1, 0.3, 0.5]]),
    }
    module.policy.forward = lambda obs: out
    q_star = torch.tensor([[0.2, 0.2, 0.9]])
    return torch.zeros(1, 1), torch.tensor([0]), torch.zeros(1), q_star


@pytest.mark.parametrize(
    ("source", "horizon", "gains"),
    [
        ("critic", "one_step", [0.2, 0.2, 0.0]),  # R = Q(argmax pi_k) = (0.1, 0.3, 0.5)
        ("critic", "cumulative", [0.4, 0.2, 0.0]),
        ("oracle", "one_step", [0.0, 0.7, 0.0]),  # R = Q*(argmax pi_k) = (0.2, 0.2, 0.9)
        ("oracle", "cumulative", [0.7, 0.7, 0.0]),
    ],
)
def test_training_halting_loss_reads_its_target_from_the_named_source(source, horizon, gains):
    """AicModule.losses (the claim's training path): with the head at 0, the Huber loss (beta 1,
    every |gain| < 1) is mean(0.5 g_k^2) over the gains of the chosen source and horizon."""
    module = AicModule(task="lava-crossing", dim=8, k_max=3, voc_source=source, voc_horizon=horizon)
    losses = module.losses(fixed_forward(module))
    expected = float(np.mean([0.5 * g**2 for g in gains]))
    assert losses["halt"].item() == pytest.approx(expected, rel=1e-5)
    # the critic is fitted to Q*: mean((0.1-0.2)^2, (0.3-0.2)^2, (0.5-0.9)^2)
    assert losses["critic"].item() == pytest.approx((0.01 + 0.01 + 0.16) / 3, rel=1e-5)
    # the head predicts 0 < price, so AIC halts after step 1, whose exact return is Q*(a_0)
    assert losses["mean_steps"].item() == 1.0
    assert losses["return_at_halt"].item() == pytest.approx(0.2)
    assert losses["return_at_k_max"].item() == pytest.approx(0.9)


def test_random_halting_draws_do_not_depend_on_what_ran_before():
    """The control's generator is seeded per (seed, split, mean steps): the same rule after
    a sweep of other mean steps and splits draws what the rule run first draws."""
    policy = grid_policy()
    episode = Episode(get_task("lava-crossing"), 0)
    obs = torch.from_numpy(episode.policy_obs()[None]).expand(64, -1, -1, -1)
    episode.close()
    first = lite_pair(policy).rule("random_halting", 2.0, "test")[0](obs, torch.zeros(64, 3))[1]
    p = lite_pair(policy)
    for split, mean in [("test", 3.0), ("val", 2.0), ("test", 2.5)]:
        p.rule("random_halting", mean, split)[0](obs, torch.zeros(64, 3))
    again = p.rule("random_halting", 2.0, "test")[0](obs, torch.zeros(64, 3))[1]
    torch.testing.assert_close(again, first)
    assert len(first.unique()) > 1
    seeds = {
        claim.random_seed(s, split, m) for s in (0, 1) for split in ("val", "test") for m in (2, 3)
    }
    assert len(seeds) == 8
