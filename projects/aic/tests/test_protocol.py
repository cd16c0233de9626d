import pytest
import torch

from aic import baselines
from aic.protocol import (
    add_steps,
    addition_control,
    matched_budget,
    removal_arms,
    removal_curve,
    validity,
    value_of,
)


def toy_table(n: int = 300, k_max: int = 6, seed: int = 0):
    """States of known difficulty d (half of them easy, d = 1): the readout is right
    (return 1) from step d on; AIC's allocation is exactly d, so cutting its top-compute
    states must hurt most."""
    g = torch.Generator().manual_seed(seed)
    difficulty = torch.randint(1, k_max + 1, (n,), generator=g)
    difficulty[torch.rand(n, generator=g) < 0.5] = 1
    returns = (torch.arange(1, k_max + 1)[None] >= difficulty[:, None]).float()
    return returns, difficulty.clone(), difficulty.float()


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
def test_removal_takes_exactly_the_requested_steps_in_every_arm(fraction):
    _, steps, _ = toy_table()
    base = torch.full_like(steps, 6)
    arms = removal_arms(steps, base, fraction, n_random=5, seed=1)
    expected = round(fraction * 300) * 5  # that many states, each cut from 6 steps to 1
    assert arms["amount"] == expected
    for arm in [arms["targeted"], arms["reverse"], *arms["random"]]:
        assert int(base.sum() - arm.sum()) == expected
        assert (arm >= 1).all() and (arm <= base).all()
    # on an uneven base allocation, the random arm still removes exactly the same amount
    uneven = removal_arms(steps, steps, fraction, n_random=3, seed=2)
    for arm in uneven["random"]:
        assert int(steps.sum() - arm.sum()) == uneven["amount"]


def test_targeted_removal_hurts_more_than_random_when_allocation_is_informative():
    returns, steps, difficulty = toy_table()
    rows = removal_curve(returns, steps, [0.1, 0.3], n_random=5, seed=0)
    for row in rows:
        assert row["targeted_minus_random_ci"][0] > 0
        assert row["drop_reverse"] <= row["drop_random"]
    # and not when the allocation is unrelated to difficulty (a shuffled K)
    shuffled = steps[torch.randperm(300, generator=torch.Generator().manual_seed(3))]
    flat = removal_curve(returns, shuffled, [0.3], n_random=5, seed=0)[0]
    assert flat["targeted_minus_random_ci"][0] < 0 < flat["targeted_minus_random_ci"][1]


def test_validity_and_matched_budget():
    returns, steps, difficulty = toy_table()
    check = validity(steps, difficulty, returns)
    assert check["spearman_steps_vs_difficulty"] == pytest.approx(1.0)
    assert check["shuffled_allocation_return_drop"] > 0.3
    matched = matched_budget(returns, steps)
    assert matched["aic_minus_fixed"] > 0 and matched["ci"][0] > 0
    assert value_of(returns, steps).mean() == 1.0


def test_halting_distributions_sum_to_one():
    lambdas = torch.rand(50, 6)
    p = baselines.ponder_distribution(lambdas)
    torch.testing.assert_close(p.sum(1), torch.ones(50))
    p_act, n, remainder = baselines.act_distribution(torch.rand(50, 6) * 0.5)
    torch.testing.assert_close(p_act.sum(1), torch.ones(50))
    assert (remainder >= 0).all() and (n >= 1).all()


def test_random_halting_matches_the_requested_mean():
    steps = baselines.random_steps(20_000, 8, 3.2, torch.Generator().manual_seed(0))
    assert steps.float().mean() == pytest.approx(3.2, abs=0.05)
    assert steps.min() >= 1 and steps.max() <= 8


def test_oracle_and_confidence_rules():
    returns, _, difficulty = toy_table()
    assert torch.equal(baselines.oracle_steps(returns, 0.5), difficulty.long())
    logits = torch.tensor([[[0.0, 0.0], [5.0, 0.0], [9.0, 0.0]]])
    assert baselines.confidence_steps(logits, "discrete", 0.9).item() == 2
    moves = torch.tensor([[[0.0], [0.5], [0.52], [0.52]]])
    assert baselines.confidence_steps(moves, "continuous", 0.05).item() == 3


def test_ponder_and_act_heads_train_on_frozen_features():
    """Features that reveal d: the trained PonderNet / ACT units must halt later on harder
    states (their losses drop at step d)."""
    returns, _, difficulty = toy_table(600)
    features = (
        torch.nn.functional.one_hot(difficulty.long() - 1, 6).float()[:, None].expand(-1, 6, -1)
    )
    features = torch.cat([features, torch.eye(6)[None].expand(600, -1, -1)], -1)
    losses = 1.0 - returns
    unit = baselines.fit_halting_unit(
        features, losses, lambda lam, loss: baselines.ponder_loss(lam, loss, 0.5), epochs=40
    )
    steps = baselines.ponder_steps(unit(features))
    assert steps[difficulty == 6].float().mean() > steps[difficulty == 1].float().mean() + 2


def test_addition_adds_exactly_and_gains_least_where_an_oracle_stopped():
    """Returns that rise until a per-state depth d(s) and stay flat after it; an allocation that
    stops exactly at d(s) gains nothing from more steps where it stopped soonest."""
    generator = torch.Generator().manual_seed(0)
    depth = torch.randint(1, 7, (200,), generator=generator)
    k = torch.arange(1, 9)
    returns = (k[None] >= depth[:, None]).float() * 0.5 + 0.5 * (k[None] / 8)
    steps = depth.clone()
    steps[:100] = 1  # half the states stopped too soon
    out = addition_control(returns, steps, 0.3, n_random=5, seed=0)
    assert out["added_steps"] == round(0.3 * int(steps.sum()))
    assert add_steps(steps, 17, torch.arange(200), 8).sum() == steps.sum() + 17
    with pytest.raises(ValueError, match="only"):
        add_steps(steps, 10**6, torch.arange(200), 8)
    assert out["gain_where_aic_stopped_soonest"] > out["gain_random"]
